"""Sites of what autograd graphs saved: the forward line that made each saved tensor, anomaly mode put back."""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.fx.traceback as fx_traceback

from pytest_vramleak.tracking.backward import BackwardWatch
from pytest_vramleak.tracking.graph_sites import GraphSites, own_anomaly_paused

MODEL = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))


def saved(loss: torch.Tensor, node_name: str, attribute: str) -> torch.Tensor:
    """The tensor the first node named ``node_name`` in ``loss``'s graph saved as ``attribute``."""
    for node in nodes(loss.grad_fn):
        if type(node).__name__ == node_name:
            tensor: torch.Tensor = getattr(node, attribute)
            return tensor
    raise AssertionError(f"no {node_name} in the graph")


def nodes(root: Any) -> Iterator[Any]:
    stack, seen = [root], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        yield node
        stack.extend(child for child, _ in node.next_functions)


def line_of(marker: str) -> int:
    source = inspect.getsource(inspect.getmodule(line_of)).splitlines()
    return next(number for number, line in enumerate(source, 1) if line.rstrip().endswith(marker))


def site(sites: GraphSites, tensor: torch.Tensor) -> tuple[str, int] | None:
    stack = sites.site_of(tensor, tensor.untyped_storage())
    return (stack[0][0], stack[0][1]) if stack else None


@pytest.fixture
def anomaly_mode_as_it_was() -> Iterator[None]:
    enabled, check_nan = torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()
    yield
    torch._C.set_anomaly_enabled(enabled, check_nan)


def test_a_saved_activation_is_sited_at_the_line_that_called_the_model(anomaly_mode_as_it_was: None) -> None:
    sites = GraphSites()
    sites.start()
    batch = torch.ones(8, 16)
    out = MODEL(batch)  # the model's line
    loss = out.pow(2).mean()  # the loss's line
    sites.stop()
    sites.capture([(weakref.ref(loss), 0)])

    assert not torch.is_anomaly_enabled()
    activation = saved(loss, "ReluBackward0", "_saved_result")  # never a Python object of the test's
    assert site(sites, activation) == (__file__, line_of("# the model's line"))
    assert site(sites, saved(loss, "PowBackward0", "_saved_self")) == (__file__, line_of("# the model's line"))
    # a leaf has no node that made it: its own Python object tells where it was made, not the graph
    assert site(sites, batch) is None  # (saved by the first layer)


def test_nodes_made_before_it_started_are_not_sited(anomaly_mode_as_it_was: None) -> None:
    torch._C.set_anomaly_enabled(True, False)
    earlier = MODEL(torch.ones(8, 16)).sum()  # made with a stack, but before the run began
    torch._C.set_anomaly_enabled(False, True)
    sites = GraphSites()
    sites.start()
    sites.stop()
    sites.capture([(weakref.ref(earlier), 0)])

    assert site(sites, saved(earlier, "ReluBackward0", "_saved_result")) is None


@pytest.mark.parametrize(("enabled", "check_nan"), [(False, True), (False, False), (True, True), (True, False)])
def test_anomaly_mode_is_left_as_it_was(anomaly_mode_as_it_was: None, enabled: bool, check_nan: bool) -> None:
    torch._C.set_anomaly_enabled(enabled, check_nan)
    formatter = fx_traceback.format_stack
    sites = GraphSites()
    sites.start()
    loss = MODEL(torch.ones(8, 16)).sum()  # the loss's line under the user's own anomaly mode too
    assert torch.is_anomaly_enabled()
    sites.stop()
    sites.capture([(weakref.ref(loss), 0)])

    assert (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()) == (enabled, check_nan)
    assert fx_traceback.format_stack is formatter
    activation = saved(loss, "ReluBackward0", "_saved_result")
    assert site(sites, activation) == (__file__, line_of("# the loss's line under the user's own anomaly mode too"))


def test_a_tensor_no_graph_saved_has_no_site_of_it(anomaly_mode_as_it_was: None) -> None:
    sites = GraphSites()
    sites.start()
    plain = torch.ones(4) * 2
    sites.stop()
    sites.capture([(weakref.ref(plain), 0)])

    assert site(sites, plain) is None


def _second_order_step(x: torch.Tensor) -> torch.Tensor:
    """A gradient taken with create_graph=True, as a gradient penalty or an L-BFGS step takes it."""
    energy = (x.sin() * x).sum()
    (grad,) = torch.autograd.grad(energy, x, create_graph=True)
    return grad


def test_a_backward_that_makes_a_graph_runs_without_the_plugins_anomaly_mode() -> None:
    # TorchSim/torch-sim#559: under anomaly mode each node made in backward keeps the forward node
    # that made it (metadata['parent_']), and with it a forward graph the test let go
    x = torch.randn(64, requires_grad=True)
    watch, sites = BackwardWatch(lambda tensors: None), GraphSites()
    watch.start()
    sites.start()
    try:
        assert torch.is_anomaly_enabled()
        grad = _second_order_step(x)
        with own_anomaly_paused():
            assert not torch.is_anomaly_enabled()
        assert torch.is_anomaly_enabled()
    finally:
        sites.stop()
        watch.stop()
    assert not torch.is_anomaly_enabled()
    found = list(nodes(grad.grad_fn))
    assert found and not any("parent_" in node.metadata for node in found)


def test_the_users_own_anomaly_mode_is_never_paused() -> None:
    with torch.autograd.set_detect_anomaly(True), own_anomaly_paused():
        assert torch.is_anomaly_enabled()

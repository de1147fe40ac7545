"""Reading what autograd graphs saved: never through a saved_tensors_hooks unpack hook, which runs user code."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from pytest_vramleak.tracking.census import KEEPS_ITS_OUTPUT, _graph_tensors, walk

pytestmark = pytest.mark.skipif(
    not hasattr(torch._C._autograd.SavedTensor, "unpack_hook"), reason="this torch cannot read a packed tensor"
)


def _saved(output: torch.Tensor) -> tuple[list[Any], set[str]]:
    hooks: set[str] = set()
    found = list(_graph_tensors(output.grad_fn, set(), [], hooks))
    return found, hooks


def test_the_unpack_hook_is_never_called_and_what_the_pack_hook_returned_is_read() -> None:
    packed, unpacked = [], []

    def pack(tensor: torch.Tensor) -> tuple[str, torch.Tensor]:
        packed.append(tensor.detach().clone())
        return ("offloaded", packed[-1])

    def unpack(offloaded: tuple[str, torch.Tensor]) -> torch.Tensor:
        unpacked.append(offloaded)
        return offloaded[1]

    weight = torch.ones(3, 5, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        out = weight.exp()  # saves its result, through the hooks
    found, hooks = _saved(out)
    assert unpacked == []
    assert found[0] is packed[0] and found[1:] == [weight]  # (the leaf AccumulateGrad keeps)
    assert hooks == {f"{__name__}.{unpack.__qualname__}"}


def test_a_checkpointed_region_is_not_recomputed_by_reading_its_graph() -> None:
    from torch.utils.checkpoint import checkpoint

    calls = []

    def block(x: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return torch.relu(x @ x.T)

    out = checkpoint(block, torch.ones(8, 8, requires_grad=True), use_reentrant=False)
    assert calls == [1]
    _, hooks = _saved(out.sum())
    assert calls == [1]  # reading `_saved_self` of a hooked node would have run `block` again
    assert any(name.startswith("torch.utils.checkpoint.") for name in hooks)
    keys = [found.key for found in walk("cpu") if found.via == "graph" and found.owner is out]
    assert calls == [1] and keys


def test_a_pack_hook_that_keeps_an_ops_output_with_its_grad_fn_is_noted() -> None:
    weight = torch.ones(4, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        kept = (weight * 2).relu()  # relu saves its own output
    _, hooks = _saved(kept)
    assert KEEPS_ITS_OUTPUT in hooks
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t.detach(), lambda t: t):
        detached = (weight * 2).relu()
    _, hooks = _saved(detached)
    assert hooks and KEEPS_ITS_OUTPUT not in hooks


def test_a_graph_without_hooks_is_read_as_before() -> None:
    weight = torch.ones(4, requires_grad=True)
    out = weight.exp()
    found, hooks = _saved(out)
    assert [tensor.data_ptr() for tensor in found] == [out.data_ptr(), weight.data_ptr()] and hooks == set()

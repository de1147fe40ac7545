"""The holder search's economies: what it collects, what it lists once, what it does not count as a holder."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from pytest_vramleak.holders.referrers import (
    BACKWARD_LEVELS,
    chain_text,
    find_chains,
    hook_holdings,
    name_holders,
    without_python_holders,
)
from pytest_vramleak.holders.snapshot import HELD_FROM_CPP, describe_history

HERE = __name__


class Node:
    def __init__(self) -> None:
        self.next: Any = None
        self.payload: Any = None


def garbage_ring(length: int, payload: Any) -> None:
    """A reference cycle of ``length`` nodes, the last holding ``payload``, that nothing else holds."""
    first = node = Node()
    for _ in range(length - 1):
        node.next = Node()
        node = node.next
    node.next = first
    node.payload = payload


@pytest.fixture
def collections_counted(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The generations of the plugin's own collections meanwhile (none runs on its own: gc is off;
    the plugin sets gc.callbacks aside while it collects, so its collector function is watched)."""
    from pytest_vramleak.tracking import gc_functions

    seen: list[int] = []
    collect = gc_functions._collect

    def counting(generation: int = 2) -> int:
        seen.append(generation)
        return collect(generation)

    monkeypatch.setattr(gc_functions, "_collect", counting)
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield seen
    finally:
        if enabled:
            gc.enable()


KEPT = {"cache": torch.ones(4)}


def test_a_target_with_a_root_is_named_without_collecting_the_heap(collections_counted: list[int]) -> None:
    # garbage that also holds the target cannot lie on a chain from a root
    garbage_ring(3, KEPT["cache"])
    assert name_holders([KEPT["cache"]]) == [f"{HERE}.KEPT['cache']"]
    assert collections_counted == []


def test_garbage_past_the_backward_levels_is_collected_before_a_target_is_named(collections_counted: list[int]) -> None:
    # Only garbage holds the tensor, in a ring longer than the search goes backwards: the search
    # stops at its limit on garbage, collects, and searches again.
    target = [torch.ones(4)]
    garbage_ring(BACKWARD_LEVELS + 4, target[0])
    assert find_chains(target) == [[target[0]]]
    assert 2 in collections_counted


def test_a_target_nothing_holds_is_searched_once_and_collected_once(collections_counted: list[int]) -> None:
    target = [torch.ones(4)]
    garbage_ring(3, target[0])
    assert find_chains(target) == [[target[0]]]
    assert collections_counted == [2]


def test_holders_listed_before_are_read_in_place_of_the_first_level() -> None:
    targets = [KEPT["cache"]]
    plain = find_chains(targets, collect=False)
    plain_text = [chain_text(chain) for chain in plain]
    plain.clear()
    known: list[Any] = []
    without_python_holders(targets, keep=known)
    assert known
    listed = find_chains(targets, collect=False, known=({id(KEPT["cache"])}, known))
    assert [chain_text(chain) for chain in listed] == plain_text == [f"{HERE}.KEPT['cache']"]
    assert known == []  # the search clears what it was given
    listed.clear()


def test_the_plugins_own_list_of_what_it_names_is_not_named_as_a_holder() -> None:
    # The list of (tensor, nodes) given to describe_history is referred to by the plugin's running
    # frames only: nothing in gc holds it, as nothing in gc holds a list kept from C++.
    groups = describe_history([(torch.ones(3, requires_grad=True) * 2, 5)], "cpu", node_bytes=100)
    assert [group.held_by for group in groups] == [[HELD_FROM_CPP]]


class Hostile(torch.nn.Linear):
    """A module whose attribute reads fail the test once armed: naming its hooks reads none."""

    armed = False

    def __getattribute__(self, name: str) -> Any:
        if type(self).armed:
            raise AssertionError(f"{name} was read through the module")
        return super().__getattribute__(name)


def test_a_container_a_module_hook_appends_to_is_named_with_the_hook() -> None:
    seen: list[torch.Tensor] = []
    model = Hostile(4, 4)
    model.register_forward_hook(lambda module, inputs, output: seen.append(output))
    model(torch.ones(1, 4))
    other = torch.ones(2)
    Hostile.armed = True
    try:
        held = hook_holdings([model])
        assert held == {
            id(seen[0]): "a forward hook of a Hostile, a lambda in "
            "test_a_container_a_module_hook_appends_to_is_named_with_the_hook(), appends to what holds these tensors"
        }
        assert id(other) not in held
    finally:
        Hostile.armed = False


def test_a_container_on_the_module_a_hook_is_registered_on_is_named_with_the_hook() -> None:
    def capture(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        module.activations.append(inputs[0].detach())

    model = Hostile(4, 4)
    model.activations = []
    model.register_forward_hook(capture)
    unhooked = torch.nn.Linear(4, 4)
    unhooked.activations = [torch.ones(2)]
    model(torch.ones(1, 4))
    Hostile.armed = True
    try:
        held = hook_holdings([model, unhooked])
    finally:
        Hostile.armed = False
    kept = model.activations[0]
    assert held[id(kept)] == (
        "a forward hook of a Hostile, test_a_container_on_the_module_a_hook_is_registered_on_is_named_with_the_hook"
        ".capture(), is registered on the module whose .activations holds these tensors"
    )
    # the module's own parameters, and what a module without hooks keeps, are not a hook's
    assert id(model.weight) not in held
    assert id(unhooked.activations[0]) not in held


def test_the_frames_searched_are_the_callers_not_the_listing_functions_own() -> None:
    # The listing function's own frame in the list it returns would be a cycle (its locals hold the
    # list) keeping its caller's frame, and everything that frame's locals hold, until collected.
    from pytest_vramleak.holders.referrers import _frames_not_ours

    names = [frame.f_code.co_name for frame in _frames_not_ours(set())]
    assert names[0] == "test_the_frames_searched_are_the_callers_not_the_listing_functions_own"


def test_where_the_search_stopped_is_not_said_to_be_outside_gc() -> None:
    from pytest_vramleak.holders.edges import SearchStopped, root_of

    root = root_of(SearchStopped({"a": 1}, 8))
    assert (root.kind, root.label, root.type_name) == (
        "search limit",
        "<dict 8 levels up, where the search for holders stopped>",
        "dict",
    )


def test_a_module_code_made_is_told_from_one_loaded() -> None:
    import importlib.util
    import sys
    import types

    import torch._C._nn

    from pytest_vramleak.holders.edges import root_of

    made = importlib.util.module_from_spec(importlib.util.spec_from_loader("generated_layer_4", loader=None))
    root = root_of(made)
    assert (root.kind, root.label, root.name) == (
        "run-time module",
        "sys.modules['generated_layer_4']",
        "generated_layer_4",
    )
    # loaded from a file, built in, a C extension's submodule (no spec), a ModuleType of one's own: modules
    for module in (torch, sys, torch._C._nn, types.ModuleType("plain")):
        assert root_of(module).kind == "module", module


def test_an_autograd_nodes_hooks_dict_is_named_as_such_and_another_ordered_dict_is_not() -> None:
    import collections
    import functools

    from pytest_vramleak.holders.edges import NODE_HOOKS, root_of

    weight = torch.nn.Parameter(torch.ones(4))
    cache = weight * 2
    handle = cache.grad_fn.register_hook(functools.partial(print, "done"))
    hooks = handle.hooks_dict_ref()
    assert root_of(hooks).label == NODE_HOOKS
    assert root_of(collections.OrderedDict(a=print)).label == "<OrderedDict held outside Python's gc>"
    assert root_of(collections.OrderedDict()).label == "<OrderedDict held outside Python's gc>"
    handle.remove()

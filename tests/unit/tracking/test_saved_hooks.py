"""The saved-tensor hooks watch: which objects a pack hook keeps what it stores in, and torch left as it was."""

from __future__ import annotations

import gc

import pytest
import torch

from pytest_vramleak.tracking.saved_hooks import SavedTensorHooks, pack_state

STORE: list[torch.Tensor] = []


def pack_into_store(tensor: torch.Tensor) -> int:
    STORE.append(tensor)
    return len(STORE) - 1


def unpack_from_store(index: int) -> torch.Tensor:
    return STORE[index]


class Offload:
    def __init__(self) -> None:
        self.storage: dict[int, torch.Tensor] = {}

    def pack(self, tensor: torch.Tensor) -> int:
        self.storage[len(self.storage)] = tensor
        return len(self.storage) - 1

    def unpack(self, key: int) -> torch.Tensor:
        return self.storage.pop(key)


class Copies(Offload):
    def pack(self, tensor: torch.Tensor) -> int:
        return super().pack(tensor.detach().clone())  # (a tensor with its graph would keep the hooks from C++)


@pytest.fixture
def watch():
    original = torch._C._autograd._push_saved_tensors_default_hooks
    hooks = SavedTensorHooks()
    hooks.start()
    yield hooks
    hooks.stop()
    assert torch._C._autograd._push_saved_tensors_default_hooks is original


def _forward_under(pack, unpack) -> None:
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        (torch.ones(3, requires_grad=True) * 2).exp()


def test_a_bound_pack_hook_names_its_object(watch) -> None:
    offload = Offload()
    _forward_under(offload.pack, offload.unpack)
    assert pack_state().get(id(offload)) == "Offload.pack"


def test_hooks_entered_at_every_step_are_noted_once(watch) -> None:
    from pytest_vramleak.tracking import saved_hooks

    offload = Copies()
    for _ in range(5):
        _forward_under(offload.pack, offload.unpack)
    assert sum(1 for ref in saved_hooks._noted if getattr(ref(), "__self__", None) is offload) == 1


def test_a_function_names_the_containers_its_code_uses(watch) -> None:
    _forward_under(pack_into_store, unpack_from_store)
    state = pack_state()
    assert state.get(id(STORE)) == "pack_into_store"
    assert id(torch) not in state and id(pack_into_store) not in state  # (modules and functions are not state)


def test_a_closure_names_what_its_cells_hold(watch) -> None:
    kept: dict[int, torch.Tensor] = {}

    def pack(tensor: torch.Tensor) -> int:
        kept[id(tensor)] = tensor
        return id(tensor)

    _forward_under(pack, kept.__getitem__)
    assert pack_state().get(id(kept)) == "test_a_closure_names_what_its_cells_hold.<locals>.pack"


def test_a_hook_is_noted_weakly_and_forgotten_with_its_object(watch) -> None:
    offload = Copies()
    _forward_under(offload.pack, offload.unpack)
    identity = id(offload)
    del offload
    gc.collect()
    assert identity not in pack_state()


def test_torchs_own_hooks_are_left_to_their_own_diagnosis(watch) -> None:
    from torch.utils.checkpoint import checkpoint

    before = dict(pack_state())
    checkpoint(torch.nn.Linear(3, 3), torch.ones(2, 3, requires_grad=True), use_reentrant=False)
    assert pack_state() == before


def test_hooks_entered_while_no_check_runs_are_not_noted() -> None:
    offload = Offload()
    _forward_under(offload.pack, offload.unpack)
    assert id(offload) not in pack_state()

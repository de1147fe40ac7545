"""The engine on its own, as a training script would use it, without pytest's hooks."""

from __future__ import annotations

import weakref

import torch

from pytest_vramleak import Snapshot, StepWatcher, diff, take_snapshot

KEPT: list[torch.Tensor] = []


def test_snapshot_and_diff_name_a_leak() -> None:
    before = take_snapshot("cpu")
    KEPT.append(torch.ones(1024, 1024))
    try:
        leak = diff(before)
        assert leak.device == "cpu"
        assert leak.leaked_bytes == 4 * 1024**2
        (group,) = leak.groups
        assert (group.dtype, group.shape, group.count, group.bytes) == ("float32", (1024, 1024), 1, 4 * 1024**2)
        assert group.held_by == [f"{__name__}.KEPT[0]"]
        assert "held by" in leak.render()
    finally:
        KEPT.clear()


def test_snapshot_keeps_no_tensor_alive() -> None:
    before = take_snapshot("cpu")
    scratch = torch.ones(1024)
    after = take_snapshot("cpu")
    del scratch
    assert diff(before, take_snapshot("cpu")).leaked_bytes == 0
    assert after.allocated_bytes - before.allocated_bytes == 4096


def test_step_watcher_outside_pytest() -> None:
    watcher = StepWatcher("cpu", warmup=1)
    grows = watcher.check(lambda step: KEPT.append(torch.ones(256)), steps=6)
    flat = watcher.check(lambda step: torch.ones(256), steps=6)
    KEPT.clear()
    assert grows.grows and grows.steps == [1024, 2048, 3072, 4096, 5120]
    assert grows.leak is not None and grows.leak.groups[0].count == 4  # the last step's tensor has not outlived a step
    assert not flat.grows and flat.leak is None


def test_a_later_storage_at_a_reused_address_counts_as_new() -> None:
    class Storage:  # stands in for torch's storage objects, which support weak references
        pass

    old, new = Storage(), Storage()
    key = ("cpu", 0x1000)  # the allocator gave the new storage the old one's address
    before = Snapshot("cpu", 4096, {key: 4096}, identities={key: weakref.ref(old)})
    same = Snapshot("cpu", 4096, {key: 4096}, identities={key: weakref.ref(old)})
    reused = Snapshot("cpu", 4096, {key: 4096}, identities={key: weakref.ref(new)})
    grown = Snapshot("cpu", 8192, {key: 8192}, identities={key: weakref.ref(old)})
    assert same.new_since(before) == set() and same.leaked_since(before) == 0
    assert reused.new_since(before) == {key}
    assert reused.leaked_since(before) == 0  # the old storage was freed and replaced: no growth
    made_in_setup = Snapshot("cpu", 4096, {key: 4096}, identities={key: weakref.ref(old)}, young=frozenset({key}))
    assert reused.leaked_since(made_in_setup) == 4096  # what a fixture made and freed offsets nothing
    assert grown.new_since(before) == set() and grown.leaked_since(before) == 4096  # resize_ in place
    del old
    assert reused.new_since(before) == {key}


def test_freeing_older_memory_offsets_on_cpu_as_the_allocator_growth_does() -> None:
    KEPT.append(torch.ones(1024))
    before = take_snapshot("cpu")
    KEPT.clear()
    KEPT.append(torch.ones(2048))
    try:
        leak = diff(before)
        assert leak.leaked_bytes == 4096 == leak.end_bytes - leak.baseline_bytes
        assert [group.bytes for group in leak.groups] == [8192]  # the new tensor is what is shown
    finally:
        KEPT.clear()


def test_leak_check_outside_pytest() -> None:
    from pytest_vramleak import Budget, LeakCheck

    with LeakCheck("cpu", Budget(leak=1024)) as check:
        KEPT.append(torch.ones(1024))
        torch.ones(4096).sum()  # a temporary: freed, not leaked
    try:
        assert (check.result.outcome, check.result.leaked_bytes) == ("leaked", 4096)
        assert check.result.message == "leaked 4.0 KiB on cpu, allowed 1.0 KiB"
        assert [group.held_by for group in check.result.groups] == [[f"{__name__}.KEPT[0]"]]
        assert "held by" in check.result.report()
    finally:
        KEPT.clear()
    with LeakCheck("cpu") as clean:
        torch.ones(1024).sum()
    assert (clean.result.outcome, clean.result.leaked_bytes, clean.result.groups) == ("passed", 0, [])


class _Ref:
    """What held_in_cpp_groups reads of a tracker's entry for a storage."""

    def __init__(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        self.device, self.pointer, self.nbytes = "cpu", storage.data_ptr(), storage.nbytes()


HELD_IN_CPP_MODULE: list[object] = []


def test_memory_only_cpp_holds_is_told_without_naming_and_anything_python_reaches_is_not() -> None:
    import gc

    from pytest_vramleak.holders.snapshot import HELD_FROM_CPP, held_in_cpp_groups

    # a tensor whose Python object only C++ keeps: saved by an autograd graph, its name dropped
    x = torch.randn(16, requires_grad=True)
    saved = torch.randn(16)
    y = x * saved
    refs = [_Ref(saved)]
    saved_id = id(saved)
    del saved
    # (passed in a list of its own: a local of this running test would be a holder)
    groups = held_in_cpp_groups([o for o in gc.get_objects() if id(o) == saved_id], refs)
    assert groups is not None and [(g.dtype, g.shape, g.bytes, g.held_by) for g in groups] == [
        ("float32", (16,), 64, [HELD_FROM_CPP])
    ]
    del y
    # a list holds it: named as usual
    listed = torch.ones(8)
    HELD_IN_CPP_MODULE.append(listed)
    assert held_in_cpp_groups([listed], [_Ref(listed)]) is None
    HELD_IN_CPP_MODULE.clear()


def test_a_tensor_a_numpy_array_in_a_module_keeps_is_not_held_from_cpp(heap_size: str) -> None:
    import gc

    from pytest_vramleak.holders.snapshot import held_in_cpp_groups

    # a numpy array a module keeps holds it, unseen by gc
    array_base = torch.ones(32)
    HELD_IN_CPP_MODULE.append(array_base.numpy())
    ref = _Ref(array_base)
    base_id = id(HELD_IN_CPP_MODULE[-1].base)  # type: ignore[attr-defined]
    del array_base
    assert held_in_cpp_groups([o for o in gc.get_objects() if id(o) == base_id], [ref]) is None
    HELD_IN_CPP_MODULE.clear()

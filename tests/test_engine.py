"""The engine on its own, as a training script would use it, without pytest's hooks."""

from __future__ import annotations

import torch

from pytest_vramleak import StepWatcher, diff, take_snapshot

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
    from pytest_vramleak.census import storage_key

    KEPT.append(torch.ones(20_000))
    old_key = storage_key(KEPT[0])
    before = take_snapshot("cpu")
    KEPT.clear()
    for _ in range(100):  # the allocator hands a freed block of the same size out again
        KEPT.append(torch.ones(20_000))
        if storage_key(KEPT[-1]) == old_key:
            break
    try:
        assert storage_key(KEPT[-1]) == old_key, "the allocator did not reuse the address"
        after = take_snapshot("cpu")
        assert old_key is not None and old_key[0] in after.new_since(before)
        assert len(diff(before, after).groups[0].held_by) == 1
    finally:
        KEPT.clear()

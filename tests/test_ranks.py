"""Leaks in rank processes a test spawns: ``watch_rank()`` in each rank reports to the test's check."""

from __future__ import annotations

import json

import pytest

RANKS = """
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import pytest_vramleak

KEPT = []


def step(rank, leaking_rank):
    tensor = torch.ones(256) * rank
    dist.all_reduce(tensor)
    if rank == leaking_rank:
        KEPT.append(tensor)


def worker(rank, world_size, store, leaking_rank):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world_size)
    with pytest_vramleak.watch_rank(rank):
        step(rank, leaking_rank)
    dist.destroy_process_group()


@pytest.mark.vram_budget
def test_rank_1_leaks(tmp_path):
    mp.spawn(worker, args=(2, tmp_path / "store", 1), nprocs=2)


@pytest.mark.vram_budget
def test_no_rank_leaks(tmp_path):
    mp.spawn(worker, args=(2, tmp_path / "store", None), nprocs=2)
"""


def test_a_leaking_rank_fails_the_test_that_spawned_it(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_it=RANKS)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "no:randomly", "--vramleak-report=r.json", "--vramleak-report=r.html"
    )
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "rank 1 leaked (watch_rank)",
            "*",
            "rank 1 (pid *) leaked 1.0 KiB on cpu:",
            "leaked 1.0 KiB on cpu, allowed 0 B",
            "*",
            "leaked tensors:",
            "float32?256? on cpu: 1 tensor, 1.0 KiB",
            "    allocated at test_it.py:11 in step(), called from test_it.py:20 in worker()",
            "    held by test_it.KEPT?0?",
        ]
    )
    result.stdout.no_fnmatch_line("*rank 0 (pid*")
    result.stdout.no_fnmatch_line("*child process*")  # multiprocessing's resource tracker is not the test's
    tests = {t["nodeid"].rsplit("::", 1)[1]: t for t in json.loads((pytester.path / "r.json").read_text())["tests"]}
    assert tests["test_no_rank_leaks"]["verdict"] == "passed"
    assert sorted((rank["rank"], rank["outcome"]) for rank in tests["test_rank_1_leaks"]["ranks"]) == [
        (0, "passed"),
        (1, "leaked"),
    ]
    assert sorted((rank["rank"], rank["outcome"]) for rank in tests["test_no_rank_leaks"]["ranks"]) == [
        (0, "passed"),
        (1, "passed"),
    ]
    leaking = next(rank for rank in tests["test_rank_1_leaks"]["ranks"] if rank["rank"] == 1)
    assert leaking["tensors"][0]["held_by"] == ["test_it.KEPT[0]"]
    page = (pytester.path / "r.html").read_text()
    assert "rank 1 (pid" in page and "test_it.KEPT[0]" in page


GROUP_ALIVE = """
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import pytest_vramleak


def step(rank):
    tensor = torch.ones(256) * rank
    dist.all_reduce(tensor)  # gloo's worker thread drops the tensor's Python object, maybe as the check ends


def worker(rank, world_size, store, made_inside):
    def init():
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world_size)

    if not made_inside:
        init()
    with pytest_vramleak.watch_rank(rank):
        if made_inside:
            init()
        step(rank)
    dist.destroy_process_group()


@pytest.mark.vram_budget
def test_group_made_before_the_block(tmp_path):
    mp.spawn(worker, args=(2, tmp_path / "store", False), nprocs=2)


@pytest.mark.vram_budget
def test_group_made_inside_the_block(tmp_path):
    mp.spawn(worker, args=(2, tmp_path / "store", True), nprocs=2)
"""


def test_ranks_are_checked_with_a_gloo_group_alive_as_the_block_ends(pytester: pytest.Pytester) -> None:
    """Made before the block or inside it, and destroyed after it: the ranks' checks measure while
    gloo's threads run (see test_sites for the crash this once was), and a group made inside the
    block is named as left alive by it."""
    pytester.makepyfile(test_it=GROUP_ALIVE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly", "--vramleak-report=r.json")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "rank 0, rank 1 leaked (watch_rank)",
            "*",
            "rank 0 (pid *) leaked 0 B on cpu:",
            "left 1 torch.distributed process group(s) alive",
        ]
    )
    for text in ("*SIGSEGV*", "*Fatal Python error*", "*ProcessExitedException*"):
        result.stdout.no_fnmatch_line(text)
        result.stderr.no_fnmatch_line(text)
    tests = {t["nodeid"].rsplit("::", 1)[1]: t for t in json.loads((pytester.path / "r.json").read_text())["tests"]}
    assert sorted((rank["rank"], rank["outcome"]) for rank in tests["test_group_made_before_the_block"]["ranks"]) == [
        (0, "passed"),
        (1, "passed"),
    ]
    inside = sorted(
        (rank["rank"], rank["outcome"], rank["leaked_bytes"])
        for rank in tests["test_group_made_inside_the_block"]["ranks"]
    )
    assert inside == [(0, "leaked", 0), (1, "leaked", 0)]


def test_watch_rank_outside_a_checked_test_does_nothing(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    import pytest_vramleak
    from pytest_vramleak.ranks import RANKS_ENV

    monkeypatch.delenv(RANKS_ENV, raising=False)
    kept = []
    with pytest_vramleak.watch_rank():
        kept.append(torch.ones(4))
    assert list(tmp_path.iterdir()) == []

"""What a test leaves outside its tensors: torch.distributed process groups it created and did not
destroy, and child processes (DataLoader workers, subprocesses) still running after its teardown."""

from __future__ import annotations

import json

import pytest


def outcomes(pytester: pytest.Pytester, *args: str) -> tuple[pytest.RunResult, dict[str, dict]]:
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "no:randomly", "--vramleak-report=r.json", *args
    )
    tests = json.loads((pytester.path / "r.json").read_text())["tests"]
    return result, {t["nodeid"].rsplit("::", 1)[1]: t for t in tests}


GROUPS = """
import pytest
import torch.distributed as dist


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    store = tmp_path_factory.mktemp("store") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.vram_budget
def test_leaks_a_new_group(world):
    group = dist.new_group([0])


@pytest.mark.vram_budget
def test_destroys_its_group(world):
    group = dist.new_group([0])
    dist.destroy_process_group(group)
"""


def test_a_group_left_alive_fails_and_a_destroyed_one_passes(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_it=GROUPS)
    result, report = outcomes(pytester)
    assert {name: entry["verdict"] for name, entry in report.items()} == {
        "test_leaks_a_new_group": "leaked",
        "test_destroys_its_group": "passed",
    }
    result.stdout.fnmatch_lines(
        [
            "left 1 torch.distributed process group(s) alive",
            "*",
            "left 1 torch.distributed process group(s) alive that it created:",
            "    process group '*' (gloo, ranks [[]0[]]), created at test_it.py:15 in test_leaks_a_new_group()",
            "    diagnosis: each group keeps its communicator*destroy_process_group(group)*",
        ]
    )
    assert report["test_leaks_a_new_group"]["details"]["process_groups_left"] == 1


def test_the_default_group_counts_too(pytester: pytest.Pytester, tmp_path) -> None:
    pytester.makepyfile(
        test_it=f"""
        import pytest
        import torch.distributed as dist

        @pytest.mark.vram_budget
        def test_never_destroys_it():
            dist.init_process_group("gloo", init_method="file://{tmp_path}/one", rank=0, world_size=1)

        @pytest.mark.vram_budget
        def test_destroys_it():
            dist.destroy_process_group()
            dist.init_process_group("gloo", init_method="file://{tmp_path}/two", rank=0, world_size=1)
            dist.destroy_process_group()
        """
    )
    result, report = outcomes(pytester)
    assert {name: entry["verdict"] for name, entry in report.items()} == {
        "test_never_destroys_it": "leaked",
        "test_destroys_it": "passed",
    }
    result.stdout.fnmatch_lines(
        ["    the default process group (gloo, ranks [[]0[]]), created at test_it.py:6 in test_never_destroys_it()"]
    )


PERSISTENT_ITERATOR = """
import gc
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

DATA = TensorDataset(torch.arange(8.0))
KEPT = []

@pytest.mark.vram_budget(leak="1 MiB")
def test_keeps_a_persistent_iterator():
    loader = DataLoader(DATA, batch_size=4, num_workers=1, persistent_workers=True)
    iterator = iter(loader)
    next(iterator)
    KEPT.append(iterator)
"""

WORKERS_LEFT = [
    "left 1 child process(es) running that it started:",
    "    DataLoader worker pid * resident)",
    "    diagnosis: DataLoader workers outlive the test*persistent_workers=False*",
]


def test_dataloader_workers_left_alive_are_reported_and_a_normal_dataloader_is_not(pytester: pytest.Pytester) -> None:
    normal_loader = """
@pytest.mark.vram_budget(leak="1 MiB")
def test_normal_loader():
    for batch in DataLoader(DATA, batch_size=4, num_workers=1):
        pass
"""
    pytester.makepyfile(test_it=PERSISTENT_ITERATOR + normal_loader)
    result, report = outcomes(pytester)
    assert {name: entry["verdict"] for name, entry in report.items()} == {
        "test_keeps_a_persistent_iterator": "leaked",
        "test_normal_loader": "passed",
    }
    result.stdout.fnmatch_lines(WORKERS_LEFT)
    result.stdout.no_fnmatch_line("*no live tensor accounts for it*")


def test_dataloader_workers_are_told_apart_where_the_heap_is_frozen(pytester: pytest.Pytester) -> None:
    # The iterator that keeps the workers is frozen (the test froze the heap, as suites do to spare
    # Python's collector; the plugin freezes what it has read when reading takes long): gc's
    # listing of objects leaves frozen ones out, so it was named a plain multiprocessing process.
    pytester.makepyfile(test_it=PERSISTENT_ITERATOR + "    gc.freeze()\n")
    result, report = outcomes(pytester)
    assert report["test_keeps_a_persistent_iterator"]["verdict"] == "leaked"
    result.stdout.fnmatch_lines(WORKERS_LEFT)


def test_a_subprocess_left_running_is_reported_and_a_waited_one_is_not(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import subprocess
        import time
        import pytest

        RUNNING = []

        @pytest.mark.vram_budget
        def test_leaves_it_running():
            process = subprocess.Popen(["sleep", "30"])
            RUNNING.append(process)
            while not open(f"/proc/{process.pid}/cmdline", "rb").read().startswith(b"sleep"):
                time.sleep(0.01)  # on a loaded machine the child may not have started sleep yet

        @pytest.mark.vram_budget
        def test_waits_for_it():
            subprocess.run(["true"], check=True)

        def test_cleanup():
            for process in RUNNING:
                process.kill()
                process.wait()
        """
    )
    result, report = outcomes(pytester)
    assert report["test_leaves_it_running"]["verdict"] == "leaked"
    assert report["test_waits_for_it"]["verdict"] == "passed"
    result.stdout.fnmatch_lines(
        ["    process pid * (sleep 30, * resident)", "    diagnosis: a process the test started still runs*"]
    )

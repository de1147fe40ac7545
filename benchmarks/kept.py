"""Time a test that keeps many tiny tensors: what grouping and naming them costs.

    python benchmarks/kept.py [--tensors 10000] [--rounds 3]

A test appends ``--tensors`` tensors of four floats to a module's list each time it runs: it fails
under ``--vramleak`` (run again three times, then once more recording sites; from 2,000 tensors on,
run again twice, the second recording sites), and the failure names the list.
Prints the wall time, CPU time (user and system) and peak resident memory of plain pytest and of
``--vramleak``, each in a process of its own, alternated within one invocation, and their ratios.
With ``--floor``, a third process beside them runs the test as ``--vramleak`` runs it (three
times, then two full collections: the fewest that confirm such a leak) with a conftest and no
plugin: what running the test again costs before anything is read or named.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TEST = """
import torch

KEPT = []


def test_keeps_tiny_tensors():
    for _ in range({tensors}):
        KEPT.append(torch.ones(4))
"""

FLOOR = """
import gc
import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    for _ in range(2):  # the runs again that confirm the leak
        item.runtest()
    yield
    gc.collect()  # the collections the verdict and naming take
    gc.collect()
"""


def timed(folder: Path, *args: str) -> tuple[float, float, int, str]:
    """Wall seconds, CPU seconds (user and system), peak resident KiB and output of one pytest process."""
    start = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=folder,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert process.stdout is not None
    output = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    return time.perf_counter() - start, usage.ru_utime + usage.ru_stime, usage.ru_maxrss, output


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tensors", type=int, default=10_000, help="tensors the test keeps each run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--floor", action="store_true", help="time the test's runs again alone, without the plugin")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        folder = Path(directory) / "checked"
        folder.mkdir()
        (folder / "test_kept.py").write_text(TEST.format(tensors=options.tensors))
        (folder / "pytest.ini").write_text("[pytest]\n")
        floor_folder = Path(directory) / "floor"
        floor_folder.mkdir()
        for name in ("test_kept.py", "pytest.ini"):
            (floor_folder / name).write_text((folder / name).read_text())
        (floor_folder / "conftest.py").write_text(FLOOR)
        plain: list[tuple[float, float, int, str]] = []
        checked: list[tuple[float, float, int, str]] = []
        floor: list[tuple[float, float, int, str]] = []
        for _ in range(options.rounds):
            plain.append(timed(folder))
            checked.append(timed(folder, "--vramleak"))
            if options.floor:
                floor.append(timed(floor_folder, "-p", "no:vramleak"))
    import torch

    print(
        f"{platform.processor() or platform.machine()}, Python {platform.python_version()}, torch {torch.__version__}"
    )
    print(f"a test keeping {options.tensors} tensors of 4 floats per run, best of {options.rounds} alternated rounds")
    for what, index, unit in (("wall", 0, "s"), ("CPU", 1, "s"), ("peak resident", 2, "MiB")):
        scale = 1024 if unit == "MiB" else 1
        best_plain = min(run[index] for run in plain) / scale
        best_checked = min(run[index] for run in checked) / scale
        print(
            f"{what}: plain {best_plain:.2f} {unit}, --vramleak {best_checked:.2f} {unit}: {best_checked / best_plain:.2f}x"
        )
        if floor:
            best_floor = min(run[index] for run in floor) / scale
            print(f"  {what}: the runs again alone {best_floor:.2f} {unit}: {best_floor / best_plain:.2f}x")
    output = checked[-1][3]
    named = "test_kept.KEPT" in output and f"{options.tensors} tensors" in output
    print(f"failed with the list named and the run's tensors counted: {named}")
    if not named:
        print(output[-3000:])


if __name__ == "__main__":
    main()

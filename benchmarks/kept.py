"""Time a test that keeps many tiny tensors: what grouping and naming them costs.

    python benchmarks/kept.py [--tensors 10000] [--rounds 3]

A test appends ``--tensors`` tensors of four floats to a module's list each time it runs: it fails
under ``--vramleak`` (run again three times, then once more recording sites; from 2,000 tensors on,
run again twice, the second recording sites), and the failure names the list.
Prints the wall time, CPU time (user and system) and peak resident memory of plain pytest and of
``--vramleak``, each in a process of its own, alternated within one invocation, and their ratios.
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
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        folder = Path(directory)
        (folder / "test_kept.py").write_text(TEST.format(tensors=options.tensors))
        (folder / "pytest.ini").write_text("[pytest]\n")
        plain: list[tuple[float, float, int, str]] = []
        checked: list[tuple[float, float, int, str]] = []
        for _ in range(options.rounds):
            plain.append(timed(folder))
            checked.append(timed(folder, "--vramleak"))
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
    output = checked[-1][3]
    named = "test_kept.KEPT" in output and f"{options.tensors} tensors" in output
    print(f"failed with the list named and the run's tensors counted: {named}")
    if not named:
        print(output[-3000:])


if __name__ == "__main__":
    main()

"""Time a test that keeps many tiny tensors: what grouping and naming them costs.

    python benchmarks/kept.py [--tensors 10000] [--rounds 3]

A test appends ``--tensors`` tensors of four floats to a module's list each time it runs: it fails
under ``--vramleak`` (run again, then once more recording sites), and the failure names the list.
Prints the wall time of plain pytest and of ``--vramleak``, alternated within one invocation, and
their ratio.
"""

from __future__ import annotations

import argparse
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


def timed(folder: Path, *args: str) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=folder,
        capture_output=True,
        text=True,
    )
    return time.perf_counter() - start, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tensors", type=int, default=10_000, help="tensors the test keeps each run")
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        folder = Path(directory)
        (folder / "test_kept.py").write_text(TEST.format(tensors=options.tensors))
        (folder / "pytest.ini").write_text("[pytest]\n")
        plain, checked = [], []
        output = ""
        for _ in range(options.rounds):
            plain.append(timed(folder)[0])
            seconds, output = timed(folder, "--vramleak")
            checked.append(seconds)
    import torch

    print(
        f"{platform.processor() or platform.machine()}, Python {platform.python_version()}, torch {torch.__version__}"
    )
    print(f"a test keeping {options.tensors} tensors of 4 floats per run, best of {options.rounds}")
    print(f"plain {min(plain):.2f}s, --vramleak {min(checked):.2f}s: {min(checked) / min(plain):.2f}x")
    named = "test_kept.KEPT" in output and f"{options.tensors} tensors" in output
    print(f"failed with the list named and the run's tensors counted: {named}")
    if not named:
        print(output[-3000:])


if __name__ == "__main__":
    main()

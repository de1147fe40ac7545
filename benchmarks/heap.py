"""Time naming a leak in a large heap: one tensor leaked into one entry of a table of ~10^6 objects.

    python benchmarks/heap.py [--entries 1000000]

Prints the test's wall time with the plugin and without it, and the difference: what finding and
naming the leak costs. The failure it prints must name ``TABLE[<index>]``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

TEST = """
import pytest
import torch

TABLE = [{{"id": index, "tags": [index]}} for index in range({entries})]


@pytest.mark.vram_budget
def test_leak_into_table():
    entry = TABLE[{target}]
    for _ in range({depth}):
        entry["next"] = {{}}
        entry = entry["next"]
    entry["embedding"] = torch.ones(1024)
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
    parser.add_argument(
        "--entries", type=int, default=500_000, help="table entries; each is a dict and a list (default: 10^6 objects)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--depth", type=int, default=0, help="nested dicts between the table entry and the tensor")
    options = parser.parse_args()
    target = options.entries * 7 // 9
    with tempfile.TemporaryDirectory() as directory:
        folder = Path(directory)
        (folder / "test_table.py").write_text(
            textwrap.dedent(TEST.format(entries=options.entries, target=target, depth=options.depth))
        )
        (folder / "pytest.ini").write_text("[pytest]\n")
        plain, checked = [], []
        output = ""
        for _ in range(options.rounds):
            plain.append(timed(folder, "-p", "no:vramleak")[0])
            seconds, output = timed(folder)
            checked.append(seconds)
    path = f"test_table.TABLE[{target}]" + "['next']" * options.depth + "['embedding']"
    named = f"held by {path}" in output
    print(
        f"table of {options.entries} entries ({2 * options.entries} gc-tracked objects), tensor {options.depth + 2} references deep, best of {options.rounds}"
    )
    print(
        f"without the plugin {min(plain):.2f}s, with it {min(checked):.2f}s: naming the leak cost {min(checked) - min(plain):.2f}s"
    )
    print(f"leak named with its full path: {named}")
    if not named:
        print(output[-3000:])


if __name__ == "__main__":
    main()

"""Time and peak memory of a test that holds many tiny tensors at its peak, under ``--vramleak-peaks``.

    python benchmarks/peaks.py [--tensors 1000000] [--rounds 3]

The test fills a local list with ``--tensors`` tensors of four floats and lets it go as it
returns: it passes, and its peak is the list. Each round runs plain pytest, ``--vramleak`` and
``--vramleak --vramleak-peaks``, alternated, each in a process of its own. Prints each one's best
wall time and peak resident memory (the process's ``ru_maxrss``), and their ratios to plain.
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from kept import timed  # noqa: E402  (wall and CPU seconds, peak resident KiB and output of one pytest process)

TEST = """
import torch


def test_holds_tiny_tensors_at_its_peak():
    held = [torch.ones(4) for _ in range({tensors})]
    assert len(held) == {tensors}
"""

CONFIGURATIONS = {
    "plain": (),
    "--vramleak": ("--vramleak",),
    "--vramleak --vramleak-peaks": ("--vramleak", "--vramleak-peaks"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tensors", type=int, default=1_000_000, help="tensors the test holds at its peak")
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    seconds: dict[str, list[float]] = {name: [] for name in CONFIGURATIONS}
    memory: dict[str, list[int]] = {name: [] for name in CONFIGURATIONS}
    outputs: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as directory:
        folder = Path(directory)
        (folder / "test_peak.py").write_text(TEST.format(tensors=options.tensors))
        (folder / "pytest.ini").write_text("[pytest]\n")
        for _ in range(options.rounds):
            for name, args in CONFIGURATIONS.items():
                wall, _, peak, outputs[name] = timed(folder, *args)
                seconds[name].append(wall)
                memory[name].append(peak)
    import torch

    print(
        f"{platform.processor() or platform.machine()}, Python {platform.python_version()}, torch {torch.__version__}"
    )
    print(
        f"a test holding {options.tensors} tensors of 4 floats at its peak, best of {options.rounds} alternated rounds"
    )
    plain_seconds, plain_memory = min(seconds["plain"]), min(memory["plain"])
    for name in CONFIGURATIONS:
        best, peak = min(seconds[name]), min(memory[name])
        print(
            f"{name}: {best:.2f} s ({best / plain_seconds:.2f}x), peak resident {peak / 1024:.0f} MiB"
            f" ({peak / plain_memory:.2f}x)"
        )
    for name, output in outputs.items():
        if "1 passed" not in output:
            print(f"{name} did not pass:\n{output[-3000:]}")


if __name__ == "__main__":
    main()

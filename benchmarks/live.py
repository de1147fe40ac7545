"""Time ``--vramleak`` against plain pytest while the process holds many tensors the tests never touch.

    python benchmarks/live.py                       # 0, 10^3, 10^4 and 10^5 live tensors
    python benchmarks/live.py --live 0,100000 --rounds 3

The suite is ``suite.py``'s small tests, with a conftest that keeps the live tensors in
module-level layers, a session-scoped model and a list of small tensors. For each count it
prints the median session time of plain pytest and of ``--vramleak`` (runs alternate), their
ratio, and the check's fixed cost per test in milliseconds: what a flat cost looks like is the
same figure on every line.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from run import run  # noqa: E402
from suite import write_suite  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tests", type=int, default=180)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--live", default="0,1000,10000,100000", help="comma-separated counts of live tensors")
    options = parser.parse_args()
    counts = [int(text) for text in options.live.split(",")]
    print(f"live tensors  {'plain':>8} {'--vramleak':>11} {'ratio':>6} {'cost per test':>14}")
    for live in counts:
        with tempfile.TemporaryDirectory() as directory:
            folder = Path(directory)
            tests = write_suite(folder, options.tests, live=live)
            configurations = {"plain": ["-p", "no:vramleak"], "checked": ["--vramleak"]}
            for args in configurations.values():
                run(folder, args)  # warm the file cache and byte-code
            times: dict[str, list[float]] = {name: [] for name in configurations}
            for _ in range(options.rounds):
                for name, args in configurations.items():
                    times[name].append(run(folder, args)[1])
        plain, checked = statistics.median(times["plain"]), statistics.median(times["checked"])
        cost = 1000 * (checked - plain) / tests
        print(f"{live:>12}  {plain:>7.2f}s {checked:>10.2f}s {checked / plain:>5.2f}x {cost:>11.2f} ms")


if __name__ == "__main__":
    main()

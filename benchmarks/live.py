"""Time ``--vramleak`` against plain pytest while the process holds many tensors the tests never touch.

    python benchmarks/live.py                       # 0, 10^3, 10^4 and 10^5 live tensors
    python benchmarks/live.py --live 0,100000 --rounds 3

The suite is ``suite.py``'s small tests, with a conftest that keeps the live tensors in
module-level layers, a session-scoped model and a list of small tensors. Each count is run with
``--tests`` tests and with twice as many, plain and under ``--vramleak`` (runs alternate), and the
median session times give

- the cost per checked test: the extra time of the longer suite over the shorter one, per test
  added (what a flat cost looks like is the same figure on every line);
- the one-time cost: what the plugin adds once, whatever the number of tests (indexing the live
  tensors as the first check begins);
- the ratio of both suites' session times to plain pytest's.
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


def session_times(live: int, tests: int, rounds: int) -> dict[str, float]:
    """Median session seconds, plain and checked, of a suite of ``tests`` tests."""
    with tempfile.TemporaryDirectory() as directory:
        folder = Path(directory)
        write_suite(folder, tests, live=live)
        configurations = {"plain": ["-p", "no:vramleak"], "checked": ["--vramleak"]}
        for args in configurations.values():
            run(folder, args)  # warm the file cache and byte-code
        times: dict[str, list[float]] = {name: [] for name in configurations}
        for _ in range(rounds):
            for name, args in configurations.items():
                times[name].append(run(folder, args)[1])
    return {name: statistics.median(samples) for name, samples in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tests", type=int, default=180)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--live", default="0,1000,10000,100000", help="comma-separated counts of live tensors")
    options = parser.parse_args()
    counts = [int(text) for text in options.live.split(",")]
    short, long = options.tests, 2 * options.tests
    print(f"{'live tensors':>12}  {'per test':>9} {'one-time':>9}  {f'{short} tests':>22}  {f'{long} tests':>22}")
    for live in counts:
        first = session_times(live, short, options.rounds)
        second = session_times(live, long, options.rounds)
        extra_first = first["checked"] - first["plain"]
        extra_second = second["checked"] - second["plain"]
        per_test = (extra_second - extra_first) / (long - short)
        once = extra_first - short * per_test
        columns = [
            f"{first['plain']:5.2f}s {first['checked']:5.2f}s {first['checked'] / first['plain']:5.2f}x",
            f"{second['plain']:5.2f}s {second['checked']:5.2f}s {second['checked'] / second['plain']:5.2f}x",
        ]
        print(f"{live:>12}  {1000 * per_test:6.2f} ms {once:7.2f} s  {columns[0]:>22}  {columns[1]:>22}")


if __name__ == "__main__":
    main()

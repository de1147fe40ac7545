"""Time plain pytest against pytest --vramleak on a generated suite, beside other ways to check.

    python benchmarks/run.py                  # 234 tests of 1-4 ms, 5 alternating rounds
    python benchmarks/run.py --tests 300 --rounds 7
    python benchmarks/run.py --only='--vramleak,single run'   # plain and these two only ('=': the value starts with --)

Configurations: plain pytest; ``--vramleak`` (every test checked, a test that kept memory run 3
more times and once recording sites); the same judging each test on one run
(``--vramleak-confirm=0 --vramleak-fail-on=any``); the same recording allocation
sites in every test (``--vramleak-sites=on``), to show what recording them costs; a naive check in PyTorch's
style (``naive_check.py``: collect garbage and count live tensors around every test); and
``--memray`` where pytest-memray is installed. Prints the median wall time of each and its ratio
to plain pytest, for whole runs (interpreter start and torch import included), their CPU time
(user and system, pytest's process and its children) and the time pytest reports for the session.
Runs alternate (plain, vramleak, naive, memray, plain, ...) so that machine noise hits all alike.
Where ``PYTHONDONTWRITEBYTECODE`` is set (container images often set it), every run compiles the
plugin's modules again: the first line says whether byte-code caching is on.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from suite import write_suite  # noqa: E402

SESSION_TIME = re.compile(r" in ([0-9.]+)s")
pytest_exit_ok, pytest_exit_failed = 0, 1


def run(folder: Path, args: list[str]) -> tuple[float, float, float]:
    """Wall time of the whole run, the session time pytest reports, and the CPU time (user and
    system) of pytest and every process it waited for."""
    start = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    environment = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=folder,
        capture_output=True,
        text=True,
        env=environment,
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    # (judged on one run, the module-level layer's gradients fail their tests: that is timed too)
    if done.returncode not in (pytest_exit_ok, pytest_exit_failed):
        raise SystemExit(f"pytest {' '.join(args)} failed:\n{done.stdout[-3000:]}{done.stderr[-2000:]}")
    session = SESSION_TIME.findall(done.stdout)
    return wall, float(session[-1]) if session else float("nan"), cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tests", type=int, default=234)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated configurations to time (plain always runs), e.g. '--vramleak,single run'",
    )
    options = parser.parse_args()
    configurations = {
        "plain": ["-p", "no:vramleak"],
        "--vramleak": ["--vramleak"],
        "single run": ["--vramleak", "--vramleak-confirm=0", "--vramleak-fail-on=any"],
        "sites on": ["--vramleak", "--vramleak-sites=on"],
        "naive check": ["-p", "no:vramleak", "-p", "naive_check"],
    }
    if importlib.util.find_spec("pytest_memray") is not None:
        configurations["--memray"] = ["-p", "no:vramleak", "--memray"]
    if options.only:
        chosen = {"plain", *(name.strip() for name in options.only.split(","))}
        unknown = chosen - configurations.keys()
        if unknown:
            parser.error(f"unknown configurations {sorted(unknown)}; there are {sorted(configurations)}")
        configurations = {name: args for name, args in configurations.items() if name in chosen}
    with tempfile.TemporaryDirectory() as directory:
        folder = Path(directory)
        count = write_suite(folder, options.tests)
        times: dict[str, list[tuple[float, float, float]]] = {name: [] for name in configurations}
        for args in configurations.values():
            run(folder, args)  # warm the file cache and byte-code
        for _ in range(options.rounds):
            for name, args in configurations.items():
                times[name].append(run(folder, args))
    plain_wall = statistics.median(w for w, _, _ in times["plain"])
    plain_session = statistics.median(s for _, s, _ in times["plain"])
    plain_cpu = statistics.median(c for _, _, c in times["plain"])
    caching = "off (PYTHONDONTWRITEBYTECODE is set)" if os.environ.get("PYTHONDONTWRITEBYTECODE") else "on"
    print(f"{count} small torch tests, median of {options.rounds} alternating rounds; byte-code caching {caching}")
    print(f"{'configuration':<14} {'whole run':>10} {'ratio':>7} {'CPU':>8} {'ratio':>7} {'session':>9} {'ratio':>7}")
    for name, samples in times.items():
        wall = statistics.median(w for w, _, _ in samples)
        session = statistics.median(s for _, s, _ in samples)
        cpu = statistics.median(c for _, _, c in samples)
        print(
            f"{name:<14} {wall:>9.2f}s {wall / plain_wall:>6.2f}x {cpu:>7.2f}s {cpu / plain_cpu:>6.2f}x "
            f"{session:>8.2f}s {session / plain_session:>6.2f}x"
        )


if __name__ == "__main__":
    main()

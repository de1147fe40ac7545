"""Time what a user pays for the plugin, three ways side by side in one run, runs alternated.

    python benchmarks/costs.py                 # 5 rounds
    python benchmarks/costs.py --rounds 7 --tests 4

1. Step checks, timed the way pytest runs them: set-up, call and teardown of each test (pytest's
   own durations), a module of tests each building a small MLP with Adam and running
   ``steps(6, warmup=2)``, ``(10, 2)`` or ``(20, 5)`` of a 1 to 4 ms training step, once with
   ``for index in range(n)`` (the bare test) and once with ``for index in vramleak.steps(n)``.
   The module under the fixture is one pytest run, the bare module another: its first test
   indexes the live tensors (the first check of a session must), the others begin
   where the test before them ended. A third run alternates bare and checked tests in one
   session, so that every check follows an unchecked test: the worst case, given apart. A
   setting's ratio is the mean checked test of each batch size, added up, against the same of
   the bare tests; the session's first check (it indexes the live tensors) is left out of it.
2. A suite of small torch tests (``suite.py``), plain pytest against ``pytest --vramleak``:
   pytest's session time.
3. The same with 10^4 live tensors the tests never touch (``suite.py``'s ``live``), 180 tests.

Each round runs every workload plain and checked, one after the other; the ratio of each round's
pair is taken, and the median of the rounds' ratios is printed with their range. The first lines
say when, on which machine, and at which commit.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from run import run  # noqa: E402
from steps import MAKE_STEP  # noqa: E402
from suite import write_suite  # noqa: E402

SETTINGS = ((6, 2), (10, 2), (20, 5))
BATCHES = (16, 64)
"""Batch sizes of the training step: 1 to 4 ms a step on one core of the CI machine (printed as measured)."""

STEP_TESTS = """
import time
import pytest, torch

torch.set_num_threads(1)
STEP_SECONDS = {{}}


{make_step}


def test_warm_up():
    step = make_step(None, batch=16)
    for index in range(3):
        step(index)


@pytest.mark.parametrize("round", range({tests}))
@pytest.mark.parametrize("batch", {batches})
@pytest.mark.parametrize("steps, warmup", {settings})
def test_bare(steps, warmup, batch, round):
    step = make_step(None, batch=batch)
    start = time.perf_counter()
    for index in range(steps):
        step(index)
    STEP_SECONDS.setdefault(batch, []).append((time.perf_counter() - start) / steps)


@pytest.mark.parametrize("round", range({tests}))
@pytest.mark.parametrize("batch", {batches})
@pytest.mark.parametrize("steps, warmup", {settings})
def test_checked(steps, warmup, batch, round, vramleak):
    step = make_step(None, batch=batch)
    for index in vramleak.steps(steps, warmup=warmup):
        step(index)
"""

DURATIONS = """
import json, os, sys

DURATIONS = {}


def pytest_runtest_logreport(report):
    DURATIONS[report.nodeid] = DURATIONS.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session):
    module = sys.modules.get("test_steps")
    DURATIONS["step seconds"] = getattr(module, "STEP_SECONDS", {})
    with open(os.environ["DURATIONS_FILE"], "w") as stream:
        json.dump(DURATIONS, stream)
"""
"""A conftest that writes each test's set-up, call and teardown time, summed, to a file."""


def step_durations(folder: Path, selection: list[str]) -> dict[str, Any]:
    """Each test's seconds (set-up, call and teardown) in one pytest run of ``selection``."""
    out = folder / "durations.json"
    environment = dict(os.environ, DURATIONS_FILE=str(out))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", *selection],
        cwd=folder,
        capture_output=True,
        text=True,
        env=environment,
    )
    if done.returncode != 0:
        raise SystemExit(f"pytest {' '.join(selection)} failed:\n{done.stdout[-3000:]}{done.stderr[-2000:]}")
    durations: dict[str, Any] = json.loads(out.read_text())
    return durations


def by_setting(durations: dict[str, Any], kind: str) -> dict[tuple[int, int], dict[int, list[float]]]:
    """The seconds of the ``kind`` tests (bare or checked), by (steps, warmup) and batch size, in
    the order run."""
    grouped: dict[tuple[int, int], dict[int, list[float]]] = {
        setting: {batch: [] for batch in BATCHES} for setting in SETTINGS
    }
    for nodeid, seconds in durations.items():
        if f"::test_{kind}[" in nodeid:
            steps, warmup, batch = nodeid.split("[", 1)[1].split("-")[:3]
            grouped[(int(steps), int(warmup))][int(batch)].append(seconds)
    return grouped


def cost_ratio(checked: dict[int, list[float]], bare: dict[int, list[float]]) -> float:
    """What the checked tests of a setting cost against the bare ones: the mean test of each batch
    size, added up. (A median over both sizes at once is the midpoint between the slowest small
    test and the fastest large one: it swung by 0.2x between rounds.)"""
    return sum(statistics.mean(checked[batch]) for batch in BATCHES) / sum(
        statistics.mean(bare[batch]) for batch in BATCHES
    )


def after_first_check(
    checked: dict[tuple[int, int], dict[int, list[float]]], setting: tuple[int, int]
) -> dict[int, list[float]]:
    """A setting's checked tests less the session's first, which the first setting's first batch
    size runs (it indexes the live tensors)."""
    first = (SETTINGS[0], BATCHES[0])
    return {batch: tests[1:] if (setting, batch) == first else tests for batch, tests in checked[setting].items()}


def mean_test(tests: dict[int, list[float]]) -> float:
    return statistics.mean(seconds for batch in BATCHES for seconds in tests[batch])


def machine() -> str:
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import torch

    return (
        f"{model}, {os.cpu_count()} cores, {platform.system()} {platform.machine()}, Python "
        f"{platform.python_version()}, torch {torch.__version__}"
    )


def commit() -> str:
    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(HERE), *args], capture_output=True, text=True)
        return done.stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    changed = git("status", "--porcelain", "--untracked-files=no", "--", str(HERE.parent / "pytest_vramleak"))
    return head + (" with uncommitted changes to the plugin" if changed else "")


def spread(ratios: list[float]) -> str:
    return f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}x to {max(ratios):.2f}x)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tests", type=int, default=3, help="step-check tests of each setting and batch size")
    parser.add_argument("--suite", type=int, default=234, help="small tests in the suite without live tensors")
    parser.add_argument("--live-suite", type=int, default=180, help="small tests in the suite with 10^4 live tensors")
    options = parser.parse_args()
    started = datetime.datetime.now(datetime.timezone.utc)
    print(f"{started:%Y-%m-%d %H:%M} UTC; load average {os.getloadavg()[0]:.2f}; plugin at {commit()}")
    print(machine())
    steps_ratio: dict[tuple[int, int], list[float]] = {setting: [] for setting in SETTINGS}
    test_ms: dict[tuple[int, int], list[float]] = {setting: [] for setting in SETTINGS}
    step_seconds: dict[int, list[float]] = {}
    module_ratio: list[float] = []
    first_extra: list[float] = []
    mixed_ratio: dict[tuple[int, int], list[float]] = {setting: [] for setting in SETTINGS}
    suite_ratio: dict[str, list[float]] = {"suite": [], "live": []}
    suite_seconds: dict[str, list[tuple[float, float]]] = {"suite": [], "live": []}
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        steps_folder, suite_folder, live_folder = root / "steps", root / "suite", root / "live"
        steps_folder.mkdir()
        (steps_folder / "pytest.ini").write_text("[pytest]\n")
        (steps_folder / "conftest.py").write_text(DURATIONS)
        (steps_folder / "test_steps.py").write_text(
            textwrap.dedent(
                STEP_TESTS.format(
                    make_step=MAKE_STEP, tests=options.tests, batches=list(BATCHES), settings=list(SETTINGS)
                )
            )
        )
        suites = {"suite": (suite_folder, options.suite, 0), "live": (live_folder, options.live_suite, 10_000)}
        for folder, tests, live in suites.values():
            write_suite(folder, tests, live=live)
            for args in (["-p", "no:vramleak"], ["--vramleak"]):
                run(folder, args)  # warm the file cache and byte-code
        bare_only = ["test_steps.py", "-k", "warm_up or bare"]
        checked_only = ["test_steps.py", "-k", "warm_up or checked"]
        step_durations(steps_folder, bare_only)
        for _ in range(options.rounds):
            bare_durations = step_durations(steps_folder, bare_only)
            bare = by_setting(bare_durations, "bare")
            for batch, seconds in bare_durations["step seconds"].items():
                step_seconds.setdefault(int(batch), []).extend(seconds)
            checked_durations = step_durations(steps_folder, checked_only)
            checked = by_setting(checked_durations, "checked")
            first = checked[SETTINGS[0]][BATCHES[0]][0]
            for setting in SETTINGS:
                # the first checked test indexes the live tensors: counted in the module's ratio, not here
                steps_ratio[setting].append(cost_ratio(after_first_check(checked, setting), bare[setting]))
                test_ms[setting].append(1000 * mean_test(bare[setting]))
            module_ratio.append(
                sum(sum(map(sum, tests.values())) for tests in checked.values())
                / sum(sum(map(sum, tests.values())) for tests in bare.values())
            )
            first_extra.append(first - statistics.mean(bare[SETTINGS[0]][BATCHES[0]]))
            # the worst case: every checked test follows an unchecked one (pytest runs them interleaved)
            order = [
                f"test_steps.py::test_{kind}[{steps}-{warmup}-{batch}-{index}]"
                for steps, warmup in SETTINGS
                for batch in BATCHES
                for index in range(options.tests)
                for kind in ("bare", "checked")
            ]
            mixed = step_durations(steps_folder, ["test_steps.py::test_warm_up", *order])
            mixed_bare, mixed_checked = by_setting(mixed, "bare"), by_setting(mixed, "checked")
            for setting in SETTINGS:
                # (its first checked test is the session's first check, which indexes the live tensors)
                mixed_ratio[setting].append(cost_ratio(after_first_check(mixed_checked, setting), mixed_bare[setting]))
            for name, (folder, _, _) in suites.items():
                plain_seconds = run(folder, ["-p", "no:vramleak"])[1]
                checked_seconds = run(folder, ["--vramleak"])[1]
                suite_seconds[name].append((plain_seconds, checked_seconds))
                suite_ratio[name].append(checked_seconds / plain_seconds)
    print(
        f"load average at the end {os.getloadavg()[0]:.2f}; {options.rounds} rounds, median (range) of each round's ratio"
    )
    tests = options.tests * len(BATCHES)
    print(
        f"step checks, each test's set-up + call + teardown, {tests} tests a setting (batch {', '.join(map(str, BATCHES))}: "
        + ", ".join(f"{1000 * statistics.median(step_seconds[batch]):.1f}" for batch in BATCHES)
        + " ms a step), checked against bare:"
    )
    for setting in SETTINGS:
        steps, warmup = setting
        print(
            f"  steps({steps}, warmup={warmup}), bare test {statistics.median(test_ms[setting]):.0f} ms: "
            f"{spread(steps_ratio[setting])}; each check after an unchecked test: {spread(mixed_ratio[setting])}"
        )
    print(
        f"  the module of {tests * len(SETTINGS)} tests: {spread(module_ratio)}, its first check "
        f"+{1000 * statistics.median(first_extra):.0f} ms (indexing the live tensors)"
    )
    for name, label in (
        ("suite", f"{options.suite} small tests"),
        ("live", f"{options.live_suite} small tests, 10^4 live tensors"),
    ):
        plain_session = statistics.median(p for p, _ in suite_seconds[name])
        checked_session = statistics.median(c for _, c in suite_seconds[name])
        print(
            f"{label}, pytest's session time: plain {plain_session:.2f}s, --vramleak {checked_session:.2f}s: "
            f"{spread(suite_ratio[name])}"
        )


if __name__ == "__main__":
    main()

"""Time the step check against the bare loop: a small CPU training loop of a few ms a step.

This times the loop alone, inside the test. What a user pays for a step check, the test's set-up
and teardown included, is timed by ``costs.py``.

    python benchmarks/steps.py [--steps 50] [--rounds 5]
    python benchmarks/steps.py --short [--rounds 7]

``--short``: loops of 6, 10 and 20 steps (warm-up 2, 2 and 5) of a 2 to 5 ms step, clean and
leaking (each step keeps its loss with its graph), bare and under ``vramleak.steps`` in one
session; prints the median of each, the clean loops' ratio, and what a leaking loop's failure
costs over the bare loop (measuring, deciding and naming what holds the leak).

Runs one pytest session: the loop bare, then the same loop under ``vramleak.steps``, several rounds
each. Prints the median time of each loop (measured inside the test), their ratio, and what the
fixture adds to a test's set-up: indexing the live tensors when the test before it was not checked,
next to nothing when it was.

Then the first loop of a session, where the first step imports what the optimizer needs (many
modules, and ~10^5 objects made after the check froze the heap): fresh sessions that run one loop
each, bare and watched in turn, timed from the end of the first step to the end of the last.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

MAKE_STEP = """
def make_step(kept=None, batch=128):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
    )
    optimizer = torch.optim.Adam(model.parameters())
    inputs, labels = torch.randn(batch, 256), torch.randint(0, 10, (batch,))

    def step(index):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(inputs), labels)
        loss.backward()
        optimizer.step()
        if kept is not None:
            kept.append(model(inputs).sum())  # an output kept with its graph: a leak
        return loss.item()

    return step
"""
"""The training step both sessions time (an MLP with Adam), with a leak where ``kept`` is a list."""

TESTS = """
import json, time
import pytest, torch

torch.set_num_threads(1)
TIMES = {{"bare": [], "watched": []}}


{make_step}


def test_warm_up():
    step = make_step()
    for index in range(3):
        step(index)


@pytest.mark.parametrize("round", range({rounds}))
def test_bare(round):
    step = make_step()
    for index in range(3):
        step(index)
    start = time.perf_counter()
    for index in range({steps}):
        step(index)
    TIMES["bare"].append(time.perf_counter() - start)


@pytest.mark.parametrize("round", range({rounds}))
def test_watched(round, vramleak):
    step = make_step()
    for index in range(3):
        step(index)
    start = time.perf_counter()
    for index in vramleak.steps({steps}):
        step(index)
    TIMES["watched"].append(time.perf_counter() - start)


def test_zz_write():
    with open("times.json", "w") as stream:
        json.dump(TIMES, stream)
"""

FIRST = """
import json, time
import torch

torch.set_num_threads(1)


def test_first_loop({fixture}):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
    )
    optimizer = torch.optim.Adam(model.parameters())
    inputs, labels = torch.randn(128, 256), torch.randint(0, 10, (128,))
    marks = []
    for index in {loop}:
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(inputs), labels).backward()
        optimizer.step()
        marks.append(time.perf_counter())
    with open("first.json", "w") as stream:
        json.dump(marks[-1] - marks[0], stream)
"""

CONFTEST = """
import json

SETUP = {{"bare": [], "watched": []}}


def pytest_runtest_logreport(report):
    if report.when == "setup" and "[" in report.nodeid:
        SETUP["watched" if "test_watched" in report.nodeid else "bare"].append(report.duration)


def pytest_sessionfinish():
    with open("setup.json", "w") as stream:
        json.dump(SETUP, stream)
"""


SHORT = """
import json, os, platform, time
import pytest, torch

torch.set_num_threads(1)
SETTINGS = [(6, 2), (10, 2), (20, 5)]
TIMES = {{}}


{make_step}


def test_warm_up():
    step = make_step(None, batch=64)
    for index in range(3):
        step(index)


@pytest.mark.parametrize("leaks", [False, True], ids=["clean", "leaking"])
@pytest.mark.parametrize("steps, warmup", SETTINGS)
@pytest.mark.parametrize("round", range({rounds}))
def test_loop(round, steps, warmup, leaks, vramleak):
    for watched in (False, True):
        step = make_step([] if leaks else None, batch=64)
        start = time.perf_counter()
        try:
            for index in (vramleak.steps(steps, warmup=warmup) if watched else range(steps)):
                step(index)
        except BaseException as error:  # the leak's failure, timed with the loop
            assert watched and leaks and type(error).__name__ == "VramLeak", error
        TIMES.setdefault(f"{{steps}},{{warmup}},{{leaks}},{{watched}}", []).append(time.perf_counter() - start)


def test_zz_write():
    TIMES["machine"] = f"Python {{platform.python_version()}}, torch {{torch.__version__}}, {{os.cpu_count()}} cores"
    with open("short.json", "w") as stream:
        json.dump(TIMES, stream)
"""


def short_loops(rounds: int) -> None:
    """The ``--short`` measurements (see the module docstring)."""
    with tempfile.TemporaryDirectory() as directory:
        folder = Path(directory)
        (folder / "test_short.py").write_text(textwrap.dedent(SHORT.format(rounds=rounds, make_step=MAKE_STEP)))
        (folder / "pytest.ini").write_text("[pytest]\n")
        # the leaking loops fail their tests (and are caught inside them): only the times matter
        subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"],
            cwd=folder,
            capture_output=True,
            text=True,
        )
        times = json.loads((folder / "short.json").read_text())
    print(f"median of {rounds} rounds, one session, torch on one thread ({times['machine']})")
    for steps, warmup in ((6, 2), (10, 2), (20, 5)):
        bare, watched = (statistics.median(times[f"{steps},{warmup},False,{side}"]) for side in (False, True))
        leak_bare, leak_watched = (statistics.median(times[f"{steps},{warmup},True,{side}"]) for side in (False, True))
        print(
            f"steps({steps}, warmup={warmup}), {1000 * bare / steps:.1f} ms a step: clean bare {bare:.3f}s, watched {watched:.3f}s, "
            f"{watched / bare:.2f}x; leaking bare {leak_bare:.3f}s, watched and explained {leak_watched:.3f}s, +{leak_watched - leak_bare:.2f}s"
        )


def pytest_session(folder: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"],
        cwd=folder,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(done.stdout[-3000:])


def first_loops(steps: int, rounds: int) -> dict[str, list[float]]:
    """Seconds from the end of the first step to the end of the last, in fresh sessions."""
    loops = {"bare": ("", f"range({steps})"), "watched": ("vramleak", f"vramleak.steps({steps})")}
    times: dict[str, list[float]] = {name: [] for name in loops}
    with tempfile.TemporaryDirectory() as directory:
        folder = Path(directory)
        (folder / "pytest.ini").write_text("[pytest]\n")
        for _ in range(rounds):
            for name, (fixture, loop) in loops.items():
                (folder / "test_first.py").write_text(textwrap.dedent(FIRST.format(fixture=fixture, loop=loop)))
                pytest_session(folder)
                times[name].append(json.loads((folder / "first.json").read_text()))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--short", action="store_true", help="loops of 6, 10 and 20 steps, clean and leaking")
    options = parser.parse_args()
    if options.short:
        short_loops(options.rounds)
        return
    with tempfile.TemporaryDirectory() as directory:
        folder = Path(directory)
        (folder / "test_steps.py").write_text(
            textwrap.dedent(TESTS.format(steps=options.steps, rounds=options.rounds, make_step=MAKE_STEP))
        )
        (folder / "conftest.py").write_text(CONFTEST.format())
        (folder / "pytest.ini").write_text("[pytest]\n")
        pytest_session(folder)
        times = json.loads((folder / "times.json").read_text())
        setup = json.loads((folder / "setup.json").read_text())
    bare, watched = statistics.median(times["bare"]), statistics.median(times["watched"])
    print(
        "rounds, bare:",
        " ".join(f"{t:.3f}" for t in times["bare"]),
        "watched:",
        " ".join(f"{t:.3f}" for t in times["watched"]),
    )
    print(f"{options.steps} training steps of {1000 * bare / options.steps:.1f} ms, median of {options.rounds} rounds")
    print(f"bare loop {bare:.3f}s, under vramleak.steps {watched:.3f}s: {watched / bare:.2f}x")
    bare_setup = statistics.median(setup["bare"])
    first, usual = setup["watched"][0] - bare_setup, statistics.median(setup["watched"]) - bare_setup
    print(
        f"set-up of a test using the fixture: +{1000 * first:.1f} ms as the session's first check (indexing the live tensors), +{1000 * usual:.1f} ms after a checked one"
    )
    first = first_loops(options.steps, options.rounds)
    bare, watched = statistics.median(first["bare"]), statistics.median(first["watched"])
    print(
        f"first loop of a session (steps 2 to {options.steps}): bare {bare:.3f}s, under vramleak.steps {watched:.3f}s: {watched / bare:.2f}x"
    )


if __name__ == "__main__":
    main()

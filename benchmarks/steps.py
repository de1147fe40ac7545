"""Time the step check against the bare loop: a small CPU training loop of a few ms a step.

    python benchmarks/steps.py [--steps 50] [--rounds 5]

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

TESTS = '''
import json, time
import pytest, torch

torch.set_num_threads(1)
TIMES = {{"bare": [], "watched": []}}


def make_step():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
    )
    optimizer = torch.optim.Adam(model.parameters())
    inputs, labels = torch.randn(128, 256), torch.randint(0, 10, (128,))

    def step(index):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(inputs), labels)
        loss.backward()
        optimizer.step()
        return loss.item()

    return step


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
'''

FIRST = '''
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
'''

CONFTEST = '''
import json

SETUP = {{"bare": [], "watched": []}}


def pytest_runtest_logreport(report):
    if report.when == "setup" and "[" in report.nodeid:
        SETUP["watched" if "test_watched" in report.nodeid else "bare"].append(report.duration)


def pytest_sessionfinish():
    with open("setup.json", "w") as stream:
        json.dump(SETUP, stream)
'''


def pytest_session(folder: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"], cwd=folder, capture_output=True, text=True
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
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        folder = Path(directory)
        (folder / "test_steps.py").write_text(textwrap.dedent(TESTS.format(steps=options.steps, rounds=options.rounds)))
        (folder / "conftest.py").write_text(CONFTEST.format())
        (folder / "pytest.ini").write_text("[pytest]\n")
        pytest_session(folder)
        times = json.loads((folder / "times.json").read_text())
        setup = json.loads((folder / "setup.json").read_text())
    bare, watched = statistics.median(times["bare"]), statistics.median(times["watched"])
    print("rounds, bare:", " ".join(f"{t:.3f}" for t in times["bare"]), "watched:", " ".join(f"{t:.3f}" for t in times["watched"]))
    print(f"{options.steps} training steps of {1000 * bare / options.steps:.1f} ms, median of {options.rounds} rounds")
    print(f"bare loop {bare:.3f}s, under vramleak.steps {watched:.3f}s: {watched / bare:.2f}x")
    bare_setup = statistics.median(setup["bare"])
    first, usual = setup["watched"][0] - bare_setup, statistics.median(setup["watched"]) - bare_setup
    print(f"set-up of a test using the fixture: +{1000 * first:.1f} ms after unchecked tests (indexing the live tensors), +{1000 * usual:.1f} ms after a checked one")
    first = first_loops(options.steps, options.rounds)
    bare, watched = statistics.median(first["bare"]), statistics.median(first["watched"])
    print(f"first loop of a session (steps 2 to {options.steps}): bare {bare:.3f}s, under vramleak.steps {watched:.3f}s: {watched / bare:.2f}x")


if __name__ == "__main__":
    main()

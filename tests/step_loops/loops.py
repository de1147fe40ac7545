"""What the loop catalogues share: labelled loops, the settings they run at, seeded models and data.

A loop's label is the truth by construction. At ``steps(10, warmup=2)`` and ``steps(20, warmup=5)``
the step check must give it on every seed. At ``steps(6, warmup=2)`` four measured steps may not
tell a leak from memory that varies or settles: there a wrong verdict must be ``undecided``
instead, and with ``max_steps`` allowed the loop must run on until it gets the right one.

The sweep asks for the verdict alone (``StepWatcher(..., explain=False)``): naming what holds a
leak costs a good part of a second per run and does not change the verdict;
``test_loop_catalogue.py`` checks on a few loops that it does not.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from typing import NamedTuple

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from pytest_vramleak import StepWatcher
from pytest_vramleak.steps import StepResult
from pytest_vramleak.tracking.tracker import Tracker

Step = Callable[[int], None]

SEEDS = range(10)
MAX_STEPS_FACTOR = 4
"""With ``max_steps`` allowed, the shortest setting may run on to four times its steps."""


class Setting(NamedTuple):
    steps: int
    warmup: int
    max_steps: int | None
    may_be_undecided: bool

    @property
    def most(self) -> int:
        """The most steps a loop may run at this setting."""
        return self.max_steps or self.steps

    def __str__(self) -> str:
        extra = f", max_steps={self.max_steps}" if self.max_steps else ""
        return f"steps({self.steps}, warmup={self.warmup}{extra})"


SETTINGS = [
    Setting(10, 2, None, False),
    Setting(20, 5, None, False),
    Setting(6, 2, None, True),
    Setting(6, 2, 6 * MAX_STEPS_FACTOR, False),
]
SETTING_PARAMS = [
    pytest.param(
        setting,
        id=f"steps{setting.steps}-warmup{setting.warmup}" + (f"-max{setting.max_steps}" if setting.max_steps else ""),
    )
    for setting in SETTINGS
]


class Run(NamedTuple):
    """What a builder is told: the data seed, the steps the loop is asked for, the most it may run."""

    seed: int
    steps: int
    most: int


class Loop(NamedTuple):
    """One catalogue entry: ``build(run)`` makes fresh state and returns ``step(i)``."""

    name: str
    build: Callable[[Run], Step]
    leaks: bool
    pattern: str


class Catalogue(list[Loop]):
    """Loops registered with ``@catalogue.loop(leaks=...)``, named after their builders."""

    def loop(self, *, leaks: bool) -> Callable[[Callable[[Run], Step]], Callable[[Run], Step]]:
        """Register a builder under its function name, with its docstring as the pattern it shows."""

        def register(build: Callable[[Run], Step]) -> Callable[[Run], Step]:
            assert build.__doc__ and "\n" not in build.__doc__.strip(), f"{build.__name__} needs a one-line docstring"
            self.append(Loop(build.__name__, build, leaks, build.__doc__.strip()))
            return build

        return register

    def ids(self) -> list[str]:
        return [entry.name for entry in self]


def verdict_of(result: StepResult) -> str:
    """``grows``, ``clean`` or ``undecided``."""
    return "undecided" if result.undecided else "grows" if result.grows else "clean"


def run_loop(build: Callable[[], Step], setting: Setting, tracker: Tracker, *, explain: bool = False) -> StepResult:
    """Build a loop and check it at ``setting`` as the ``vramleak`` fixture does: under a tracker
    that was already tracking as the test built the loop (the plugin's, begun at set-up)."""
    tracker.begin()
    try:
        step = build()
        watcher = StepWatcher("cpu", warmup=setting.warmup, tracker=tracker, explain=explain)
        return watcher.check(step, steps=setting.steps, max_steps=setting.max_steps)
    finally:
        tracker.end()


def wrong_verdicts(build: Callable[[int], Step], leaks: bool, setting: Setting) -> list[str]:
    """One line for each seed whose verdict is wrong at ``setting``; ``build(seed)`` makes a fresh loop."""
    expected = "grows" if leaks else "clean"
    wrong = []
    tracker = Tracker("cpu")  # one for the seeds, as the plugin has one for the tests of a session
    for seed in SEEDS:
        result = run_loop(functools.partial(build, seed), setting, tracker)
        verdict = verdict_of(result)
        if verdict == expected or (verdict == "undecided" and setting.may_be_undecided):
            continue
        wrong.append(f"seed {seed}: {verdict} after {result.ran} steps; figures {result.steps}; kept {result.kept}")
    return wrong


def check_catalogue_entry(entry: Loop, setting: Setting) -> None:
    """Fail with every seed whose verdict at ``setting`` is wrong for ``entry``."""
    wrong = wrong_verdicts(lambda seed: entry.build(Run(seed, setting.steps, setting.most)), entry.leaks, setting)
    expected = "grows" if entry.leaks else "clean"
    assert not wrong, f"{entry.name}: {entry.pattern}\nexpected {expected} at {setting}:\n" + "\n".join(wrong)


# Seeded models and data. A seed changes every random draw a loop makes: each maker takes the
# run's seed and a number of its own, so two makers never share a stream.

FEATURES, CLASSES, BATCH = 32, 10, 16


def seeded(run: Run, stream: int) -> torch.Generator:
    """A generator for one of a loop's random streams."""
    return torch.Generator().manual_seed(1000 * run.seed + stream)


def sampler(run: Run, stream: int) -> random.Random:
    return random.Random(1000 * run.seed + stream)


def init(run: Run, stream: int = 0) -> None:
    """Seed torch's global generator before a model is made (its weights, and draws without a generator)."""
    torch.manual_seed(1000 * run.seed + stream)


def mlp(run: Run) -> nn.Sequential:
    init(run)
    return nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, CLASSES))


def cnn(run: Run) -> nn.Sequential:
    init(run)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(8 * 8 * 8, CLASSES),
    )


class TinyTransformer(nn.Module):
    """One encoder layer over sequences of 32 features, mean-pooled into a classifier."""

    def __init__(self, run: Run) -> None:
        super().__init__()
        init(run)
        self.encoder = nn.TransformerEncoderLayer(FEATURES, nhead=4, dim_feedforward=64, dropout=0.0, batch_first=True)
        self.head = nn.Linear(FEATURES, CLASSES)

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.head(self.encoder(tokens, src_mask=mask).mean(dim=1))


def classification_batches(run: Run, count: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = seeded(run, 1)
    return [
        (torch.randn(BATCH, FEATURES, generator=generator), torch.randint(CLASSES, (BATCH,), generator=generator))
        for _ in range(count)
    ]


def image_batches(run: Run, count: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = seeded(run, 2)
    return [
        (torch.randn(8, 3, 16, 16, generator=generator), torch.randint(CLASSES, (8,), generator=generator))
        for _ in range(count)
    ]


def sequence_batches(run: Run, count: int = 4, length: int = 16) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = seeded(run, 3 + length)
    return [
        (torch.randn(8, length, FEATURES, generator=generator), torch.randint(CLASSES, (8,), generator=generator))
        for _ in range(count)
    ]


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One ordinary step: zero the gradients, backward, update; returns the loss (graph already freed)."""
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss

"""pytest-vramleak: fail tests that leak GPU (or CPU) tensor memory, and name what holds it."""

from __future__ import annotations

from typing import Any

from .check import CheckResult, LeakCheck, Rules
from .holders.snapshot import Leak, Snapshot, TensorGroup, diff, take_snapshot
from .judging.sizes import SizeError, format_size, parse_size
from .judging.verdict import Budget, GrowthVerdict, judge_budget, judge_growth
from .ranks import watch_rank
from .steps import StepResult, StepWatcher

__all__ = [
    "Budget",
    "CheckResult",
    "LeakCheck",
    "Rules",
    "GrowthVerdict",
    "Leak",
    "SizeError",
    "Snapshot",
    "StepResult",
    "StepWatcher",
    "TensorGroup",
    "diff",
    "format_size",
    "judge_budget",
    "judge_growth",
    "parse_size",
    "take_snapshot",
    "vram_budget",
    "watch_rank",
]


def __getattr__(name: str) -> Any:
    # The marker helper needs pytest; a training script importing the engine does not.
    if name == "vram_budget":
        from .plugin.marker import vram_budget

        return vram_budget
    raise AttributeError(f"module 'pytest_vramleak' has no attribute {name!r}")

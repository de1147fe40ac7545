"""pytest-vramleak: fail tests that leak GPU (or CPU) tensor memory, and name what holds it.

The public names are imported on first use: pytest loads the plugin in every run of an
environment it is installed in, and a run that checks nothing should not pay for the engine.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .check import CheckResult, LeakCheck, Rules
    from .holders.snapshot import Leak, Snapshot, TensorGroup, diff, take_snapshot
    from .judging.sizes import SizeError, format_size, parse_size
    from .judging.verdict import Budget, GrowthVerdict, judge_budget, judge_growth
    from .plugin.marker import vram_budget
    from .ranks import watch_rank
    from .steps import StepResult, StepWatcher

_WHERE = {
    "CheckResult": "check",
    "LeakCheck": "check",
    "Rules": "check",
    "Leak": "holders.snapshot",
    "Snapshot": "holders.snapshot",
    "TensorGroup": "holders.snapshot",
    "diff": "holders.snapshot",
    "take_snapshot": "holders.snapshot",
    "SizeError": "judging.sizes",
    "format_size": "judging.sizes",
    "parse_size": "judging.sizes",
    "Budget": "judging.verdict",
    "GrowthVerdict": "judging.verdict",
    "judge_budget": "judging.verdict",
    "judge_growth": "judging.verdict",
    "vram_budget": "plugin.marker",  # needs pytest; a training script importing the engine does not
    "watch_rank": "ranks",
    "StepResult": "steps",
    "StepWatcher": "steps",
}
"""Each public name and the module that defines it."""

__all__ = [
    "Budget",
    "CheckResult",
    "GrowthVerdict",
    "Leak",
    "LeakCheck",
    "Rules",
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
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'pytest_vramleak' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})

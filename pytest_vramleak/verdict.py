"""Deciding verdicts from measured numbers. Pure functions, no torch, no pytest."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .sizes import format_size


@dataclass(frozen=True)
class Budget:
    """What a test may use: ``leak`` bytes left behind, ``peak`` bytes above its baseline (None: no limit)."""

    peak: int | None = None
    leak: int = 0
    device: str | None = None


@dataclass(frozen=True)
class BudgetVerdict:
    """``outcome`` is ``passed``, ``leaked`` or ``over_budget``; ``message`` is one sentence, or empty."""

    outcome: str
    message: str


def judge_budget(budget: Budget, device: str, leaked_bytes: int, peak_bytes: int | None) -> BudgetVerdict:
    """A test leaked if it left more than ``budget.leak`` bytes; it is over budget if its peak passed ``budget.peak``."""
    problems = []
    outcome = "passed"
    if leaked_bytes > budget.leak:
        outcome = "leaked"
        problems.append(f"leaked {format_size(leaked_bytes)} on {device}, allowed {format_size(budget.leak)}")
    if budget.peak is not None and peak_bytes is not None and peak_bytes > budget.peak:
        outcome = "leaked" if outcome == "leaked" else "over_budget"
        problems.append(f"peaked at {format_size(peak_bytes)} above baseline on {device}, allowed {format_size(budget.peak)}")
    return BudgetVerdict(outcome, "; ".join(problems))


@dataclass(frozen=True)
class GrowthVerdict:
    """The step check's decision, with the figures it rests on."""

    grows: bool
    growth_bytes: int
    """Bytes held after the last measured step above the warm-up baseline."""
    per_step_bytes: float
    """How much the lower and upper bounds of memory rose per step from the first half to the second."""
    message: str


def judge_growth(steps: Sequence[int], tolerance: int, device: str = "cpu") -> GrowthVerdict:
    """Decide whether memory keeps growing across measured steps.

    ``steps`` are bytes above the warm-up baseline after each measured step. The steps are split
    into an earlier and a later half (the middle step is left out when their number is odd), and
    memory grows when both the lowest and the highest figure of the later half are more than
    ``tolerance`` bytes above those of the earlier half: the whole band memory moves in has risen.

    That flags steady growth and growth that comes every other step or every k-th step (k at most
    half the measured steps), and leaves alone memory that rises and then stays flat within the
    first half (lazily created state, a bounded buffer filling up), and memory that goes up and
    down by the same amounts (gradient accumulation, temporaries of the measured step).
    """
    if len(steps) < 2:
        raise ValueError(f"the step check needs at least 2 measured steps, got {len(steps)}")
    half = len(steps) // 2
    earlier, later = steps[:half], steps[len(steps) - half :]
    floor_rise = min(later) - min(earlier)
    ceiling_rise = max(later) - max(earlier)
    distance = len(steps) - half
    rise = min(floor_rise, ceiling_rise)
    grows = floor_rise > tolerance and ceiling_rise > tolerance
    per_step = rise / distance
    growth = steps[-1]
    message = ""
    if grows:
        message = (
            f"memory grew {format_size(per_step)} per step over {len(steps)} measured steps "
            f"({format_size(growth)} in total) on {device}, tolerance {format_size(tolerance)}"
        )
    return GrowthVerdict(grows, growth, per_step, message)


@dataclass(frozen=True)
class Increase:
    """How much a figure may grow over a saved run: it fails only past both limits."""

    fraction: float = 0.10
    bytes: int = 64 * 1024

    def allowed(self, old: int) -> int:
        return max(int(old * self.fraction), self.bytes)

    def describe(self) -> str:
        return f"+{self.fraction * 100:g}% and +{format_size(self.bytes)}"


def parse_increase(value: str) -> Increase:
    """``"10%"``, ``"1 MiB"`` or both, comma-separated: ``"10%, 1 MiB"``; what is not given stays 0."""
    from .sizes import parse_size

    fraction, size = 0.0, 0
    parts = [part.strip() for part in str(value).split(",") if part.strip()]
    if not parts or len(parts) > 2:
        raise ValueError(f"expected a percentage, a size or both, e.g. '10%, 1 MiB', got {value!r}")
    for part in parts:
        if part.endswith("%"):
            try:
                fraction = float(part[:-1]) / 100
            except ValueError:
                raise ValueError(f"cannot read {part!r} as a percentage") from None
            if fraction < 0:
                raise ValueError(f"the percentage must not be negative, got {part!r}")
        else:
            size = parse_size(part)
    return Increase(fraction, size)


def judge_increase(old_peak: int, new_peak: int, limit: Increase, device: str) -> str:
    """The failure sentence when the peak grew past ``limit`` over the saved run, else ``""``."""
    growth = new_peak - old_peak
    if growth <= limit.allowed(old_peak):
        return ""
    percent = f" (+{100 * growth / old_peak:.0f}%)" if old_peak else ""
    return (
        f"peak on {device} grew from {format_size(old_peak)} to {format_size(new_peak)}, "
        f"+{format_size(growth)}{percent}, allowed {limit.describe()}"
    )

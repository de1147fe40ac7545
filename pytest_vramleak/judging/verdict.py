"""Deciding verdicts from measured numbers. Pure functions, no torch, no pytest."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .sizes import format_size
from .words import Outcome


@dataclass(frozen=True)
class Budget:
    """What a test may use: ``leak`` bytes left behind, ``peak`` bytes above its baseline (None: no limit)."""

    peak: int | None = None
    leak: int = 0
    device: str | None = None
    reserved: int | None = None
    """CUDA: bytes the caching allocator may reserve above its level at the start of the call, at most."""
    pinned: int | None = None
    """CUDA: bytes of pinned host memory the test may hold above its baseline at any moment."""


@dataclass(frozen=True)
class BudgetVerdict:
    """``outcome`` is ``passed``, ``leaked`` or ``over_budget``; ``message`` is one sentence, or empty."""

    outcome: Outcome
    message: str


def judge_budget(budget: Budget, device: str, leaked_bytes: int, peak_bytes: int | None) -> BudgetVerdict:
    """A test leaked if it left more than ``budget.leak`` bytes; it is over budget if its peak passed ``budget.peak``."""
    problems = []
    outcome: Outcome = "passed"
    if leaked_bytes > budget.leak:
        outcome = "leaked"
        problems.append(f"leaked {format_size(leaked_bytes)} on {device}, allowed {format_size(budget.leak)}")
    if budget.peak is not None and peak_bytes is not None and peak_bytes > budget.peak:
        outcome = "leaked" if outcome == "leaked" else "over_budget"
        problems.append(
            f"peaked at {format_size(peak_bytes)} above baseline on {device}, allowed {format_size(budget.peak)}"
        )
    return BudgetVerdict(outcome, "; ".join(problems))


@dataclass(frozen=True)
class GrowthVerdict:
    """The step check's decision, with the figures it rests on."""

    grows: bool
    growth_bytes: int
    """Bytes held after the last measured step above the warm-up baseline."""
    per_step_bytes: float
    """How fast memory grew while it grew: bytes kept per step over the steps of the growth."""
    message: str
    settled_at: int | None = None
    """Where memory rose inside the measured steps and then stayed flat: the measured step (from 1)
    after which it stopped rising. Not a leak; a longer warm-up would leave it out."""
    kept_bytes: int = 0
    """Bytes kept for good during the measured steps (the floor's rise), growing or settled."""


LATE_GROWTH_STEPS = 3
"""Measured steps at the end that each grew: growth, whatever the steps before them did."""


def judge_growth(steps: Sequence[int], tolerance: int, device: str = "cpu") -> GrowthVerdict:
    """Decide whether memory keeps growing across measured steps.

    ``steps`` are bytes above the warm-up baseline after each measured step. Memory grows when

    - the band it moves in rose: both the lowest and the highest figure of the later half of the
      steps are more than ``tolerance`` above those of the earlier half (the middle step is left
      out when their number is odd), and the later half's highest figure is more than
      ``tolerance`` above the baseline. That flags steady growth, growth every k-th step, and small
      growth under a sawtooth (gradient accumulation), and leaves alone memory that goes up and
      down by the same amounts (temporaries, accumulation) and a spike on the last step; or
    - each of the last :data:`LATE_GROWTH_STEPS` steps grew, by more than ``tolerance`` in all:
      growth that starts late (after 49 flat steps, +1 GiB a step);

    unless memory *settled*: its last new high came longer ago than the longest interval between
    new highs before it (a bounded buffer that filled up, state made at the first real optimizer
    step), which is reported with the step where it settled. The rate given is that of the
    growing steps at the end for growth that started late, else what the last step holds over
    the measured steps, or, where the last step is a trough of a sawtooth at or below the
    baseline, the rate at which the band's floor rose: never zero or less.
    """
    if len(steps) < 2:
        raise ValueError(f"the step check needs at least 2 measured steps, got {len(steps)}")
    count = len(steps)
    half = count // 2
    earlier, later = steps[:half], steps[count - half :]
    # (and its top ended above the baseline by more than the tolerance: figures that vary below
    # the baseline, a loop whose batches differ in size, hold nothing the loop added)
    band_rose = (
        min(later) - min(earlier) > tolerance and max(later) - max(earlier) > tolerance and max(later) > tolerance
    )
    late = grew_late(steps, tolerance)
    highs = _new_highs(steps)
    gaps = [later_high - earlier_high for earlier_high, later_high in zip(highs, highs[1:], strict=False)]
    since_last_high = count - 1 - highs[-1] if highs else count
    paused = bool(highs) and since_last_high > 0 and since_last_high >= max(gaps, default=1)
    growth = steps[-1]
    if late or (band_rose and not paused):
        if late:  # the rate of the run of growing steps at the end
            first = count - 1
            while first > 0 and steps[first] > steps[first - 1]:
                first -= 1
            base, increases = steps[first], count - 1 - first
            if first == 0 and steps[0] > 0:  # it grew from the baseline on
                base, increases = 0, count
            total = steps[-1] - base
            per_step = total / increases
        elif steps[-1] > tolerance:  # the band rose: what the last step holds, over the measured steps
            total = steps[-1]
        else:  # the last step is a trough below it: how fast the band's floor rose, over them all
            total = (min(later) - min(earlier)) * count // (count - half)
        if not late:
            per_step = total / count
        return GrowthVerdict(
            True, growth, per_step, growth_message(per_step, count, total, tolerance, device), None, total
        )
    # Not growing; settled where it rose to a new high and has held at least some of it since.
    kept = min(steps[highs[-1] :]) if highs else 0
    settled = highs[-1] + 1 if highs and since_last_high > 0 and kept > tolerance else None
    return GrowthVerdict(False, growth, 0.0, "", settled, kept if settled else 0)


TREND_CERTAIN = 2.5
"""The Mann-Kendall statistic (in standard deviations) from which a rise is a trend, not noise:
about one chance in 160 that figures varying at random rise this steadily (6 steps that each
rose are 1 order in 720). The step check asks it only of a rise no kept tensor explains."""


SURE_STEPS = 6
"""Measured steps from which the step check decides every loop on CPU. Growth every third step
rises twice in 6 steps, once in each half that :func:`judge_growth` compares, and a tensor
replaced by a bigger one at every step reaches :data:`TREND_CERTAIN` (2.6); over fewer steps
neither holds, and a verdict that depends on them is undecided."""


def trend_score(figures: Sequence[int]) -> float:
    """The Mann-Kendall trend statistic of ``figures``: how many standard deviations the count of
    later-above-earlier pairs, less later-below-earlier pairs, lies above what figures in random
    order give (ties count as neither, and the continuity correction is applied). Strictly
    rising figures score about 1.7 over 4 steps, 2.6 over 6, 3.3 over 8 and 5.2 over 15."""
    count = len(figures)
    if count < 3:
        return 0.0
    score = sum(
        (later > earlier) - (later < earlier) for i, earlier in enumerate(figures) for later in figures[i + 1 :]
    )
    spread = (count * (count - 1) * (2 * count + 5) / 18) ** 0.5
    return (score - 1) / spread if score > 0 else (score + 1) / spread if score < 0 else 0.0


def growth_message(per_step: float, count: int, total: int, tolerance: int, device: str) -> str:
    return (
        f"memory grew {format_size(per_step)} per step over {count} measured steps "
        f"({format_size(total)} in total) on {device}, tolerance {format_size(tolerance)}"
    )


def grew_late(steps: Sequence[int], tolerance: int) -> bool:
    """Whether each of the last :data:`LATE_GROWTH_STEPS` figures grew, by more than ``tolerance`` in all."""
    tail = steps[-LATE_GROWTH_STEPS - 1 :]
    return rose_each(steps, LATE_GROWTH_STEPS) and tail[-1] - tail[0] > tolerance


def floor_rise(steps: Sequence[int]) -> float:
    """How fast the band's floor rose: the lowest figure of the later half of ``steps`` less that
    of the earlier half, per step between the halves (as :func:`judge_growth` splits them). A
    sawtooth under the growth does not change it, whichever of its teeth the last step is on."""
    count = len(steps)
    half = count // 2
    return (min(steps[count - half :]) - min(steps[:half])) / (count - half)


def rose_each(figures: Sequence[int], count: int) -> bool:
    """Whether each of the last ``count`` figures is above the one before it."""
    tail = figures[-count - 1 :]
    return len(tail) == count + 1 and all(after > before for before, after in zip(tail, tail[1:], strict=False))


def _new_highs(steps: Sequence[int]) -> list[int]:
    """The steps whose figure passed every figure before it (and the baseline, 0)."""
    highs, highest = [], 0
    for index, value in enumerate(steps):
        if value > highest:
            highs.append(index)
            highest = value
    return highs


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

"""Watching repeated steps (training or inference iterations) for memory that keeps growing."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .devices import Meter
from .snapshot import Leak, Snapshot, describe, meter_for, take_snapshot
from .sites import SiteRecorder
from .tracker import Tracker
from .verdict import GrowthVerdict, judge_growth


RECORDED_STEPS = 2
"""Measured steps whose allocation sites are recorded; the rest of a loop runs without."""


@dataclass
class StepResult:
    """What a step check measured and decided."""

    device: str
    warmup: int
    steps: list[int]
    """Bytes above the warm-up baseline after each measured step."""
    verdict: GrowthVerdict
    leak: Leak | None = None
    warmup_steps: list[int] = field(default_factory=list)
    """Bytes above the warm-up baseline after each warm-up step (the last is the baseline: 0)."""
    """Tensors created after warm-up that outlived a step, with their holders; only when memory grew."""

    @property
    def grows(self) -> bool:
        return self.verdict.grows


@dataclass
class StepWatcher:
    """Runs steps, measures memory after each, and decides whether it keeps growing.

    ``warmup`` steps run first unmeasured, so state created lazily (optimizer moments, cuBLAS
    workspaces, caches filled on first use) is part of the baseline rather than a leak.
    """

    device: str | None = "auto"
    warmup: int = 2
    tolerance: int = 0
    meter: Meter | None = None
    tracker: Tracker | None = None
    """Tracks storages cheaply between steps; one is made for the loop when none is given."""
    sites: Callable[[], SiteRecorder | None] | None = None
    """The recorder of allocation sites active around the loop, if any."""
    results: list[StepResult] = field(default_factory=list)

    def check_arguments(self, n: int, warmup: int | None) -> int:
        """The effective warm-up for ``steps(n, warmup=...)``; ValueError for arguments that cannot work."""
        warmup = self.warmup if warmup is None else warmup
        if type(n) is not int or type(warmup) is not int or warmup < 0:
            raise ValueError(f"steps(n, warmup=k) takes whole numbers, got n={n!r}, warmup={warmup!r}")
        if n - warmup < 2:
            raise ValueError(f"steps({n}, warmup={warmup}) leaves {max(0, n - warmup)} measured step(s); at least 2 are needed")
        return warmup

    def steps(self, n: int, *, warmup: int | None = None) -> Iterator[int]:
        """Yield ``0 .. n-1``; after the loop, ``self.results[-1]`` holds the verdict.

        The first ``warmup`` iterations are not measured; at least two must remain.
        """
        warmup = self.check_arguments(n, warmup)
        meter = self.meter or meter_for(self.device)
        tracker = self.tracker or Tracker(meter.name)
        owns_tracker = not tracker.active
        if owns_tracker:
            tracker.begin()
        recorder = self.sites() if self.sites else None
        try:
            baseline: Snapshot | None = take_snapshot(meter=meter, tracker=tracker) if warmup == 0 else None
            snapshots: list[Snapshot] = []
            measured: list[int] = []
            warming: list[int] = []
            for index in range(n):
                yield index
                if index < warmup - 1:
                    warming.append(take_snapshot(meter=meter, tracker=tracker).allocated_bytes)
                elif index == warmup - 1:
                    baseline = take_snapshot(meter=meter, tracker=tracker)
                    warming.append(baseline.allocated_bytes)
                elif index >= warmup:
                    snapshots.append(take_snapshot(meter=meter, tracker=tracker))
                    if len(snapshots) > 2:
                        del snapshots[0]  # only the last two are needed for naming
                    measured.append(snapshots[-1].allocated_bytes)
                if recorder is not None and index == warmup + RECORDED_STEPS - 1:
                    # Recording every torch call costs about a fifth of a small step; what a loop
                    # leaks, it leaks in its first measured steps too.
                    recorder.pause()
        finally:
            if recorder is not None:
                recorder.resume()
            if owns_tracker:
                tracker.end()
        assert baseline is not None and len(snapshots) == 2
        figures = [m - baseline.allocated_bytes for m in measured]
        verdict = judge_growth(figures, self.tolerance, meter.name)
        leak = None
        if verdict.grows:
            penultimate, end = snapshots
            # Storages alive both after the next-to-last step and at the end outlived a step:
            # those are the growth. The last step's own temporaries (its batch, its loss) are not.
            new = end.new_since(baseline)
            lasting = {key for key in new if penultimate.holds_same(key, end)}
            with tracker.unfrozen():  # naming holders needs the whole heap
                groups = describe(lasting or new, meter.name, sites=self.sites() if self.sites else None)
            leak = Leak(meter.name, baseline.allocated_bytes, end.allocated_bytes, end.leaked_since(baseline), groups, end.details)
        warmup_figures = [w - baseline.allocated_bytes for w in warming]
        self.results.append(StepResult(meter.name, warmup, figures, verdict, leak, warmup_figures))

    def check(self, step: Callable[[int], Any], *, steps: int = 10, warmup: int | None = None) -> StepResult:
        """Call ``step(i)`` for ``i`` in ``0 .. steps-1`` and return the result of the check."""
        for index in self.steps(steps, warmup=warmup):
            step(index)
        return self.results[-1]

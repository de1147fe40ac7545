"""Watching repeated steps (training or inference iterations) for memory that keeps growing."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .devices import Meter
from .sites import SiteRecorder
from .snapshot import Leak, describe, meter_for
from .tracker import Mark, StorageRef, Tracker
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
    """Tensors created after warm-up that outlived a step, with their holders; only when memory grew."""
    warmup_steps: list[int] = field(default_factory=list)
    """Bytes above the warm-up baseline after each warm-up step (the last is the baseline: 0)."""

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
    """Tracks storages between steps; one is made for the loop when none is given."""
    record_sites: bool = True
    """Record where the tensors of the first measured steps are made (see :mod:`pytest_vramleak.sites`)."""
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
        loop = _Loop(meter, self.tracker or Tracker(meter.name), self.record_sites)
        loop.open()
        try:
            if warmup == 0:
                loop.take_baseline()
            for index in range(n):
                yield index
                if index < warmup - 1:
                    loop.measure_warmup()
                elif index == warmup - 1:
                    loop.take_baseline()
                else:
                    loop.measure_step(recording_ends=index == warmup + RECORDED_STEPS - 1)
        finally:
            loop.close()
        figures = loop.figures()
        verdict = judge_growth(figures, self.tolerance, meter.name)
        leak = loop.explain() if verdict.grows else None
        self.results.append(StepResult(meter.name, warmup, figures, verdict, leak, loop.warmup_figures()))

    def check(self, step: Callable[[int], Any], *, steps: int = 10, warmup: int | None = None) -> StepResult:
        """Call ``step(i)`` for ``i`` in ``0 .. steps-1`` and return the result of the check."""
        for index in self.steps(steps, warmup=warmup):
            step(index)
        return self.results[-1]


class _Loop:
    """One step loop's measurements: the warm-up baseline, then memory after each step.

    On CPU each measurement is a tracker observation (what the step made and freed); on an
    accelerator, the allocator's counter, and the tracker is read only to name a leak.
    """

    def __init__(self, meter: Meter, tracker: Tracker, record_sites: bool) -> None:
        self.meter = meter
        self.tracker = tracker
        self.on_cpu = meter.name == "cpu"
        self.owns_tracker = not tracker.active
        # On accelerators the allocator's history names sites (--vramleak-trace); steps are not observed.
        self.recorder = SiteRecorder() if record_sites and self.on_cpu else None
        self.warming: list[int] = []
        self.measured: list[int] = []
        self.baseline_bytes = 0
        self.baseline_clock = 0
        self.penultimate_clock = 0
        self.last_mark: Mark | None = None

    def open(self) -> None:
        if self.owns_tracker:
            self.tracker.begin(index=self.on_cpu)

    def close(self) -> None:
        if self.recorder is not None:
            self.recorder.stop()
        if self.owns_tracker:
            self.tracker.end()

    def _measure(self) -> int:
        if self.on_cpu:
            self.last_mark = self.tracker.observe(since=self.last_mark)
            return self.tracker.total("cpu")
        self.meter.settle()
        return self.meter.allocated_bytes()

    def measure_warmup(self) -> None:
        self.warming.append(self._measure())

    def take_baseline(self) -> None:
        self.baseline_bytes = self._measure()
        self.tracker.freeze_young()  # each step's observation then reads what that step made
        self.warming.append(self.baseline_bytes)
        self.baseline_clock = self.penultimate_clock = self.tracker.clock
        if self.recorder is not None:
            self.recorder.start()

    def measure_step(self, *, recording_ends: bool) -> None:
        self.penultimate_clock = self.tracker.clock
        self.measured.append(self._measure())
        if recording_ends and self.recorder is not None:
            # Tracing every allocation costs more than a small step; what a loop leaks, it leaks
            # in its first measured steps too: note where those were made, and stop.
            self.recorder.capture(self.tracker.pairs(self.tracker.created("cpu", since=self.baseline_clock)))
            self.recorder.stop()

    def figures(self) -> list[int]:
        return [m - self.baseline_bytes for m in self.measured]

    def warmup_figures(self) -> list[int]:
        return [w - self.baseline_bytes for w in self.warming]

    def explain(self) -> Leak:
        """The tensors made after warm-up that outlived a step (alive after the next-to-last step
        and at the end), with their holders. The last step's own temporaries are not among them."""
        tracker, device = self.tracker, self.meter.name
        if not self.on_cpu:
            tracker.catch_up()
        lasting = tracker.created(device, since=self.baseline_clock, before=self.penultimate_clock + 1)
        refs = lasting or tracker.created(device, since=self.baseline_clock)
        refs += [ref for ref, _ in tracker.grown_older(device, since=self.baseline_clock)]
        keys = [(ref.device, ref.pointer) for ref in refs if ref() is not None]
        with tracker.unfrozen():  # naming holders needs the whole heap
            groups = describe(keys, device, sites=self.recorder) if keys else []
        end = self.baseline_bytes + (self.figures()[-1] if self.measured else 0)
        return Leak(device, self.baseline_bytes, end, end - self.baseline_bytes, groups)

"""What a check or a step loop reads to measure: the tracker's ledger on CPU, the allocator's counters elsewhere.

On CPU (:class:`LedgerReadings`) a check leaked what the tracker's ledger says
(:mod:`pytest_vramleak.tracking.ledger`): storages made since set-up started and alive, plus older
storages' growth in place, less older storages freed. The baseline is an observation as the body
starts, and memory only the cycle collector frees is what the body made that one more collection
frees (:mod:`pytest_vramleak.holders.cycles`).

Where the device's allocator keeps counters (CUDA, XPU, MPS), a check needs no tensor to measure:
the growth of allocated bytes from set-up's start to after teardown is what the checked code
left, less what fixtures of a wider scope made meanwhile (the caller adds those to the baseline).
A growth past the budget is measured again a few times (memory freed asynchronously can still
arrive, as PyTorch's own check allows) and set beside the driver's figure
(:func:`~pytest_vramleak.meters.devices.measure_growth`). Every other CUDA device of the process, pinned
host memory and the allocator's reserved peak are read alongside.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from .holders.cycles import cycle_garbage, let_go, save_garbage
from .meters.devices import CudaMeter, Growth, Meter, clear_torch_caches, explain_reserved, measure_growth
from .tracking import gc_functions as gc
from .tracking.tracker import KeptGraph, Mark, Tracker, graph_clock

if TYPE_CHECKING:
    from .judging.verdict import Budget
    from .result import CheckResult
    from .tracking.sites import SiteRecorder


@dataclass
class Finishing:
    """What a check hands its readings as it finishes: its result so far, its budget and clocks,
    and how a suspected leak is confirmed."""

    result: CheckResult
    budget: Budget
    begin_clock: int
    begin_graphs: int | None
    release: Callable[[], None] | None
    """Drops what the caller still holds for the code checked (pytest's fixture values): cheap, first."""
    settle_leaks: bool
    """Confirm a suspected leak with PyTorch's caches cleared (and, on CPU, a full collection)."""
    clear_caches: bool
    settled: bool = False
    """Set where every generation was collected, or caches cleared, to confirm the leak."""

    @property
    def suspected(self) -> bool:
        """More than the budget left (memory, or autograd history the checked code left alive)."""
        return (self.result.leaked_bytes or 0) + self.result.history_bytes > self.budget.leak


class StepReading(NamedTuple):
    """What a step loop reads after a step."""

    in_use_bytes: int
    """Bytes of the device's tensor memory in use."""
    graphs: int | None
    """This thread's autograd sequence counter right after the reading."""
    slack: int | None = None
    """CUDA: bytes the caching allocator reserved but did not allocate (None elsewhere)."""


class Readings(Protocol):
    """What a check or a step loop reads to measure one device: :class:`LedgerReadings` on CPU,
    :class:`AllocatorReadings` where the allocator keeps counters."""

    names_each_storage: bool
    """Whether the readings know each storage the checked code made, and when (else the tracker's
    index is asked only to name what is kept)."""
    others: list[tuple[CudaMeter, int]]
    """Other devices read alongside, with their allocated bytes as the body started."""

    def begin(self) -> int:
        """Set-up starts: the bytes in use now."""

    def start(self, *, keep_garbage: bool) -> None:
        """The body starts: take the baseline."""

    def stop(self, result: CheckResult, begin_clock: int, *, strict: bool, sites: SiteRecorder | None) -> None:
        """The body returned: what only the cycle collector frees."""

    def finish(self, finishing: Finishing) -> None:
        """Measure after teardown, again where a leak is suspected, and put the figures in the result."""

    def before_naming(self) -> None:
        """Make the tracker's index ready to name what is kept."""

    def fixture_mark(self) -> int:
        """Where a wider-scoped fixture set up during the check starts."""

    def fixture_bytes(self, mark: int) -> int:
        """What that fixture made since ``mark``."""

    def close(self) -> None:
        """The check ended: let go of what the readings held."""

    def step_reading(self, *, generations: int) -> StepReading:
        """After a step of a loop: the memory in use (``generations``: of the unfrozen ones, how
        many a collection walks first)."""

    def kept_graph(self, since: int | None, before: int | None = None) -> KeptGraph:
        """The autograd history made since ``since`` (and before ``before``) that tensors alive now keep."""


def readings_for(meter: Meter, tracker: Tracker) -> Readings:
    """What a check on ``meter``'s device reads: its allocator's counters where it keeps them,
    else the tracker's ledger of storages."""
    return AllocatorReadings(meter, tracker) if meter.keeps_counters else LedgerReadings(tracker)


class LedgerReadings:
    """What one check, or one step loop, reads of the tracker's ledger on CPU."""

    names_each_storage = True
    """The ledger knows each storage a check's code made, and when: a test's runs are told apart,
    and what they kept is named storage by storage."""

    def __init__(self, tracker: Tracker) -> None:
        self.tracker = tracker
        self.others: list[tuple[CudaMeter, int]] = []
        """Other devices read alongside: none (the ledger covers every CPU storage)."""
        self.baseline: Mark | None = None
        """The observation as the body started."""
        self._garbage_from: int | None = None
        """Where in ``gc.garbage`` what collections saved since the body began starts (keep_cycle_garbage)."""
        self.step_mark: Mark | None = None
        """A step loop's last observation."""

    def begin(self) -> int:
        """Set-up starts: the bytes of every storage alive."""
        return self.tracker.total("cpu")

    def start(self, *, keep_garbage: bool) -> None:
        """The body starts: observe, and freeze what set-up made (read again only where it changes)."""
        self.baseline = self.tracker.observe()
        self.tracker.freeze_young()
        if keep_garbage:
            self._garbage_from = save_garbage()

    def stop(self, result: CheckResult, begin_clock: int, *, strict: bool, sites: SiteRecorder | None) -> None:
        """The body returned: what only the cycle collector frees, and where the tensors the check
        made that are still alive were made (``sites``)."""
        if self.baseline is None:
            return
        result.cycle_bytes = self.cycle_bytes(result, strict=strict, sites=sites)
        if sites is not None:
            sites.capture(self.tracker.pairs(self.tracker.created("cpu", since=begin_clock - 1)))

    def finish(self, finishing: Finishing) -> None:
        """Measure after teardown; a suspected leak is measured again once what the caller holds is
        let go, then after PyTorch's caches are cleared and every generation collected."""
        assert self.baseline is not None, "finish() before start()"
        result, clock, graphs = finishing.result, finishing.begin_clock, finishing.begin_graphs
        self.read(result, clock, graphs, since=self.baseline)
        if finishing.suspected and finishing.release is not None:
            finishing.release()
            self.read(result, clock, graphs)
        if finishing.suspected and finishing.settle_leaks:
            if finishing.clear_caches:
                clear_torch_caches(_import_torch())
            garbage = self.tracker.settle()["cpu"]
            finishing.settled = True
            if garbage:
                result.details["older_garbage_freed_bytes"] = (
                    result.details.get("older_garbage_freed_bytes", 0) + garbage
                )
            self.read(result, clock, graphs)

    def before_naming(self) -> None:
        """The ledger knows every storage already."""

    def fixture_mark(self) -> int:
        """Where a wider-scoped fixture set up during the check starts: the ledger tells its
        storages apart by themselves (see :meth:`Tracker.adopt`)."""
        return 0

    def fixture_bytes(self, mark: int) -> int:
        return 0

    def cycle_bytes(self, result: CheckResult, *, strict: bool, sites: SiteRecorder | None) -> int:
        """Bytes the body made that were alive as it returned and that only the cycle collector
        freed; with ``strict``, the tensors among them, each with its cycle, go in the result."""
        assert self.baseline is not None
        tracker = self.tracker
        tracker.observe(collect=False, watch=False)
        pending = tracker.created("cpu", since=self.baseline.clock)
        if strict and (pending or self._garbage_from is not None):
            saving_since, self._garbage_from = self._garbage_from, None
            result.cycle_groups = cycle_garbage(pending, saving_since, sites)
        if not pending:  # nothing the body made is alive, in a cycle or otherwise
            return 0
        tracker.observe(watch=False, just_read=True)
        return sum(ref.nbytes for ref in pending if ref() is None)

    def read(self, result: CheckResult, begin_clock: int, graphs: int | None, *, since: Mark | None = None) -> None:
        """Observe (``since`` the baseline, watching older tensors, the first time) and put what
        the ledger says since clock ``begin_clock`` in the result, with the autograd history
        made since ``graphs`` that is kept alive."""
        tracker = self.tracker
        if since is not None:
            tracker.observe(since=since)
        else:
            tracker.observe(watch=False)
        clock = begin_clock - 1  # what function-scoped fixtures made during set-up is the test's
        created = sum(ref.nbytes for ref in tracker.created("cpu", since=clock))
        grown = sum(delta for _, delta in tracker.grown_older("cpu", since=clock))
        freed = tracker.freed_older("cpu", since=clock)
        result.created_bytes = created + grown
        result.freed_older_bytes = freed
        result.end_bytes = tracker.total("cpu")
        result.fixture_bytes = sum(ref.nbytes for ref in tracker.adopted_alive("cpu"))
        result.net_bytes = created + grown - freed
        result.leaked_bytes = max(0, result.net_bytes)
        result.graph = self.kept_graph(graphs)

    def close(self) -> None:
        """The body ended without :meth:`cycle_bytes`: the garbage saved is let go."""
        if self._garbage_from is not None:
            let_go(self._garbage_from)
            self._garbage_from = None

    def step_reading(self, *, generations: int) -> StepReading:
        """After a step of a loop: observe what was made and freed since the last reading (each
        step's observation then reads what that step made), and the bytes of every storage alive."""
        self.step_mark = self.tracker.observe(since=self.step_mark, generations=generations)
        return StepReading(self.tracker.total("cpu"), self.step_mark.graphs)

    def kept_graph(self, since: int | None, before: int | None = None) -> KeptGraph:
        """The history kept through the tensors the ledger read since the test began and the older
        ones changed in place."""
        return self.tracker.kept_graph(threshold=since, before=before)


class AllocatorReadings:
    """What one check, or one step loop, reads of an accelerator's allocator."""

    names_each_storage = False
    """The allocator says how much; which storages, the tracker's index is asked only to name them."""

    def __init__(self, meter: Meter, tracker: Tracker) -> None:
        self.meter = meter
        self.tracker = tracker
        self.at_begin: int | None = None
        """Allocated bytes as set-up started."""
        self.at_start: int | None = None
        """Allocated bytes as the body started."""
        self._driver_at_start: int | None = None
        self._pinned_at_start: int | None = None
        self.others: list[tuple[CudaMeter, int]] = []
        """Every other CUDA device of the process, with its allocated bytes as the body started."""

    def begin(self) -> int:
        """Read allocated bytes as set-up starts."""
        self.at_begin = self.meter.allocated_bytes()
        return self.at_begin

    def start(self, *, keep_garbage: bool) -> None:
        """Read the allocator as the body starts, after pending work is done."""
        meter = self.meter
        meter.settle()
        self.at_start = meter.allocated_bytes()
        if isinstance(meter, CudaMeter):
            self._pinned_at_start = meter.pinned_bytes()
        self._driver_at_start = meter.details().get("driver_used_bytes")
        if isinstance(meter, CudaMeter):
            self.others = _other_devices(meter)

    def stop(self, result: CheckResult, begin_clock: int, *, strict: bool, sites: SiteRecorder | None) -> None:
        """The body returned: what only the cycle collector frees."""
        if self.at_start is not None:
            result.cycle_bytes = self.cycle_bytes()

    def finish(self, finishing: Finishing) -> None:
        """Measure after teardown: a growth past the budget is measured again once what the caller
        holds is let go (and PyTorch's caches cleared), then recorded with what is read beside it."""
        result, budget = finishing.result, finishing.budget
        growth = self.growth(result.fixture_bytes, budget.leak)
        result.graph = self.kept_graph(finishing.begin_graphs)
        if growth.allocated + result.history_bytes > budget.leak:
            if finishing.release is not None:
                finishing.release()
            if finishing.settle_leaks:
                if finishing.clear_caches:
                    clear_torch_caches(_import_torch())
                finishing.settled = True
            growth = self.growth(result.fixture_bytes, budget.leak)
            result.graph = self.kept_graph(finishing.begin_graphs)
        self.record(result, growth, budget)

    def before_naming(self) -> None:
        """The allocator said how much; which storages, the tracker's index says once it catches up."""
        self.tracker.catch_up()

    def fixture_mark(self) -> int:
        """Allocated bytes as a wider-scoped fixture set up during the check starts."""
        return self.meter.allocated_bytes()

    def fixture_bytes(self, mark: int) -> int:
        """What that fixture made: the allocator's growth since ``mark``."""
        return self.meter.allocated_bytes() - mark

    def close(self) -> None:
        """Nothing is held between readings."""

    def step_reading(self, *, generations: int) -> StepReading:
        """After a step of a loop: the allocated bytes once queued work is done, and on CUDA the
        bytes reserved beside them (``generations`` is the ledger's: the allocator counts)."""
        meter = self.meter
        meter.settle()
        allocated = meter.allocated_bytes()
        slack = None
        if isinstance(meter, CudaMeter):
            slack = int(meter.backend.memory_reserved(meter.index)) - allocated
        return StepReading(allocated, graph_clock(_import_torch()), slack)

    def kept_graph(self, since: int | None, before: int | None = None) -> KeptGraph:
        """The history kept through the tensors made since the freeze (the tracker reads none between checks)."""
        return self.tracker.young_graph(since, before=before)

    def cycle_bytes(self) -> int:
        """Bytes the body made that were alive as it returned and that only the cycle collector freed."""
        meter = self.meter
        meter.backend.synchronize(meter.index)  # type: ignore[attr-defined]
        before = meter.allocated_bytes()
        gc.collect()
        meter.backend.synchronize(meter.index)  # type: ignore[attr-defined]
        return max(0, before - meter.allocated_bytes())

    def growth(self, fixture_bytes: int, allowed: int) -> Growth:
        """The growth since set-up started, less what wider-scoped fixtures made meanwhile."""
        assert self.at_begin is not None and self.at_start is not None, "finish() before start()"
        return measure_growth(self.meter, self.at_begin + fixture_bytes, self._driver_at_start, allowed)

    def record(self, result: CheckResult, growth: Growth, budget: Budget) -> None:
        """Put the growth and what was read alongside it in the result."""
        meter = self.meter
        result.net_bytes = growth.allocated
        result.leaked_bytes = max(0, growth.allocated)
        result.end_bytes = meter.allocated_bytes()
        result.details = dict(meter.details())
        if growth.driver is not None:
            result.details["driver_growth_bytes"] = growth.driver
        result.notes += [growth.note(budget.leak), explain_reserved(result.details, result.end_bytes)]
        for other, allocated in self.others:
            other_growth = measure_growth(other, allocated, None, budget.leak)
            result.details[f"{other.name}_leaked_bytes"] = other_growth.allocated
        if not isinstance(meter, CudaMeter):
            return
        pinned = meter.pinned_bytes() if self._pinned_at_start is not None else None
        if pinned is not None and self._pinned_at_start is not None:
            result.details["pinned_host_leaked_bytes"] = pinned - self._pinned_at_start
        for name, value in (
            ("reserved_peak_bytes", meter.reserved_peak),
            ("pinned_host_peak_bytes", meter.pinned_peak),
        ):
            if value is not None:
                result.details[name] = value


def _other_devices(meter: CudaMeter) -> list[tuple[CudaMeter, int]]:
    """Every other CUDA device of the process, warmed up, with its allocated bytes now."""
    others = []
    for index in range(meter.backend.device_count()):
        if index != meter.index:
            other = CudaMeter(f"cuda:{index}", meter.backend, meter.clear_workspaces, meter.warm_up)
            other.settle()
            others.append((other, other.allocated_bytes()))
    return others


def _import_torch() -> Any:
    import torch

    return torch

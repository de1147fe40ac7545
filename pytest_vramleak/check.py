"""One check of a block of code (a test, an epoch): baseline, measurement, verdict and explanation.

The pytest layer runs one :class:`LeakCheck` per checked test: :meth:`~LeakCheck.begin` as its
set-up starts, :meth:`~LeakCheck.start` and :meth:`~LeakCheck.stop` around its body and
:meth:`~LeakCheck.finish` after its teardown. A training script can use it the same way, or as a
context manager::

    from pytest_vramleak import Budget, LeakCheck

    with LeakCheck("auto", Budget(leak=1 << 20)) as check:
        train_one_epoch()
    if check.result.outcome != "passed":
        print(check.result.report())

How much each part costs. Where the device's allocator keeps counters (CUDA, XPU, MPS), the
baseline and the measurement read them, and no tensor is read unless memory grew past the
budget. On CPU each observation reads what the test made and what died (see
:mod:`pytest_vramleak.tracking.tracker`); only a leak pays for naming its holders, a walk of the heap.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .holders.diagnosis import diagnose
from .holders.naming import (
    held_by_pytest_warnings,
    held_by_the_failure,
    held_by_threads,
    held_by_torch_cache,
    held_in_cpp_on_frozen_cycles,
    held_in_cpp_only,
    kept_by_pytest_lists,
    name_storages,
)
from .holders.paths import AUTOCAST_CACHE_PATH, HolderPath, thread_autocast_path
from .holders.referrers import NamedRoot, torch_modes
from .holders.snapshot import TensorGroup, merge_parts, meter_for
from .judging.outcome import CheckFigures, Rules, judge_check
from .judging.sizes import format_size
from .judging.verdict import Budget
from .left_behind import LeftBehind
from .meters.autocast import ThreadRegion
from .meters.devices import CpuMeter, CudaMeter, Meter
from .meters.history import AllocatorHistory
from .readings import Finishing, readings_for
from .result import CheckResult
from .tracking.census import StorageKey
from .tracking.gc_functions import saving_garbage
from .tracking.sites import SiteRecorder, Sites, SiteSource
from .tracking.tracker import StorageRef, Tracker, graph_clock

__all__ = ["CPP_HELD", "CheckResult", "LeakCheck", "NamedLeak", "Rules", "held_in_cpp_only", "name_leak"]


class LeakCheck:
    """Checks one block of code against a :class:`Budget`; see the module docstring."""

    def __init__(
        self,
        device: str | None = "auto",
        budget: Budget | None = None,
        *,
        meter: Meter | None = None,
        tracker: Tracker | None = None,
        rules: Rules | None = None,
        record_sites: bool = False,
        trace_folder: Path | None = None,
        name: str = "check",
        named_roots: Callable[[], Sequence[NamedRoot]] | None = None,
        settle_leaks: bool = True,
        name_leaks: bool = True,
        sites: SiteSource | None = None,
        clear_caches: bool = True,
        body_ended: Callable[[], None] | None = None,
    ) -> None:
        self.meter = meter or meter_for(device)
        self.budget = budget or Budget()
        self.tracker = tracker or Tracker(self.meter.name)
        self.rules = rules or Rules()
        self.name = name
        """What the check is of (a test id): names a saved allocator snapshot."""
        self.named_roots = named_roots
        """Values to name as their owner calls them when they hold a leak (a test's fixtures)."""
        self.result = CheckResult(self.meter.name)
        self.settle_leaks = settle_leaks
        """Confirm a suspected leak with a full collection (and PyTorch's caches cleared) before it is final."""
        self.name_leaks = name_leaks
        """Name the holders of a leak as the check finishes (else :meth:`explain` does, when asked)."""
        self._sites_given = sites
        self._body_ended = body_ended
        """Called first as the body ends (the run recording sites captures them then, and stops tracing)."""
        self.clear_caches = clear_caches
        """Clear PyTorch's own caches (compiled graphs) before confirming a leak. A test run again
        keeps them between runs: cleared, each run would compile anew."""
        self._record_sites = record_sites
        self._trace_folder = trace_folder
        self.sites: SiteRecorder | None = None
        self.history: AllocatorHistory | None = None
        self.begin_clock = 0
        """The tracker's clock as the check began: storages first seen since are the check's."""
        self.begin_graphs: int | None = None
        self.readings = readings_for(self.meter, self.tracker)
        self.left_behind = LeftBehind()
        self._watching_peak = False
        self._threads_before: set[int] = set()
        self.saving_garbage_before = False
        """gc.DEBUG_SAVEALL was on as the check began (turned on before, by someone else)."""
        self.modes_before: set[int] = set()
        """The ids of the modes on torch's stacks as the check began (entered before, and not exited)."""
        self._settled = False
        """Every generation was collected since the body ended (confirming a suspected leak)."""

    # -- the phases -----------------------------------------------------------------------------

    def begin(self) -> None:
        """Set-up starts: from now on, what is made belongs to the check."""
        current = threading.get_ident()
        # By ident, not name: a test run again starts a thread of the same name while the last one runs.
        self._threads_before = {thread.ident for thread in threading.enumerate() if thread.ident not in (current, None)}
        self.saving_garbage_before = saving_garbage()
        self.modes_before = {id(mode) for *_, mode in torch_modes()}
        if not self.tracker.active:
            self.tracker.begin(index=self.readings.names_each_storage)
        self.begin_clock = self.tracker.begin_clock
        self.begin_graphs = self.tracker.begin_graphs
        if self.begin_graphs is None:
            self.begin_graphs = graph_clock(_import_torch())
        self.result.baseline_bytes = self.readings.begin()
        self.left_behind.begin()

    def start(self) -> None:
        """The body starts: take the baseline, start watching the peak."""
        meter = self.meter
        self.readings.start(keep_garbage=self.rules.strict_cycles and self.rules.keep_cycle_garbage)
        peak = self.rules.watch_peak
        if peak is None:  # free where the allocator keeps a peak; on CPU the profiler costs
            peak = self.budget.peak is not None or meter.keeps_counters
        if peak:
            if isinstance(meter, CpuMeter):
                meter.categorize_peak = self.budget.peak is not None
            meter.start_peak()
            self._watching_peak = True
        if self._record_sites and self.readings.names_each_storage and self._sites_given is None:
            self.sites = SiteRecorder()
            self.sites.start()
        if self._trace_folder is not None and isinstance(self.meter, CudaMeter):
            self.history = AllocatorHistory(self.meter.backend.memory, self.meter.index)
            self.history.start()

    def stop(self) -> None:
        """The body returned (or raised): read the peak, what only the cycle collector frees, and
        where the tensors still alive were made."""
        try:
            if self._body_ended is not None:
                self._body_ended()
            self.readings.stop(self.result, self.begin_clock, strict=self.rules.strict_cycles, sites=self.sites)
        finally:
            if self.sites is not None:
                self.sites.stop()  # tracing costs: it covers the body alone
            if self._watching_peak:
                self._watching_peak = False
                self.result.peak_bytes = self.meter.stop_peak()
                if isinstance(self.meter, CpuMeter):
                    self.result.peak_breakdown = self.meter.peak_breakdown

    def finish(self, confirm: Callable[[], None] | None = None, *, settle: bool = False) -> CheckResult:
        """Measure after teardown and decide. ``confirm`` drops what the caller still holds for the
        code checked (pytest's fixture values) before a suspected leak is measured again; ``settle``
        confirms a suspected leak now even where the check was made to leave that to its caller
        (see ``settle_leaks``)."""
        try:
            finishing = Finishing(
                self.result,
                self.budget,
                self.begin_clock,
                self.begin_graphs,
                confirm,
                self.settle_leaks or settle,
                self.clear_caches,
            )
            self.readings.finish(finishing)
            self._settled = self._settled or finishing.settled
            self._apply_rules()
            if self.name_leaks and self.result.outcome == "leaked" and self.result.memory_leaked:
                self.explain()
            elif self.suspected:
                self._save_history()
            return self.result
        finally:
            if self.sites is not None:
                self.sites.stop()
            if self.history is not None:
                self.history.stop()

    def adopt_bytes(self, nbytes: int) -> None:
        """On an accelerator: ``nbytes`` more are a wider-scoped fixture's, set up during the check."""
        self.result.fixture_bytes += nbytes

    @property
    def suspected(self) -> bool:
        """Whether the check found more than its budget left (before it was confirmed): memory,
        or autograd history the checked code made and left alive."""
        result = self.result
        return (result.leaked_bytes or 0) + result.history_bytes > self.budget.leak

    def close(self) -> None:
        """Unfreeze the heap; the check holds nothing of the code it checked."""
        self.readings.close()
        self.left_behind.end()
        if self.sites is not None:
            self.sites.stop()  # what it captured stays known: a test run again names its leak later
        if self.history is not None:
            self.history.stop()
        self.tracker.end()

    def __enter__(self) -> LeakCheck:
        self.begin()
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            self.stop()
            if exc_info[0] is None:
                self.finish()
        finally:
            self.close()

    # -- measuring ------------------------------------------------------------------------------

    def _apply_rules(self) -> None:
        result = self.result
        others = [other.name for other, _ in self.readings.others]
        assert result.leaked_bytes is not None
        figures = CheckFigures(
            result.device,
            result.leaked_bytes,
            result.history_bytes,
            result.graph.nodes if result.graph is not None else 0,
            result.peak_bytes,
            result.created_bytes,
            result.freed_older_bytes,
            result.cycle_bytes,
            result.details,
        )
        judged = judge_check(figures, self.budget, self.rules, other_devices=others)
        result.notes += [note for note in judged.notes if note not in result.notes]
        result.peak_over, result.over_budget = judged.peak_over, judged.over_budget
        result.other_leaks, result.cycles_failed = judged.other_leaks, judged.cycles_failed
        result.memory_leaked = judged.memory_leaked
        messages = list(judged.messages)
        outcome = "leaked" if self.left_behind.judge(result, messages) else judged.outcome
        result.outcome = outcome
        result.message = "; ".join(messages)

    # -- explaining -----------------------------------------------------------------------------

    def leaked_storages(self, device: str) -> list[StorageRef]:
        """The storages that make the leak on ``device``: made since the check began and alive, or older and grown."""
        tracker = self.tracker
        since = self.begin_clock - 1
        return tracker.created(device, since=since) + [ref for ref, _ in tracker.grown_older(device, since=since)]

    def _save_history(self) -> None:
        """Save the allocator's history of a leaking check for PyTorch's memory viewer (once)."""
        if self.history is not None and self._trace_folder is not None and self.result.trace is None:
            path = self.history.save(self._trace_folder, self.name)
            self.result.trace = str(path)
            self.result.notes.append(f"allocator history saved to {path} (open it in https://pytorch.org/memory_viz)")

    def site_source(self) -> SiteSource | None:
        """Where the check's tensors were made, as far as recorded."""
        sources: list[SiteSource] = [source for source in (self._sites_given, self.sites) if source is not None]
        if self.history is not None and self._trace_folder is not None:
            self._save_history()
            sources.append(self.history.sites())
        return Sites(sources) if sources else None

    def explain(self) -> None:
        """Name what holds the leaked tensors and the kept autograd history (a walk of the heap),
        and leave out what is not the checked code's to answer for (see :func:`name_leak`)."""
        result = self.result
        if result.named:
            return
        result.named = True
        sites = self.site_source()
        devices = [result.device] + [
            other.name
            for other, _ in self.readings.others
            if result.details.get(f"{other.name}_leaked_bytes", 0) > self.budget.leak
        ]
        self.readings.before_naming()
        named = self.named_roots() if self.named_roots is not None else ()
        for device in devices:
            main = device == result.device
            refs = self.leaked_storages(device) if not main or (result.leaked_bytes or 0) > 0 else []
            found = name_leak(
                self.tracker,
                device,
                refs,
                result.graph.roots if main and result.graph is not None else [],
                sites=sites,
                named=named,
                collected=self._settled,
                threads_before=self._threads_before,
                count_cpp_held=self.rules.count_cpp_held,
                autocast_open=result.autocast_left,
            )
            if main:
                result.groups = found.groups + found.history
                self._set_aside(found.set_aside, nothing_left=not result.groups)
            else:
                result.other_groups[device] = found.groups

    def _set_aside(self, set_aside: list[tuple[str, list[TensorGroup]]], *, nothing_left: bool = False) -> None:
        """Take out of the leak what :func:`name_leak` found is not the check's (with whose it is,
        as naming found: PyTorch's caches, C++, older threads, a note each), and decide again.
        ``nothing_left``: no tensor is left the check's; then the autograd nodes kept are those of
        the tensors that pytest's records of the test alone hold, where those are among what is set aside."""
        result = self.result
        if not set_aside or result.leaked_bytes is None:
            return
        for holders, groups in set_aside:
            # a group's memory is its tensors' and what their graph saved; a history group's, its nodes
            tensors = [group for group in groups if group.kind != "history"]
            discounted = sum(group.total_bytes for group in tensors)
            nodes = sum(group.nodes for group in groups if group.kind == "history")
            if nothing_left and holders in _PYTESTS_OWN and result.graph is not None:
                nodes = result.graph.nodes  # (a tensor named among the storages gets no history group)
            result.leaked_bytes = max(0, result.leaked_bytes - discounted)
            if result.created_bytes is not None:
                result.created_bytes = max(0, result.created_bytes - discounted)
            if nodes and result.graph is not None:
                result.graph = result.graph._replace(nodes=max(0, result.graph.nodes - nodes))
            result.set_aside.append((holders, groups))
            kept = format_size(discounted) + (f" and {nodes:,} autograd nodes" if nodes else "")
            result.notes.append(f"{kept} {holders}: not counted")
        self._apply_rules()
        if result.outcome != "leaked":
            result.groups = []


def _import_torch() -> Any:
    import torch

    return torch


@dataclass
class NamedLeak:
    """A leak's storages grouped and named: what is the checked code's, its kept autograd history,
    and what is set aside (with whose it is)."""

    groups: list[TensorGroup]
    history: list[TensorGroup]
    set_aside: list[tuple[str, list[TensorGroup]]]
    kept_by_pytest: list[TensorGroup] = field(default_factory=list)
    """Groups (among ``groups``) that only what pytest keeps for the session holds: one per run
    of a test run again (a warning, a record_property value), kept once for a test run once."""


TORCH_CACHES = "held by caches PyTorch keeps itself (compiled graphs and their constants)"
CPP_HELD = (
    "held by PyTorch itself in C++: nothing in Python refers to it, so nothing the test can free "
    "(--vramleak-fail-on=any counts it)"
)
FROZEN_CYCLES_HELD = (
    "made by PyTorch's own code and held on reference cycles that nothing in Python refers to, while the suite had "
    "frozen the heap (gc.freeze()): kept from C++, or garbage frozen with the heap that no collection frees "
    "(--vramleak-fail-on=any counts it)"
)
OLDER_THREADS = "held by threads that were running before the test began"
PYTEST_WARNINGS_KEPT = (
    "held only by the warnings pytest recorded, which it keeps with their arguments for the warnings summary "
    "(warn with a string, f'{t.shape}', to let the tensor go)"
)
FAILURE_KEPT = (
    "held only by the frames of the test's own failure, kept with its traceback (by pytest, or a plugin such as "
    "pytest-rerunfailures, which keeps a failure's traceback on the test item)"
)


_PYTESTS_OWN = (FAILURE_KEPT, PYTEST_WARNINGS_KEPT)
"""What pytest keeps of a test (its failure's frames, the warnings it recorded): the autograd history
only they keep is set aside with the tensors."""


def _held_by_the_autocast_cache(groups: list[TensorGroup], path: HolderPath = AUTOCAST_CACHE_PATH) -> None:
    """Name the groups C++ alone holds as held by an open autocast region's cast cache."""
    for group in groups:
        if group.held_from_cpp_alone:
            group.holders = [path]
            group.diagnoses = diagnose(group)


def _thread_caching(groups: list[TensorGroup], regions: Sequence[ThreadRegion]) -> ThreadRegion | None:
    """The autocast region open in another thread that may cache what C++ alone holds, if one is:
    where that is parameters (a cast's grad_fn keeps its weight), or casts of the region's dtype."""
    held = [group for group in groups if group.held_from_cpp_alone]
    weights = any(group.cls == "Parameter" for group in held)
    return next((region for region in regions if weights or any(g.dtype == region.dtype for g in held)), None)


def _named_as_autocast_caches(
    groups: list[TensorGroup], autocast_open: bool, thread_regions: Sequence[ThreadRegion]
) -> bool:
    """Name what C++ alone holds as an open autocast region's cast cache, where one may hold it:
    whether it was (and is counted as the test's)."""
    if autocast_open:  # what C++ alone holds is most likely the open region's cast cache: the test's
        _held_by_the_autocast_cache(groups)
        return True
    caching = _thread_caching(groups, thread_regions)
    if caching is None:
        return False
    # another thread's region caches the casts of what the test gave it
    _held_by_the_autocast_cache(groups, thread_autocast_path(caching.thread, caching.thread_id, caching.function))
    return True


def groups_held(
    groups: Sequence[TensorGroup], held: Callable[[TensorGroup], bool], *, parted: bool
) -> list[TensorGroup]:
    """The groups ``held`` says a keeper holds; ``parted``: the groups are the parts of a test run
    again (see :func:`~pytest_vramleak.holders.snapshot.describe`), each decided on its parts joined
    (:func:`~pytest_vramleak.holders.snapshot.merge_parts`) and given as those parts."""
    if not parted:
        return [group for group in groups if held(group)]
    return [piece for whole in merge_parts(groups) if held(whole) for piece in whole.parts]


def name_leak(
    tracker: Tracker,
    device: str,
    refs: Sequence[StorageRef],
    graph_roots: Sequence[tuple[Any, int]],
    *,
    sites: SiteSource | None,
    named: Sequence[NamedRoot],
    collected: bool,
    threads_before: set[int],
    count_cpp_held: bool,
    part: Callable[[StorageKey], Any] | None = None,
    autocast_open: bool = False,
    thread_regions: Sequence[ThreadRegion] = (),
) -> NamedLeak:
    """Group and name ``refs`` (storages) and the tensors in ``graph_roots`` (weak references with
    the autograd nodes each keeps) (see :func:`~pytest_vramleak.holders.naming.name_storages`), and
    set aside what no test is charged for: what only PyTorch's own caches hold, what nothing in
    Python reaches (held by PyTorch in C++; unless ``count_cpp_held``), what only threads
    running since before the check hold, what only the frames of the test's own failure hold
    (given among ``named``, with the root kind ``failure``), and what only the warnings pytest
    recorded hold. With ``autocast_open`` (the check left an autocast region open), what C++ alone
    holds is named as the region's cast cache, and counted; so it is where one of ``thread_regions``
    (autocast regions open in other threads) has its casts among it.

    With ``part`` (see :func:`~pytest_vramleak.holders.snapshot.describe`), the groups are those of each
    part, and what is set aside is decided on the parts joined."""
    groups, history = name_storages(
        tracker, device, refs, graph_roots, sites=sites, named=named, collected=collected, part=part
    )
    count_cpp_held = _named_as_autocast_caches(groups, autocast_open, thread_regions) or count_cpp_held
    keepers: list[tuple[str, Callable[[TensorGroup], bool]]] = [
        (TORCH_CACHES, held_by_torch_cache),
        (FAILURE_KEPT, held_by_the_failure),
        (PYTEST_WARNINGS_KEPT, held_by_pytest_warnings),
    ]
    if not count_cpp_held:
        keepers.append((FROZEN_CYCLES_HELD, held_in_cpp_on_frozen_cycles))
        keepers.append((CPP_HELD, held_in_cpp_only))
    if threads_before:
        keepers.append((OLDER_THREADS, lambda group: held_by_threads(group, threads_before)))
    set_aside = []
    for holders, predicate in keepers:
        matched = groups_held(groups, predicate, parted=part is not None)
        # the autograd history that only pytest's records of the test hold goes with them
        kept_history = (
            [group for group in history if group.holders and predicate(group)] if holders in _PYTESTS_OWN else []
        )
        if matched or kept_history:
            set_aside.append((holders, matched + kept_history))
            groups = [group for group in groups if group not in matched]
            history = [group for group in history if group not in kept_history]
    # pytest's lists that gain an entry with every run: record_property values, recorded warnings
    kept_by_pytest = [group for group in groups if kept_by_pytest_lists(group)]
    return NamedLeak(groups, history, set_aside, kept_by_pytest)

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
:mod:`pytest_vramleak.tracker`); only a leak pays for naming its holders, a walk of the heap.
"""

from __future__ import annotations

import gc
import itertools
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .devices import CpuMeter, CudaMeter, Meter, clear_torch_caches, explain_reserved, measure_growth
from .diagnosis import held_by_torch_cache
from .history import AllocatorHistory
from .peaks import PeakBreakdown
from .processes import Children, ProcessGroups, describe_children, describe_groups
from .rank_reports import RANKS_ENV, collect, describe as describe_ranks
from .referrers import NamedRoot
from .report import render_groups
from .sizes import format_size
from .sites import SiteRecorder, Sites, SiteSource
from .census import StorageKey, storage_key
from .snapshot import HELD_FROM_CPP, TensorGroup, describe, describe_cycle_garbage, describe_history, merge_parts, meter_for
from .tracker import NODE_BYTES, KeptGraph, Mark, StorageRef, Tracker
from .verdict import Budget, Increase, judge_budget, judge_increase


_CHECKS = itertools.count()


@dataclass(frozen=True)
class Rules:
    """What a check enforces beyond its budget."""

    strict_cycles: bool = False
    """Fail memory that only the cycle collector freed (past the leak budget), as a leak."""
    saved_peak: int | None = None
    """The peak of an earlier run to compare with; growth past ``max_increase`` fails."""
    max_increase: Increase = Increase()
    watch_peak: bool | None = None
    """Measure the peak: None measures it where a budget asks for one or where it is free."""
    count_cpp_held: bool = False
    """Count memory that nothing in Python refers to (held by PyTorch itself in C++, nothing the
    checked code can free) as a leak, rather than naming it and leaving it out."""
    keep_cycle_garbage: bool = False
    """With ``strict_cycles``: keep what collections during the body free (``gc.DEBUG_SAVEALL``)
    until the body ends, so that every cycle it left is named (a run recording where tensors are
    made allocates more, and collects sooner); the garbage is let go as the body ends."""


@dataclass
class CheckResult:
    """What a check measured and decided. Sizes not measured are None."""

    device: str
    outcome: str = "passed"
    """``passed``, ``leaked`` or ``over_budget``."""
    message: str = ""
    """One sentence per broken rule, or empty."""
    baseline_bytes: int | None = None
    """Memory in use as the check began (before a test's set-up)."""
    end_bytes: int | None = None
    leaked_bytes: int | None = None
    """What the checked code left: bytes of storages it made that are alive, plus older storages'
    growth in place, less older storages it freed (never below 0); on accelerators, the
    allocator's growth less what fixtures of a wider scope made meanwhile."""
    net_bytes: int | None = None
    """The same before the floor at 0: negative where the code freed more older memory than it kept."""
    fixture_bytes: int = 0
    """Memory that fixtures of a wider scope, set up meanwhile, made and still hold: theirs."""
    graph: KeptGraph | None = None
    """Autograd nodes the checked code made that tensors alive after it keep (its history)."""
    created_bytes: int | None = None
    """On CPU: bytes of storages made during the check and still alive (what the groups list)."""
    freed_older_bytes: int | None = None
    """On CPU: bytes of older storages the check freed, which offset what it created."""
    peak_bytes: int | None = None
    peak_breakdown: PeakBreakdown | None = None
    """On CPU, for a test with a peak budget: what filled the memory at the peak, by kind."""
    peak_over: bool = False
    """Whether the peak passed its budget (the breakdown is then part of the report)."""
    left_behind: list[str] = field(default_factory=list)
    """Process groups and child processes the check's code left alive, one block each."""
    memory_leaked: bool = False
    """Whether memory (not only process groups or children) is what leaked."""
    over_budget: bool = False
    """Whether a budget other than the leak's was passed: the peak, reserved or pinned memory, the saved run's peak."""
    other_leaks: bool = False
    """Whether memory that runs again do not classify leaked: pinned host memory, another device,
    memory left to the cycle collector (--vramleak-strict-cycles)."""
    ranks: list[dict[str, Any]] = field(default_factory=list)
    """What each rank process reported through :func:`~pytest_vramleak.ranks.watch_rank`."""
    cycle_bytes: int | None = None
    cycle_groups: list[TensorGroup] = field(default_factory=list)
    """With ``strict_cycles``: the tensors only the cycle collector freed, each with its cycle."""
    cycles_failed: bool = False
    details: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    """Lines that explain the figures (the driver's view, reserved memory)."""
    groups: list[TensorGroup] = field(default_factory=list)
    """The leaked tensors, grouped, with their holders: only for a leak."""
    other_groups: dict[str, list[TensorGroup]] = field(default_factory=dict)
    """Leaked tensors on the process's other CUDA devices, by device."""
    trace: str | None = None
    set_aside: list[tuple[str, list[TensorGroup]]] = field(default_factory=list)
    """What the leak did not count, and why: held only by PyTorch's own caches or in C++, or by
    threads older than the check (see :func:`name_leak`)."""
    named: bool = False
    """Whether the leaked tensors were looked for and their holders named (see :meth:`LeakCheck.explain`)."""

    @property
    def history_bytes(self) -> int:
        """The estimated host memory of the kept autograd history."""
        return self.graph.estimated_bytes if self.graph is not None else 0

    def figures(self) -> str:
        """One line: memory before and after, what made the difference, the peak, and reserved
        memory where there is some. Its terms add up: after = before + kept + fixtures' - garbage."""

        def size(value: int | None) -> str:
            return "not measured" if value is None else format_size(value)

        text = f"before set-up {size(self.baseline_bytes)}, after teardown {size(self.end_bytes)}"
        terms = []
        net = self.net_bytes if self.net_bytes is not None else self.leaked_bytes
        if net:
            terms.append(f"the test kept {format_size(net)}" if net > 0 else f"the test freed {format_size(-net)} of older memory")
        if self.fixture_bytes:
            terms.append(f"fixtures of a wider scope set up meanwhile hold {format_size(self.fixture_bytes)}")
        garbage = self.details.get("older_garbage_freed_bytes", 0)
        if garbage:
            terms.append(f"a full collection freed {format_size(garbage)} of older garbage")
        if terms:
            text += " (" + "; ".join(terms) + ")"
        text += f", peak during the call {size(self.peak_bytes)}"
        if "reserved_bytes" in self.details:
            text += f", reserved by the caching allocator {format_size(self.details['reserved_bytes'])}"
        return text

    def report(self) -> str:
        """The failure text: the sentence, the figures, the notes and the leaked tensors."""
        lines = [self.message, self.figures(), *self.notes]
        if self.peak_over and self.peak_breakdown is not None:
            lines.append(self.peak_breakdown.render())
        lines += self.left_behind
        if self.cycles_failed:
            lines += ["tensors freed only by the cycle collector:", render_groups(self.cycle_groups)]
        if self.outcome == "leaked" and self.memory_leaked and self.named and (self.groups or not self.cycles_failed):
            lines += ["leaked tensors:", render_groups(self.groups)]
            for device, groups in self.other_groups.items():
                lines += [f"leaked tensors on {device}:", render_groups(groups)]
        return "\n".join(line for line in lines if line)


class LeakCheck:
    """Checks one block of code against a :class:`Budget`; see the module docstring."""

    def __init__(
        self,
        device: str | None = "auto",
        budget: Budget | None = None,
        *,
        meter: Meter | None = None,
        tracker: Tracker | None = None,
        rules: Rules = Rules(),
        record_sites: bool = False,
        trace_folder: Path | None = None,
        name: str = "check",
        named_roots: Callable[[], Sequence[NamedRoot]] | None = None,
        settle_leaks: bool = True,
        name_leaks: bool = True,
        sites: SiteSource | None = None,
        clear_caches: bool = True,
    ) -> None:
        self.meter = meter or meter_for(device)
        self.budget = budget or Budget()
        self.tracker = tracker or Tracker(self.meter.name)
        self.rules = rules
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
        self.clear_caches = clear_caches
        """Clear PyTorch's own caches (compiled graphs) before confirming a leak. A test run again
        keeps them between runs: cleared, each run would compile anew."""
        self._record_sites = record_sites
        self._trace_folder = trace_folder
        self.sites: SiteRecorder | None = None
        self._garbage_from: int | None = None
        """Where in ``gc.garbage`` what collections saved since the body began starts (keep_cycle_garbage)."""
        self.history: AllocatorHistory | None = None
        self._baseline: Mark | None = None
        self.begin_clock = 0
        """The tracker's clock as the check began: storages first seen since are the check's."""
        self.begin_graphs: int | None = None
        self._allocated_at_begin: int | None = None
        self._allocated_at_start: int | None = None
        self._accelerator_clock = 0
        """On an accelerator, the tracker's clock when the body started: what it makes is seen later."""
        self._driver_at_start: int | None = None
        self._pinned_at_start: int | None = None
        self.process_groups = ProcessGroups()
        self.children = Children()
        self._ranks_folder: Path | None = None
        self._ranks_env_before: str | None = None
        self._others: list[tuple[CudaMeter, int]] = []
        self._watching_peak = False
        self._owns_tracker = tracker is None
        self._threads_before: set[str] = set()
        self._settled = False
        """Every generation was collected since the body ended (confirming a suspected leak)."""

    # -- the phases -----------------------------------------------------------------------------

    @property
    def on_cpu(self) -> bool:
        return self.meter.name == "cpu"

    def begin(self) -> None:
        """Set-up starts: from now on, what is made belongs to the check."""
        current = threading.get_ident()
        self._threads_before = {thread.name for thread in threading.enumerate() if thread.ident != current}
        if not self.tracker.active:
            self.tracker.begin(index=self.on_cpu)
        self.begin_clock = self.tracker.begin_clock
        self.begin_graphs = self.tracker.begin_graphs
        if self.begin_graphs is None:
            from .tracker import graph_clock

            self.begin_graphs = graph_clock(_import_torch())
        if self.on_cpu:
            self.result.baseline_bytes = self.tracker.total("cpu")
        else:
            self._accelerator_clock = self.begin_clock - 1
            self._allocated_at_begin = self.result.baseline_bytes = self.meter.allocated_bytes()
        self.process_groups.begin()
        self.children.begin()
        # Rank processes started from here on inherit where to report (see pytest_vramleak.ranks).
        self._ranks_folder = Path(tempfile.gettempdir()) / f"vramleak-ranks-{os.getpid()}-{next(_CHECKS)}"  # made by the first rank
        self._ranks_env_before = os.environ.get(RANKS_ENV)
        os.environ[RANKS_ENV] = str(self._ranks_folder)

    def start(self) -> None:
        """The body starts: take the baseline, start watching the peak."""
        meter = self.meter
        if self.on_cpu:
            self._baseline = self.tracker.observe()
            self.tracker.freeze_young()  # what set-up made is read again only where it changes
        else:
            meter.settle()
            self._allocated_at_start = meter.allocated_bytes()
            if isinstance(meter, CudaMeter):
                self._pinned_at_start = meter.pinned_bytes()
            details = meter.details()
            self._driver_at_start = details.get("driver_used_bytes")
            if isinstance(meter, CudaMeter):
                self._others = self._other_devices(meter)
        if self.rules.strict_cycles and self.rules.keep_cycle_garbage and self.on_cpu and not gc.get_debug() & gc.DEBUG_SAVEALL:
            self._garbage_from = len(gc.garbage)
            gc.set_debug(gc.get_debug() | gc.DEBUG_SAVEALL)
        peak = self.rules.watch_peak
        if peak is None:
            peak = self.budget.peak is not None or not self.on_cpu
        if peak:
            if isinstance(meter, CpuMeter):
                meter.categorize_peak = self.budget.peak is not None
            meter.start_peak()
            self._watching_peak = True
        if self._record_sites and self.on_cpu and self._sites_given is None:
            self.sites = SiteRecorder()
            self.sites.start()
        if self._trace_folder is not None and isinstance(self.meter, CudaMeter):
            self.history = AllocatorHistory(self.meter.backend.memory, self.meter.index)
            self.history.start()

    def stop(self) -> None:
        """The body returned (or raised): read the peak, what only the cycle collector frees, and
        where the tensors still alive were made."""
        try:
            if self._baseline is not None or self._allocated_at_start is not None:
                self.result.cycle_bytes = self._cycle_bytes()
            if self.sites is not None and self._baseline is not None:
                self.sites.capture(self.tracker.pairs(self.tracker.created("cpu", since=self.begin_clock - 1)))
        finally:
            if self.sites is not None:
                self.sites.stop()  # tracing costs: it covers the body alone
            if self._watching_peak:
                self._watching_peak = False
                self.result.peak_bytes = self.meter.stop_peak()
                if isinstance(self.meter, CpuMeter):
                    self.result.peak_breakdown = self.meter.peak_breakdown

    def finish(self, confirm: Callable[[], None] | None = None) -> CheckResult:
        """Measure after teardown and decide. ``confirm`` drops what the caller still holds for the
        code checked (pytest's fixture values) before a suspected leak is measured again."""
        try:
            if self.on_cpu:
                self._finish_cpu(confirm)
            else:
                self._finish_accelerator(confirm)
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
        if self._garbage_from is not None:  # the body ended without stop(): the garbage saved is let go
            gc.set_debug(gc.get_debug() & ~gc.DEBUG_SAVEALL)
            del gc.garbage[self._garbage_from :]
            self._garbage_from = None
        self.process_groups.end()
        if self._ranks_folder is not None:
            if self._ranks_env_before is None:
                os.environ.pop(RANKS_ENV, None)
            else:
                os.environ[RANKS_ENV] = self._ranks_env_before
            shutil.rmtree(self._ranks_folder, ignore_errors=True)
            self._ranks_folder = None
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

    def _cycle_bytes(self) -> int:
        """Bytes the body made that were alive as it returned and that only the cycle collector freed."""
        if not self.on_cpu:
            self.meter.backend.synchronize(self.meter.index)  # type: ignore[attr-defined]
            before = self.meter.allocated_bytes()
            gc.collect()
            self.meter.backend.synchronize(self.meter.index)  # type: ignore[attr-defined]
            return max(0, before - self.meter.allocated_bytes())
        assert self._baseline is not None
        self.tracker.observe(collect=False, watch=False)
        pending = self.tracker.created("cpu", since=self._baseline.clock)
        if self.rules.strict_cycles and (pending or self._garbage_from is not None):
            self.result.cycle_groups = self._cycle_garbage(pending)
        if not pending:  # nothing the body made is alive, in a cycle or otherwise
            return 0
        self.tracker.observe(watch=False)
        return sum(ref.nbytes for ref in pending if ref() is None)

    def _cycle_garbage(self, pending: list[StorageRef]) -> list[TensorGroup]:
        """What only the cycle collector frees of ``pending``, each tensor with its cycle: one
        collection keeps its garbage (``gc.DEBUG_SAVEALL``) to be read, then lets it go."""
        flags, kept = gc.get_debug(), len(gc.garbage)
        saving_since = self._garbage_from
        if saving_since is not None:  # saved since the body began (keep_cycle_garbage)
            self._garbage_from, kept, flags = None, saving_since, flags & ~gc.DEBUG_SAVEALL
        elif flags & gc.DEBUG_SAVEALL:
            return []  # the user's own debugging saves the garbage: it is theirs to read
        gc.set_debug(flags | gc.DEBUG_SAVEALL)
        try:
            gc.collect()
        finally:
            gc.set_debug(flags)
        garbage = gc.garbage[kept:]
        del gc.garbage[kept:]  # (what the user's own debugging saved there before stays)
        try:
            # (what collections saved during the body is named whole: its storages died to the tracker)
            keys = {(ref.device, ref.pointer) for ref in pending} if saving_since is None else None
            return describe_cycle_garbage(garbage, keys, sites=self.sites or SiteRecorder())
        except Exception:  # naming is an aid: the figures stand without it
            return []
        finally:
            garbage.clear()

    def _cpu_ledger(self) -> int:
        tracker = self.tracker
        since = self.begin_clock - 1  # what function-scoped fixtures made during set-up is the test's
        created = sum(ref.nbytes for ref in tracker.created("cpu", since=since))
        grown = sum(delta for _, delta in tracker.grown_older("cpu", since=since))
        freed = tracker.freed_older("cpu", since=since)
        result = self.result
        result.created_bytes = created + grown
        result.freed_older_bytes = freed
        result.end_bytes = tracker.total("cpu")
        result.fixture_bytes = sum(ref.nbytes for ref in tracker.adopted_alive("cpu"))
        result.net_bytes = created + grown - freed
        result.leaked_bytes = max(0, result.net_bytes)
        return result.leaked_bytes

    def _finish_cpu(self, confirm: Callable[[], None] | None) -> None:
        assert self._baseline is not None, "finish() before start()"
        tracker = self.tracker
        tracker.observe(since=self._baseline)
        self._cpu_ledger()
        self.result.graph = tracker.kept_graph(threshold=self.begin_graphs)
        if not self.suspected:
            return
        if confirm is not None:  # what pytest still holds of the test's fixtures goes first: cheap
            confirm()
            tracker.observe(watch=False)
            self._cpu_ledger()
            self.result.graph = tracker.kept_graph(threshold=self.begin_graphs)
        if self.suspected and self.settle_leaks:
            self._confirm()
            tracker.observe(watch=False)
            self._cpu_ledger()
            self.result.graph = tracker.kept_graph(threshold=self.begin_graphs)

    def _confirm(self) -> None:
        """Before a suspected leak is final: drop what PyTorch caches for itself (as its own check
        does), and cycles that outlived an observation."""
        if self.clear_caches:
            clear_torch_caches(_import_torch())
        garbage = self.tracker.settle()[self.meter.name]
        self._settled = True
        if garbage:
            self.result.details["older_garbage_freed_bytes"] = self.result.details.get("older_garbage_freed_bytes", 0) + garbage

    def _finish_accelerator(self, confirm: Callable[[], None] | None) -> None:
        meter, budget, result = self.meter, self.budget, self.result
        assert self._allocated_at_begin is not None and self._allocated_at_start is not None, "finish() before start()"
        baseline = self._allocated_at_begin + result.fixture_bytes
        growth = measure_growth(meter, baseline, self._driver_at_start, budget.leak)
        result.graph = self.tracker.young_graph(self.begin_graphs)
        if growth.allocated + result.history_bytes > budget.leak:
            if confirm is not None:
                confirm()
            if self.settle_leaks:
                if self.clear_caches:
                    clear_torch_caches(_import_torch())
                self._settled = True
            growth = measure_growth(meter, baseline, self._driver_at_start, budget.leak)
            result.graph = self.tracker.young_graph(self.begin_graphs)
        result.net_bytes = growth.allocated
        result.leaked_bytes = max(0, growth.allocated)
        result.end_bytes = meter.allocated_bytes()
        result.details = dict(meter.details())
        if growth.driver is not None:
            result.details["driver_growth_bytes"] = growth.driver
        result.notes += [growth.note(budget.leak), explain_reserved(result.details, result.end_bytes)]
        for other, allocated in self._others:
            other_growth = measure_growth(other, allocated, None, budget.leak)
            result.details[f"{other.name}_leaked_bytes"] = other_growth.allocated
        pinned = meter.pinned_bytes() if isinstance(meter, CudaMeter) and self._pinned_at_start is not None else None
        if pinned is not None and self._pinned_at_start is not None:
            result.details["pinned_host_leaked_bytes"] = pinned - self._pinned_at_start
        if isinstance(meter, CudaMeter):
            for name, value in (("reserved_peak_bytes", meter.reserved_peak), ("pinned_host_peak_bytes", meter.pinned_peak)):
                if value is not None:
                    result.details[name] = value

    def _apply_rules(self) -> None:
        result, budget, rules = self.result, self.budget, self.rules
        assert result.leaked_bytes is not None
        result.left_behind = []
        result.over_budget = result.other_leaks = False
        history = result.history_bytes
        verdict = judge_budget(budget, result.device, result.leaked_bytes + history, result.peak_bytes)
        result.peak_over = budget.peak is not None and result.peak_bytes is not None and result.peak_bytes > budget.peak
        messages = [verdict.message] if verdict.message else []
        if verdict.outcome == "leaked" and history and result.graph is not None:
            kept = f"the autograd history of {result.graph.nodes:,} nodes the test made (about {format_size(history)} of host memory)"
            allowed = f"allowed {format_size(budget.leak)}"
            found = f"leaked {format_size(result.leaked_bytes + history)} on {result.device}, {allowed}"
            if result.leaked_bytes:
                messages[0] = messages[0].replace(found, f"leaked {format_size(result.leaked_bytes)} on {result.device}, {allowed}, and kept {kept}", 1)
            else:
                messages[0] = messages[0].replace(found, f"kept {kept} on {result.device}, {allowed}", 1)
        if self.on_cpu and verdict.outcome == "leaked" and result.freed_older_bytes and result.leaked_bytes:
            messages[0] += (
                f" ({format_size(result.created_bytes or 0)} made and still alive, "
                f"{format_size(result.freed_older_bytes)} of older memory freed)"
            )
        outcome = verdict.outcome
        result.over_budget = result.peak_over
        pinned_leak = result.details.get("pinned_host_leaked_bytes", 0)
        if pinned_leak > budget.leak:
            outcome = "leaked"
            result.other_leaks = True
            messages.append(
                f"leaked {format_size(pinned_leak)} of pinned host memory (torch.cuda.host_memory_stats), allowed {format_size(budget.leak)}: "
                "pinned buffers kept alive (a pin_memory() copy stored somewhere, a DataLoader with pin_memory=True whose iterator lives on)"
            )
        for name, limit, what in (
            ("reserved_peak_bytes", budget.reserved, "memory reserved by the caching allocator"),
            ("pinned_host_peak_bytes", budget.pinned, "pinned host memory"),
        ):
            if limit is None:
                continue
            used = result.details.get(name)
            if used is None:
                note = f"the budget for {what} was not checked: {result.device} keeps no statistics of it"
                if note not in result.notes:
                    result.notes.append(note)
            elif used > limit:
                result.over_budget = True
                outcome = outcome if outcome == "leaked" else "over_budget"
                messages.append(f"{what} peaked at {format_size(used)} above its level at the start on {result.device}, allowed {format_size(limit)}")
        for other, _ in self._others:
            grew = result.details.get(f"{other.name}_leaked_bytes", 0)
            if grew > budget.leak:
                outcome = "leaked"
                result.other_leaks = True
                messages.append(f"leaked {format_size(grew)} on {other.name}, allowed {format_size(budget.leak)}")
        if rules.saved_peak is not None and result.peak_bytes is not None:
            grew_text = judge_increase(rules.saved_peak, result.peak_bytes, rules.max_increase, result.device)
            if grew_text:
                result.over_budget = True
                outcome = outcome if outcome == "leaked" else "over_budget"
                messages.append(grew_text)
        if rules.strict_cycles and (result.cycle_bytes or 0) > budget.leak:
            outcome = "leaked"
            result.other_leaks = result.cycles_failed = True
            messages.append(
                f"left {format_size(result.cycle_bytes or 0)} on {result.device} to the cycle collector, allowed "
                f"{format_size(budget.leak)} (--vramleak-strict-cycles): break the reference cycle, e.g. with weakref"
            )
        result.memory_leaked = outcome == "leaked"
        groups, children = self.process_groups.left(), self.children.left()
        if groups:
            outcome = "leaked"
            messages.append(f"left {len(groups)} torch.distributed process group(s) alive")
            result.left_behind.append(describe_groups(groups))
            result.details["process_groups_left"] = len(groups)
        if children:
            outcome = "leaked"
            messages.append(f"left {len(children)} child process(es) running")
            result.left_behind.append(describe_children(children))
            result.details["child_processes_left"] = len(children)
        if self._ranks_folder is not None:
            result.ranks = collect(self._ranks_folder)
            line, text = describe_ranks(result.ranks)
            if line:
                outcome = "leaked"
                messages.append(line)
                result.left_behind.append(text)
        result.outcome = outcome
        result.message = "; ".join(messages)

    # -- explaining -----------------------------------------------------------------------------

    def leaked_storages(self, device: str) -> list[StorageRef]:
        """The storages that make the leak on ``device``: made since the check began and alive, or older and grown."""
        tracker = self.tracker
        since = self.begin_clock - 1 if self.on_cpu else self._accelerator_clock
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
            other.name for other, _ in self._others if result.details.get(f"{other.name}_leaked_bytes", 0) > self.budget.leak
        ]
        if not self.on_cpu:
            self.tracker.catch_up()  # the allocator said how much; which storages, the index says
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
            )
            if main:
                result.groups = found.groups + found.history
                self._set_aside(found.set_aside)
            else:
                result.other_groups[device] = found.groups

    def _set_aside(self, set_aside: list[tuple[str, list[TensorGroup]]]) -> None:
        """Take out of the leak what :func:`name_leak` found is not the check's, and decide again."""
        result = self.result
        if not set_aside or result.leaked_bytes is None:
            return
        for holders, groups in set_aside:
            discounted = sum(group.bytes for group in groups)
            result.leaked_bytes = max(0, result.leaked_bytes - discounted)
            if result.created_bytes is not None:
                result.created_bytes = max(0, result.created_bytes - discounted)
            result.set_aside.append((holders, groups))
            result.notes.append(f"{format_size(discounted)} {holders}: not counted")
        self._apply_rules()
        if result.outcome != "leaked":
            result.groups = []

    def _other_devices(self, meter: CudaMeter) -> list[tuple[CudaMeter, int]]:
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
OLDER_THREADS = "held by threads that were running before the test began"


def held_in_cpp_only(group: TensorGroup) -> bool:
    """Whether PyTorch itself keeps the group: nothing Python can reach holds it (no Python
    reference, no autograd node Python holds), and torch made it: a storage object kept without a
    tensor (torch makes those as it traces, scripts or converts), or tensors the recorded run saw
    torch's own code make. Tensors the user's code made that torch keeps for it (a scripted
    module's attributes, kept each time it is scripted), or whose maker is not known, stay the
    test's."""
    if group.kind not in ("tensor", "grad", "storage") or not group.held_by or not all(chain == HELD_FROM_CPP for chain in group.held_by):
        return False
    return group.kind == "storage" or group.made_inside_library is True


def name_leak(
    tracker: Tracker,
    device: str,
    refs: Sequence[StorageRef],
    graph_roots: Sequence[tuple[Any, int]],
    *,
    sites: SiteSource | None,
    named: Sequence[NamedRoot],
    collected: bool,
    threads_before: set[str],
    count_cpp_held: bool,
    part: Callable[[StorageKey], Any] | None = None,
) -> NamedLeak:
    """Group and name ``refs`` (storages) and the tensors in ``graph_roots`` (weak references with
    the autograd nodes each keeps), and set aside what no test is charged for: what only PyTorch's
    own caches hold, what nothing in Python reaches (held by PyTorch in C++; unless
    ``count_cpp_held``), and what only threads running since before the check hold.

    With ``part`` (see :func:`~pytest_vramleak.snapshot.describe`), the groups are those of each
    part, and what is set aside is decided on the parts joined."""
    keys = [(ref.device, ref.pointer) for ref in refs if ref() is not None]
    wanted = set(keys)
    roots = [(tensor, nodes) for tensor, nodes in ((ref(), nodes) for ref, nodes in graph_roots) if tensor is not None]
    # A kept tensor named among the leaked ones already says it keeps its graph (its saved tensors).
    roots = [(tensor, nodes) for tensor, nodes in roots if not (storage_key(tensor) or ((None, 0), 0))[0] in wanted]
    try:
        with tracker.unfrozen():
            groups = describe(keys, device, sites=sites, named=named, collected=collected, part=part) if keys else []
            history = describe_history(roots, device, node_bytes=NODE_BYTES, named=named, collect=False) if roots else []
    finally:
        roots.clear()
    threads = tuple(f"thread '{name}' " for name in threads_before)
    keepers: list[tuple[str, Callable[[TensorGroup], bool]]] = [(TORCH_CACHES, held_by_torch_cache)]
    if not count_cpp_held:
        keepers.append((CPP_HELD, held_in_cpp_only))
    if threads:
        keepers.append((OLDER_THREADS, lambda group: bool(group.held_by) and all(chain.startswith(threads) for chain in group.held_by)))
    set_aside = []
    for holders, predicate in keepers:
        if part is None:
            matched = [group for group in groups if predicate(group)]
        else:
            matched = [piece for whole in merge_parts(groups) if predicate(whole) for piece in whole.parts]
        if matched:
            set_aside.append((holders, matched))
            groups = [group for group in groups if group not in matched]
    # pytest's lists that gain an entry with every run: record_property values, recorded warnings
    labels = tuple(root.label for root in named if root.kind == "pytest" and type(root.value) is list)
    kept_by_pytest = [group for group in groups if labels and group.held_by and all(chain.startswith(labels) for chain in group.held_by)]
    return NamedLeak(groups, history, set_aside, kept_by_pytest)

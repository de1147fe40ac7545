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
from .ranks import RANKS_ENV, collect, describe as describe_ranks
from .referrers import NamedRoot
from .report import render_groups
from .sizes import format_size
from .sites import SiteRecorder, Sites, SiteSource
from .snapshot import TensorGroup, describe, meter_for
from .tracker import Mark, StorageRef, Tracker
from .verdict import Budget, BudgetVerdict, Increase, judge_budget, judge_increase


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


@dataclass
class CheckResult:
    """What a check measured and decided. Sizes not measured are None."""

    device: str
    outcome: str = "passed"
    """``passed``, ``leaked`` or ``over_budget``."""
    message: str = ""
    """One sentence per broken rule, or empty."""
    baseline_bytes: int | None = None
    end_bytes: int | None = None
    leaked_bytes: int | None = None
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
    ranks: list[dict[str, Any]] = field(default_factory=list)
    """What each rank process reported through :func:`~pytest_vramleak.ranks.watch_rank`."""
    cycle_bytes: int | None = None
    details: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    """Lines that explain the figures (the driver's view, reserved memory)."""
    groups: list[TensorGroup] = field(default_factory=list)
    """The leaked tensors, grouped, with their holders: only for a leak."""
    other_groups: dict[str, list[TensorGroup]] = field(default_factory=dict)
    """Leaked tensors on the process's other CUDA devices, by device."""
    trace: str | None = None

    def figures(self) -> str:
        """One line: baseline, end and peak, and reserved memory where there is some."""

        def size(value: int | None) -> str:
            return "not measured" if value is None else format_size(value)

        text = f"baseline {size(self.baseline_bytes)}, after teardown {size(self.end_bytes)}, peak above baseline {size(self.peak_bytes)}"
        if "reserved_bytes" in self.details:
            text += f", reserved by the caching allocator {format_size(self.details['reserved_bytes'])}"
        return text

    def report(self) -> str:
        """The failure text: the sentence, the figures, the notes and the leaked tensors."""
        lines = [self.message, self.figures(), *self.notes]
        if self.peak_over and self.peak_breakdown is not None:
            lines.append(self.peak_breakdown.render())
        lines += self.left_behind
        if self.outcome == "leaked" and self.memory_leaked:
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
        self._record_sites = record_sites
        self._trace_folder = trace_folder
        self.sites: SiteRecorder | None = None
        self.history: AllocatorHistory | None = None
        self._baseline: Mark | None = None
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
        self.process_groups.begin()
        self.children.begin()
        # Rank processes started from here on inherit where to report (see pytest_vramleak.ranks).
        self._ranks_folder = Path(tempfile.gettempdir()) / f"vramleak-ranks-{os.getpid()}-{next(_CHECKS)}"  # made by the first rank
        self._ranks_env_before = os.environ.get(RANKS_ENV)
        os.environ[RANKS_ENV] = str(self._ranks_folder)

    def start(self) -> None:
        """The body starts: take the baseline, start watching the peak."""
        meter, result = self.meter, self.result
        if self.on_cpu:
            self._baseline = self.tracker.observe()
            self.tracker.freeze_young()  # what set-up made is read again only where it changes
            result.baseline_bytes = self.tracker.total("cpu")
        else:
            self._accelerator_clock = self.tracker.clock
            meter.settle()
            self._allocated_at_start = result.baseline_bytes = meter.allocated_bytes()
            if isinstance(meter, CudaMeter):
                self._pinned_at_start = meter.pinned_bytes()
            details = meter.details()
            self._driver_at_start = details.get("driver_used_bytes")
            if isinstance(meter, CudaMeter):
                self._others = self._other_devices(meter)
        peak = self.rules.watch_peak
        if peak is None:
            peak = self.budget.peak is not None or not self.on_cpu
        if peak:
            if isinstance(meter, CpuMeter):
                meter.categorize_peak = self.budget.peak is not None
            meter.start_peak()
            self._watching_peak = True
        if self._record_sites and self.on_cpu:
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
                self.sites.capture(self.tracker.pairs(self.tracker.created("cpu", since=self._baseline.clock)))
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
            if self.result.outcome == "leaked" and self.result.memory_leaked:
                self._explain()
                self._discount_torch_caches()
            return self.result
        finally:
            if self.sites is not None:
                self.sites.stop()
            if self.history is not None:
                self.history.stop()

    def close(self) -> None:
        """Unfreeze the heap; the check holds nothing of the code it checked."""
        self.process_groups.end()
        if self._ranks_folder is not None:
            if self._ranks_env_before is None:
                os.environ.pop(RANKS_ENV, None)
            else:
                os.environ[RANKS_ENV] = self._ranks_env_before
            shutil.rmtree(self._ranks_folder, ignore_errors=True)
            self._ranks_folder = None
        if self.sites is not None:
            self.sites.stop()
            self.sites.clear()
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
        if not pending:  # nothing the body made is alive, in a cycle or otherwise
            return 0
        self.tracker.observe(watch=False)
        return sum(ref.nbytes for ref in pending if ref() is None)

    def _cpu_ledger(self) -> int:
        tracker = self.tracker
        assert self._baseline is not None
        since = self._baseline.clock
        created = sum(ref.nbytes for ref in tracker.created("cpu", since=since))
        grown = sum(delta for _, delta in tracker.grown_older("cpu", since=since))
        freed = tracker.freed_older("cpu", since=since)
        result = self.result
        result.created_bytes = created + grown
        result.freed_older_bytes = freed
        result.end_bytes = tracker.total("cpu")
        result.leaked_bytes = max(0, created + grown - freed)
        return result.leaked_bytes

    def _finish_cpu(self, confirm: Callable[[], None] | None) -> None:
        assert self._baseline is not None, "finish() before start()"
        self.tracker.observe(since=self._baseline)
        if self._cpu_ledger() > self.budget.leak:
            self._confirm(confirm)
            self.tracker.observe(watch=False)
            self._cpu_ledger()

    def _confirm(self, confirm: Callable[[], None] | None) -> None:
        """Before a suspected leak is final: drop what PyTorch caches for itself (as its own check
        does), what the caller still holds, and cycles that outlived an observation."""
        clear_torch_caches(_import_torch())
        if confirm is not None:
            confirm()
        garbage = self.tracker.settle()[self.meter.name]
        self._settled = True
        if garbage:
            self.result.details["older_garbage_freed_bytes"] = garbage
            self.result.notes.append(
                f"confirming a suspected leak, a full collection also freed {format_size(garbage)} of older garbage: not the test's doing"
            )

    def _finish_accelerator(self, confirm: Callable[[], None] | None) -> None:
        meter, budget, result = self.meter, self.budget, self.result
        assert self._allocated_at_start is not None, "finish() before start()"
        growth = measure_growth(meter, self._allocated_at_start, self._driver_at_start, budget.leak)
        if growth.allocated > budget.leak:
            self._confirm(confirm)
            growth = measure_growth(meter, self._allocated_at_start, self._driver_at_start, budget.leak)
        result.leaked_bytes = growth.allocated
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
        verdict = judge_budget(budget, result.device, result.leaked_bytes, result.peak_bytes)
        result.peak_over = budget.peak is not None and result.peak_bytes is not None and result.peak_bytes > budget.peak
        messages = [verdict.message] if verdict.message else []
        if self.on_cpu and verdict.outcome == "leaked" and result.freed_older_bytes:
            messages[0] += (
                f" ({format_size(result.created_bytes or 0)} made and still alive, "
                f"{format_size(result.freed_older_bytes)} of older memory freed)"
            )
        outcome = verdict.outcome
        pinned_leak = result.details.get("pinned_host_leaked_bytes", 0)
        if pinned_leak > budget.leak:
            outcome = "leaked"
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
                result.notes.append(f"the budget for {what} was not checked: {result.device} keeps no statistics of it")
            elif used > limit:
                outcome = outcome if outcome == "leaked" else "over_budget"
                messages.append(f"{what} peaked at {format_size(used)} above its level at the start on {result.device}, allowed {format_size(limit)}")
        for other, _ in self._others:
            grew = result.details.get(f"{other.name}_leaked_bytes", 0)
            if grew > budget.leak:
                outcome = "leaked"
                messages.append(f"leaked {format_size(grew)} on {other.name}, allowed {format_size(budget.leak)}")
        if rules.saved_peak is not None and result.peak_bytes is not None:
            grew_text = judge_increase(rules.saved_peak, result.peak_bytes, rules.max_increase, result.device)
            if grew_text:
                outcome = outcome if outcome == "leaked" else "over_budget"
                messages.append(grew_text)
        if rules.strict_cycles and (result.cycle_bytes or 0) > budget.leak:
            outcome = "leaked"
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
        """The storages that make the leak on ``device``: made since the baseline and alive, or older and grown."""
        tracker = self.tracker
        since = self._baseline.clock if self._baseline is not None else self._accelerator_clock
        return tracker.created(device, since=since) + [ref for ref, _ in tracker.grown_older(device, since=since)]

    def _explain(self) -> None:
        result = self.result
        sources: list[SiteSource] = [source for source in (self.sites,) if source is not None]
        if self.history is not None and self._trace_folder is not None:
            path = self.history.save(self._trace_folder, self.name)
            result.trace = str(path)
            result.notes.append(f"allocator history saved to {path} (open it in https://pytorch.org/memory_viz)")
            sources.append(self.history.sites())
        sites = Sites(sources) if sources else None
        devices = [result.device] + [
            other.name for other, _ in self._others if result.details.get(f"{other.name}_leaked_bytes", 0) > self.budget.leak
        ]
        if not self.on_cpu:
            self.tracker.catch_up()  # the allocator said how much; which storages, the index says
        for device in devices:
            if device == result.device and result.leaked_bytes is not None and result.leaked_bytes <= self.budget.leak:
                continue
            keys = [(ref.device, ref.pointer) for ref in self.leaked_storages(device) if ref() is not None]
            with self.tracker.unfrozen():
                named = self.named_roots() if self.named_roots is not None else ()
                groups = describe(keys, device, sites=sites, named=named, collected=self._settled) if keys else []
            if device == result.device:
                result.groups = groups
            else:
                result.other_groups[device] = groups

    def _discount_torch_caches(self) -> None:
        """Take out what is not the check's to answer for: what only PyTorch's own caches hold
        (the constants of compiled graphs, which ``torch._dynamo.reset()`` does not always free),
        and what only threads running since before the check hold in their frames."""
        threads = tuple(f"thread '{name}' " for name in self._threads_before)
        self._discount(held_by_torch_cache, "held by caches PyTorch keeps itself (compiled graphs and their constants)")
        self._discount(
            lambda group: bool(group.held_by) and all(chain.startswith(threads) for chain in group.held_by) if threads else False,
            "held by threads that were running before the test began",
        )

    def _discount(self, predicate: Callable[[TensorGroup], bool], holders: str) -> None:
        result = self.result
        groups = [group for group in result.groups if predicate(group)]
        if not groups or result.leaked_bytes is None:
            return
        discounted = sum(group.bytes for group in groups)
        result.leaked_bytes = max(0, result.leaked_bytes - discounted)
        if result.created_bytes is not None:
            result.created_bytes = max(0, result.created_bytes - discounted)
        result.groups = [group for group in result.groups if group not in groups]
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

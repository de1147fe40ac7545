"""What one check measured and decided, and the failure text it makes of it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .holders.snapshot import TensorGroup
from .judging.sizes import format_size
from .judging.words import Outcome
from .meters.peaks import PeakBreakdown
from .reporting.report import render_groups
from .tracking.graphs import KeptGraph


@dataclass
class CheckResult:
    """What a check measured and decided. Sizes not measured are None."""

    device: str
    outcome: Outcome = "passed"
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
    def autocast_left(self) -> bool:
        """Whether the checked code entered an autocast region it never exited (see
        :mod:`~pytest_vramleak.left_behind`): what only C++ holds then is the region's cast cache."""
        return bool(self.details.get("autocast_regions_left"))

    @property
    def history_bytes(self) -> int:
        """The estimated host memory of the kept autograd history."""
        return self.graph.estimated_bytes if self.graph is not None else 0

    def figures(self) -> str:
        """One line: memory before and after, what made the difference, the peak where it was
        measured, and reserved memory where there is some. Its terms add up: after = before + kept + fixtures' - garbage."""

        def size(value: int | None) -> str:
            return "not measured" if value is None else format_size(value)

        text = f"before set-up {size(self.baseline_bytes)}, after teardown {size(self.end_bytes)}"
        terms = []
        net = self.net_bytes if self.net_bytes is not None else self.leaked_bytes
        if net:
            terms.append(
                f"the test kept {format_size(net)}"
                if net > 0
                else f"the test freed {format_size(-net)} of older memory"
            )
        if self.fixture_bytes:
            terms.append(f"fixtures of a wider scope set up meanwhile hold {format_size(self.fixture_bytes)}")
        garbage = self.details.get("older_garbage_freed_bytes", 0)
        if garbage:
            terms.append(f"a full collection freed {format_size(garbage)} of older garbage")
        if terms:
            text += " (" + "; ".join(terms) + ")"
        if self.peak_bytes is not None:  # (on CPU only a peak budget or a saved run asks for it)
            text += f", peak during the call {format_size(self.peak_bytes)}"
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

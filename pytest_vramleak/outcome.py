"""A check's outcome from what it measured: the budgets, the rules beyond them, one sentence each.

:func:`judge_check` is a plain function of a check's figures (a
:class:`~pytest_vramleak.check.CheckResult`), its :class:`~pytest_vramleak.verdict.Budget` and its
:class:`Rules`: what leaked (memory and kept autograd history, past the leak budget), what peaked
past a budget, what a saved run's peak says, and what only the cycle collector freed. It reads no
tensor and runs no code of the user's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .sizes import format_size
from .verdict import Budget, Increase, judge_budget, judge_increase

if TYPE_CHECKING:
    from .result import CheckResult
    from .snapshot import TensorGroup


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


def judge_check(
    result: CheckResult, budget: Budget, rules: Rules, *, on_cpu: bool, other_devices: list[str]
) -> tuple[str, list[str]]:
    """The outcome (``passed``, ``leaked`` or ``over_budget``) of a check's memory figures, with
    one sentence per broken rule; sets the result's ``peak_over``, ``over_budget``,
    ``other_leaks``, ``cycles_failed`` and ``memory_leaked``. ``other_devices``: the process's
    other CUDA devices, whose growth the result's details hold."""
    assert result.leaked_bytes is not None
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
            messages[0] = messages[0].replace(
                found, f"leaked {format_size(result.leaked_bytes)} on {result.device}, {allowed}, and kept {kept}", 1
            )
        else:
            messages[0] = messages[0].replace(found, f"kept {kept} on {result.device}, {allowed}", 1)
    if on_cpu and verdict.outcome == "leaked" and result.freed_older_bytes and result.leaked_bytes:
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
            messages.append(
                f"{what} peaked at {format_size(used)} above its level at the start on {result.device}, allowed {format_size(limit)}"
            )
    for other in other_devices:
        grew = result.details.get(f"{other}_leaked_bytes", 0)
        if grew > budget.leak:
            outcome = "leaked"
            result.other_leaks = True
            messages.append(f"leaked {format_size(grew)} on {other}, allowed {format_size(budget.leak)}")
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
    return outcome, messages


def discount(result: CheckResult, set_aside: list[tuple[str, list[TensorGroup]]]) -> bool:
    """Take out of a leak's figures the groups that are not the check's (with whose they are, as
    naming found: PyTorch's caches, C++, older threads), with a note each; whether any was."""
    if not set_aside or result.leaked_bytes is None:
        return False
    for holders, groups in set_aside:
        discounted = sum(group.bytes for group in groups)
        result.leaked_bytes = max(0, result.leaked_bytes - discounted)
        if result.created_bytes is not None:
            result.created_bytes = max(0, result.created_bytes - discounted)
        result.set_aside.append((holders, groups))
        result.notes.append(f"{format_size(discounted)} {holders}: not counted")
    return True

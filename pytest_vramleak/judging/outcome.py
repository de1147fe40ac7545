"""A check's outcome from what it measured: the budgets, the rules beyond them, one sentence each.

:func:`judge_check` is a plain function of a check's figures (:class:`CheckFigures`), its
:class:`~pytest_vramleak.judging.verdict.Budget` and its :class:`Rules`: what leaked (memory and
kept autograd history, past the leak budget), what peaked past a budget, what a saved run's peak
says, and what only the cycle collector freed. It reads no tensor and runs no code of the user's.
:func:`verdict_with_steps` joins a test's step checks to it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from .sizes import format_size
from .verdict import Budget, Increase, judge_budget, judge_increase
from .words import Outcome, StepVerdict, Verdict


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


@dataclass(frozen=True)
class CheckFigures:
    """What one check measured, as :func:`judge_check` reads it."""

    device: str
    leaked_bytes: int
    history_bytes: int = 0
    """The estimated host memory of the autograd history the checked code left alive."""
    history_nodes: int = 0
    peak_bytes: int | None = None
    created_bytes: int | None = None
    freed_older_bytes: int | None = None
    cycle_bytes: int | None = None
    details: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class CheckJudgement:
    """The outcome of a check's figures, one sentence per broken rule, and which rules broke."""

    outcome: Outcome
    messages: list[str]
    notes: list[str]
    """Budgets that could not be checked, and why."""
    peak_over: bool = False
    over_budget: bool = False
    other_leaks: bool = False
    cycles_failed: bool = False

    @property
    def memory_leaked(self) -> bool:
        return self.outcome == "leaked"


def judge_check(figures: CheckFigures, budget: Budget, rules: Rules, *, other_devices: Sequence[str]) -> CheckJudgement:
    """The outcome of a check's figures under its budget and rules. ``other_devices``: the
    process's other CUDA devices, whose growth the figures' details hold."""
    history = figures.history_bytes
    verdict = judge_budget(budget, figures.device, figures.leaked_bytes + history, figures.peak_bytes)
    peak_over = budget.peak is not None and figures.peak_bytes is not None and figures.peak_bytes > budget.peak
    messages = [verdict.message] if verdict.message else []
    if verdict.outcome == "leaked" and history:
        messages[0] = _with_history(messages[0], figures, budget)
    if verdict.outcome == "leaked" and figures.freed_older_bytes and figures.leaked_bytes:
        messages[0] += (
            f" ({format_size(figures.created_bytes or 0)} made and still alive, "
            f"{format_size(figures.freed_older_bytes)} of older memory freed)"
        )
    broken, notes = _beyond_budgets(figures, budget, rules, other_devices)
    leaks = [kind for kind, _ in broken if kind != "over"]
    over = [kind for kind, _ in broken if kind == "over"]
    outcome: Outcome = (
        "leaked" if verdict.outcome == "leaked" or leaks else "over_budget" if peak_over or over else "passed"
    )
    return CheckJudgement(
        outcome,
        messages + [message for _, message in broken],
        notes,
        peak_over=peak_over,
        over_budget=peak_over or bool(over),
        other_leaks=bool(leaks),
        cycles_failed="cycles" in leaks,
    )


def _with_history(message: str, figures: CheckFigures, budget: Budget) -> str:
    """The leak's sentence, saying how much of it is kept autograd history."""
    history = figures.history_bytes
    kept = (
        f"the autograd history of {figures.history_nodes:,} nodes the test made "
        f"(about {format_size(history)} of host memory)"
    )
    allowed = f"allowed {format_size(budget.leak)}"
    found = f"leaked {format_size(figures.leaked_bytes + history)} on {figures.device}, {allowed}"
    if figures.leaked_bytes:
        return message.replace(
            found, f"leaked {format_size(figures.leaked_bytes)} on {figures.device}, {allowed}, and kept {kept}", 1
        )
    return message.replace(found, f"kept {kept} on {figures.device}, {allowed}", 1)


def _beyond_budgets(
    figures: CheckFigures, budget: Budget, rules: Rules, other_devices: Sequence[str]
) -> tuple[list[tuple[str, str]], list[str]]:
    """The rules past the leak's and the peak's budgets that broke, in the order the failure
    lists them, each as its kind (``leak``: pinned host memory or another device leaked;
    ``cycles``: memory left to the cycle collector, with ``strict_cycles``; ``over``: reserved or
    pinned memory peaked past its budget, or the peak grew past the saved run's) and its
    sentence; and notes on the budgets that could not be checked."""
    broken: list[tuple[str, str]] = []
    notes: list[str] = []
    pinned_leak = figures.details.get("pinned_host_leaked_bytes", 0)
    if pinned_leak > budget.leak:
        broken.append(
            (
                "leak",
                f"leaked {format_size(pinned_leak)} of pinned host memory (torch.cuda.host_memory_stats), allowed "
                f"{format_size(budget.leak)}: pinned buffers kept alive (a pin_memory() copy stored somewhere, a "
                "DataLoader with pin_memory=True whose iterator lives on)",
            )
        )
    for name, limit, what in (
        ("reserved_peak_bytes", budget.reserved, "memory reserved by the caching allocator"),
        ("pinned_host_peak_bytes", budget.pinned, "pinned host memory"),
    ):
        used = figures.details.get(name)
        if limit is not None and used is None:
            notes.append(f"the budget for {what} was not checked: {figures.device} keeps no statistics of it")
        elif limit is not None and used is not None and used > limit:
            broken.append(
                (
                    "over",
                    f"{what} peaked at {format_size(used)} above its level at the start on {figures.device}, "
                    f"allowed {format_size(limit)}",
                )
            )
    for other in other_devices:
        grew = figures.details.get(f"{other}_leaked_bytes", 0)
        if grew > budget.leak:
            broken.append(("leak", f"leaked {format_size(grew)} on {other}, allowed {format_size(budget.leak)}"))
    if rules.saved_peak is not None and figures.peak_bytes is not None:
        grew_text = judge_increase(rules.saved_peak, figures.peak_bytes, rules.max_increase, figures.device)
        if grew_text:
            broken.append(("over", grew_text))
    if rules.strict_cycles and (figures.cycle_bytes or 0) > budget.leak:
        broken.append(
            (
                "cycles",
                f"left {format_size(figures.cycle_bytes or 0)} on {figures.device} to the cycle collector, allowed "
                f"{format_size(budget.leak)} (--vramleak-strict-cycles): break the reference cycle, e.g. with weakref",
            )
        )
    return broken, notes


class StepFigures(Protocol):
    """What the verdict reads of one step check (a :class:`~pytest_vramleak.steps.StepResult`)."""

    @property
    def grows(self) -> bool: ...
    @property
    def undecided(self) -> str | None:
        """Why it could not tell growth from noise (None where it could)."""

    @property
    def verdict(self) -> object | None:
        """Its growth verdict, None where it measured nothing."""


def step_verdict(steps: Sequence[StepFigures]) -> StepVerdict | None:
    """What a test's step checks found: ``leaked`` (one grew), ``undecided`` (one could not tell
    growth from noise), ``passed``; None where none was measured."""
    if any(step.grows for step in steps):
        return "leaked"
    if any(step.undecided for step in steps):
        return "undecided"
    return "passed" if any(step.verdict is not None for step in steps) else None


def verdict_with_steps(
    verdict: Verdict, steps: Sequence[StepFigures], *, budget_checked: bool, unchecked: bool, allowed: bool = False
) -> Verdict:
    """A test's verdict with its step checks (``verdict``: its whole-test check's;
    ``budget_checked``: it had a budget to check; ``unchecked``: something kept it from being
    checked, such as its failure; ``allowed``: it is marked to allow leaks):

    =========================================  ===========================================
    the step checks                            the test's verdict
    =========================================  ===========================================
    one grew, in a test that allows leaks      unchecked (its step verdict says it grew)
    one grew                                   leaked
    one decided, the test had no budget, and   passed (checked through the fixture alone)
    nothing kept it from being checked
    otherwise                                  the whole-test check's
    =========================================  ===========================================
    """
    if step_verdict(steps) == "leaked":
        return "unchecked" if allowed else "leaked"
    decided = any(step.verdict is not None and not step.undecided for step in steps)
    if verdict == "unchecked" and decided and not budget_checked and not unchecked:
        return "passed"
    return verdict

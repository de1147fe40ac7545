"""Running a checked test again to tell memory that grows from memory kept once, and the verdict.

A whole-test check sees one before and one after: it cannot tell a test that leaks on every call
from one that leaves state behind once (a cache filled once, lazily built state, the gradients the
first ``backward()`` makes on a shared model, a metric's cached result on a parametrize value).
Run the test again, unchanged, and it can, as CPython's ``-R`` does for references.
:class:`Repetitions` keeps what each run of a test left (bytes of tensor storage, and the autograd
nodes it made that stay alive), and classifies the memory left after each run with the step
check's growth rule (:func:`~pytest_vramleak.judging.verdict.judge_growth`):

- ``grows``: memory (or autograd history) added on every run, or every k-th run;
- ``kept_once``: left by the first run (or the warm-up runs), then flat;
- ``settled``: rose during the measured runs, then held flat.

:func:`decide` turns that into a verdict under a :class:`Rule`:

- ``significant`` (the default for tests ``--vramleak`` checks without a marker): a test fails
  when its memory grows across runs, or when what it keeps once is at least the rule's floor;
- ``growth``: only growth fails;
- ``any`` (and a ``vram_budget`` marker's explicit budget): the first run is judged as a test run
  once is: everything past the budget fails, kept once or not.

Everything here is plain logic: the pytest side (running a test again) is in
:mod:`pytest_vramleak.plugin.protocol`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from .sizes import format_size
from .verdict import GrowthVerdict, judge_growth
from .words import KEPT_FLOOR, FailOn, Outcome, Pattern


@dataclass
class Run:
    """What one run of a test left."""

    leaked_bytes: int
    """Bytes above the run's own start (never below 0)."""
    outcome: Outcome
    history_nodes: int = 0
    """Autograd nodes made since the first run began that tensors alive after this run keep."""
    begin_clock: int = 0
    """The tracker's clock as the run began: storages first seen since are this run's or later ones'."""


@dataclass(frozen=True)
class Rule:
    """How a test's runs are judged."""

    leak_budget: int
    tolerance: int = 0
    fail_on: FailOn = "significant"
    floor: int = KEPT_FLOOR
    """``significant``: memory kept once fails from this many bytes on."""

    @property
    def strict(self) -> bool:
        return self.fail_on == "any"


@dataclass
class Repetitions:
    """The runs of one test and their classification; see the module docstring.

    ``planned`` runs in all, the first ``warmup`` of them not measured. In ``confirm`` mode the test
    ran once as usual and, being over its leak budget, ``planned - 1`` more times.
    """

    planned: int
    warmup: int
    mode: str = "repeat"
    """``repeat`` (every run planned) or ``confirm`` (re-runs only after a leak)."""
    runs: list[Run] = field(default_factory=list)
    stopped: str | None = None
    """Why the runs stopped before ``planned``: the test failed, skipped or xfailed, a re-run failed."""
    rerun_failed: bool = False
    """A run after the first failed: the runs are not used, the first run's verdict stands."""
    started: int = 0
    """Runs started, checked or not."""

    @property
    def wants_more(self) -> bool:
        return self.stopped is None and self.started < self.planned

    def series(self, adjust: Sequence[int] = ()) -> list[int]:
        """Memory left after each run, above the first run's start; ``adjust`` is taken off each
        run's figure (memory set aside: not the test's)."""
        total, series = 0, []
        for index, run in enumerate(self.runs):
            total += run.leaked_bytes - (adjust[index] if index < len(adjust) else 0)
            series.append(total)
        return series

    def node_series(self) -> list[int]:
        """Autograd nodes kept after each run, made by this test's runs."""
        return [run.history_nodes for run in self.runs]

    def _measured(self, series: list[int]) -> list[int]:
        base = series[self.warmup - 1] if self.warmup else 0
        return [value - base for value in series[self.warmup :]]

    def measured(self, adjust: Sequence[int] = ()) -> list[int]:
        """Memory after each measured run, above what the warm-up runs left."""
        return self._measured(self.series(adjust))

    def classify(
        self, tolerance: int, leak_budget: int, device: str, adjust: Sequence[int] = ()
    ) -> tuple[Pattern | None, GrowthVerdict | None, bool]:
        """The pattern (or None: nothing was left, or too few runs), the growth verdict it rests
        on, and whether it is the autograd history (not the storage) that grows."""
        if self.rerun_failed:
            return None, None, False
        measured = self.measured(adjust)
        if len(measured) < 2:
            return None, None, False
        verdict = judge_growth(measured, tolerance, device)
        if verdict.grows:
            return "grows", verdict, False
        nodes = self._measured(self.node_series())
        if any(nodes):
            history = judge_growth(nodes, 0, device)
            if history.grows:
                return "grows", history, True
        series = self.series(adjust)
        kept = series[self.warmup - 1] if self.warmup else 0
        if verdict.settled_at is not None and not (self.warmup == 0 and verdict.settled_at == 1):
            return "settled", verdict, False
        first = series[0] if series else 0
        if max(first, kept, verdict.kept_bytes) > leak_budget or any(self.node_series()):
            return "kept_once", verdict, False
        return None, verdict, False

    def describe(
        self,
        pattern: Pattern | None,
        verdict: GrowthVerdict | None,
        device: str,
        *,
        history: bool = False,
        adjust: Sequence[int] = (),
    ) -> str:
        """A few lines on the runs: the pattern, what each left, and what to do."""
        series = self.series(adjust)
        runs = len(self.runs)
        figures = ", ".join(format_size(value) for value in series)
        if self.rerun_failed:
            return (
                f"ran {self.started} times; memory left by the first run, above its start: {format_size(series[0]) if series else 'not measured'}\n"
                f"{RUNS_NOT_USED}: {self.stopped}; judged on the first run"
            )
        head = f"ran {runs} times ({self.warmup} warm-up); memory left after each run, above the first run's start: {figures}"
        if any(self.node_series()):
            head += "; autograd nodes kept: " + ", ".join(f"{nodes:,}" for nodes in self.node_series())
        if pattern is None or verdict is None:
            if len(self.measured(adjust)) < 2:
                return f"{head}\nnot classified: {len(self.measured(adjust))} measured run(s), at least 2 are needed"
            return head
        measured = runs - self.warmup
        if pattern == "grows" and history:
            text = (
                f"pattern: grows: {verdict.per_step_bytes:,.0f} more autograd nodes kept per run over {measured} measured runs, "
                "while the tensors' memory does not grow: each run links its graph behind what an earlier run kept"
            )
        elif pattern == "grows":
            text = (
                f"pattern: grows: {format_size(verdict.per_step_bytes)} more per run over {measured} measured runs "
                f"({format_size(verdict.kept_bytes)} in total) on {device}: memory is added by every run (or every few), "
                "a leak that a long run multiplies"
            )
        elif pattern == "kept_once":
            text = (
                f"pattern: kept_once: the first run left {format_size(series[0] if series else 0)}, and the next "
                f"{runs - 1} runs left nothing more: state kept once (a cache filled once, lazily built state, the "
                "gradients of a first backward() on a shared model), not growth"
            )
        else:
            assert verdict.settled_at is not None
            text = (
                f"pattern: settled: memory rose until measured run {verdict.settled_at} and then held flat "
                f"({format_size(verdict.kept_bytes)} kept): a bounded cache that filled up; not growth"
            )
        return f"{head}\n{text}"


def run_made(clocks: Sequence[int], born: int) -> int | None:
    """Which run made a storage first seen at the tracker's clock ``born``, the runs having begun at
    ``clocks`` (None: before the first)."""
    return max((index for index, clock in enumerate(clocks) if clock <= born), default=None)


def set_aside_per_run(clocks: Sequence[int], kept: Iterable[tuple[int, int]], *, first_run_too: bool) -> list[int]:
    """Bytes to take off each run's figure for storages set aside (``kept``: each one's clock of
    birth and size), charged to the run that made it:

    ==============  ============================================================
    made by         set aside from
    ==============  ============================================================
    the first run   that run where ``first_run_too`` (held by PyTorch itself), else
                    nowhere (what pytest keeps of a test run once is kept once)
    a later run     that run
    no run          nowhere
    ==============  ============================================================
    """
    adjust = [0] * len(clocks)
    for born, nbytes in kept:
        index = run_made(clocks, born)
        if index is not None and (first_run_too or index > 0):
            adjust[index] += nbytes
    return adjust


def settled_credit(clocks: Sequence[int], settled: Iterable[tuple[int, int]]) -> list[int]:
    """Bytes each run freed of an earlier run's garbage on reference cycles, freed only by a full
    collection (``settled``: each storage's clock of birth and size). An object a run made on a
    cycle that the next run replaced is credited to the next run, as if it had freed it; garbage of
    the last run, or of no run, is credited to none."""
    credit = [0] * len(clocks)
    for born, nbytes in settled:
        made = run_made(clocks, born)
        if made is not None and made + 1 < len(clocks):
            credit[made + 1] += nbytes
    return credit


def kept_once_already(runs: Sequence[Run]) -> bool:
    """Whether re-runs that confirm a leak may stop: at least three runs, and every run after the
    second added nothing at all (no byte, no autograd node; the second may still finish what the
    first began), so memory was kept once, whatever further runs would show. (A test that grows
    only every third run or less often then reads as kept once.)"""
    return len(runs) >= 3 and all(
        run.leaked_bytes <= 0 and run.history_nodes <= before.history_nodes
        for before, run in zip(runs[1:], runs[2:], strict=False)
    )


def last_growing_run(series: Sequence[int], warmup: int) -> int | None:
    """The last measured run after which more memory was left than before it (None: none was)."""
    leaving = [index for index in range(warmup, len(series)) if series[index] > (series[index - 1] if index else 0)]
    return leaving[-1] if leaving else None


@dataclass(frozen=True)
class Decision:
    """The verdict on a test's runs: outcome, pattern, failure sentence (empty when it passes)."""

    outcome: Outcome
    pattern: Pattern | None
    message: str
    about: str
    """What the runs showed, a few lines (empty for a test run once)."""
    kept_bytes: int = 0
    """What the runs keep, above the first run's start (memory and estimated autograd history)."""
    grows_history: bool = False
    growth_bytes: int | None = None
    opens_with_growth: bool = False
    """The failure's first sentence is the storage's growth per run (not the first run's verdict)."""


class FirstRun(Protocol):
    """What :func:`decide` reads of a test's first run (a :class:`~pytest_vramleak.result.CheckResult`)."""

    @property
    def outcome(self) -> str: ...
    @property
    def message(self) -> str:
        """The sentence of each rule the first run broke, as a test run once reads."""

    @property
    def memory_leaked(self) -> bool: ...
    @property
    def other_leaks(self) -> bool:
        """Pinned host memory, another device or memory left to the cycle collector leaked."""

    @property
    def over_budget(self) -> bool: ...
    @property
    def left_behind(self) -> list[str]:
        """Process groups, child processes and ranks' leaks: always the test's."""


def memory_fails(rule: Rule, first: FirstRun, *, grows: bool, kept: int, first_kept: int) -> bool:
    """Whether the memory a test's runs leave fails it, by the rule's ``fail_on``:

    ============  ==========================================================================
    fail_on       fails where
    ============  ==========================================================================
    any           memory grows across runs, or the first run leaked past the budget (as a
                  test run once is judged), or leaked pinned memory, on another device or to
                  the cycle collector
    growth        memory grows, or another leak as above
    significant   memory grows, or what the runs keep is over the budget and at least the
                  floor, or another leak as above
    ============  ==========================================================================
    """
    if rule.fail_on == "any":
        return grows or (first.memory_leaked and (first_kept > rule.leak_budget or first.other_leaks))
    if rule.fail_on == "growth":
        return grows or first.other_leaks
    return grows or (kept > rule.leak_budget and kept >= rule.floor) or first.other_leaks


def decide(
    repetitions: Repetitions,
    first: FirstRun,
    rule: Rule,
    *,
    device: str,
    adjust: Sequence[int] = (),
    node_bytes: int = 0,
) -> Decision:
    """Judge a test from its first run (``first``: the whole-test leak and the peak) and what each
    run left, under ``rule`` (see the module docstring and :func:`memory_fails`). ``adjust``:
    bytes per run set aside as not the test's (held by PyTorch itself); ``node_bytes``: the
    estimated size of one kept autograd node."""
    pattern, verdict, history = repetitions.classify(rule.tolerance, rule.leak_budget, device, adjust)
    grows = pattern == "grows"
    kept, first_kept = _kept(repetitions, adjust, node_bytes, classified=pattern is not None)
    about = (
        repetitions.describe(pattern, verdict, device, history=history, adjust=adjust)
        if len(repetitions.runs) > 1 or repetitions.rerun_failed
        else ""
    )
    growth = _growth_bytes(repetitions, adjust) if grows and not history else None
    fails = memory_fails(rule, first, grows=grows, kept=kept, first_kept=first_kept)
    outcome: Outcome = "leaked" if fails or first.left_behind else "over_budget" if first.over_budget else "passed"
    if outcome == "passed":
        return Decision(outcome, pattern, "", about, kept, history, growth)
    judged_first = _first_run_judged(repetitions, first, rule, grows=grows, fails=fails)
    opening = (
        first.message
        if judged_first
        else _memory_message(
            repetitions, first, rule, verdict if grows else None, history, fails, kept, device, node_bytes
        )
    )
    messages = [opening]
    if (first.left_behind or first.over_budget) and first.message != opening:
        messages.append(first.message)
    if _first_run_told_apart(repetitions, first, rule, grows=grows) and first.message not in messages:
        about = f"{about}\nfirst run: {first.message}"
    message = "; ".join(message for message in messages if message)
    opens_with_growth = grows and not history and not judged_first
    return Decision(outcome, pattern, message, about, kept, history, growth, opens_with_growth)


RUNS_NOT_USED = "the runs after the first were not used"
"""How the line opens that says a run after the first failed, and why (a report prints it)."""


def undecided_without_runs(
    repetitions: Repetitions, decision: Decision, rule: Rule, adjust: Sequence[int] = ()
) -> bool:
    """Whether a test passed only because the runs that would judge what its first run kept
    could not be used (one failed): its first run kept more than its budget, which only runs
    again tell growth from memory kept once under ``rule`` (not under ``any``, which judges the
    first run as a test run once is). Such a test is undecided, not passed."""
    series = repetitions.series(adjust)
    return (
        repetitions.rerun_failed
        and decision.outcome == "passed"
        and not rule.strict
        and bool(series)
        and series[0] > rule.leak_budget
    )


def _kept(repetitions: Repetitions, adjust: Sequence[int], node_bytes: int, *, classified: bool) -> tuple[int, int]:
    """What the runs keep after the last run and after the first (memory and estimated autograd
    history), above the first run's start; after the first alone where a run after it failed and
    the runs could not be classified (they are not used)."""
    series, nodes = repetitions.series(adjust), repetitions.node_series()
    kept = (series[-1] if series else 0) + (nodes[-1] if nodes else 0) * node_bytes
    first_kept = (series[0] if series else 0) + (nodes[0] if nodes else 0) * node_bytes
    return (first_kept if not classified and repetitions.rerun_failed else kept), first_kept


def _growth_bytes(repetitions: Repetitions, adjust: Sequence[int]) -> int | None:
    """How much memory grew over the measured runs (None where no run was measured)."""
    series = repetitions.series(adjust)
    if not series:
        return None
    return series[-1] - (series[repetitions.warmup - 1] if repetitions.warmup else 0)


def _first_run_judged(repetitions: Repetitions, first: FirstRun, rule: Rule, *, grows: bool, fails: bool) -> bool:
    """Whether the failure opens with the first run's verdict: a strict rule judges the first run
    as a test run once is, unless runs repeated as planned grew (they then say how)."""
    return fails and rule.strict and not (grows and repetitions.mode == "repeat") and bool(first.message)


def _first_run_told_apart(repetitions: Repetitions, first: FirstRun, rule: Rule, *, grows: bool) -> bool:
    """Whether what the runs showed ends with the rule the first run broke alone: a strict rule's
    planned repeats that grew open the failure with the growth, not with the first run's verdict."""
    return grows and rule.strict and repetitions.mode == "repeat" and first.outcome != "passed" and bool(first.message)


def _memory_message(
    repetitions: Repetitions,
    first: FirstRun,
    rule: Rule,
    growth: GrowthVerdict | None,
    history: bool,
    fails: bool,
    kept: int,
    device: str,
    node_bytes: int,
) -> str:
    """The failure's first sentence where the first run's verdict does not open it (see
    :func:`_first_run_judged`): the growth per run (``growth``: the verdict of runs that grow), or
    what was kept once."""
    grows = growth is not None and fails
    if grows:
        assert growth is not None
        measured = len(repetitions.runs) - repetitions.warmup
        if history:
            return (
                f"autograd history grew {growth.per_step_bytes:,.0f} nodes per run of the test over {measured} measured runs on "
                f"{device} (about {format_size(growth.per_step_bytes * node_bytes)} of host memory per run)"
            )
        return (
            f"memory grew {format_size(growth.per_step_bytes)} per run of the test over {measured} measured runs on {device}, "
            f"tolerance {format_size(rule.tolerance)}"
        )
    if fails and not rule.strict and not first.other_leaks:
        return (
            f"kept {format_size(kept)} on {device} that it did not let go: memory a test keeps once fails from "
            f"{format_size(rule.floor)} on (--vramleak-kept-floor)"
        )
    return first.message

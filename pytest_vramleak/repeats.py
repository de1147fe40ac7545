"""Running a checked test several times to tell memory that grows from memory kept once.

A whole-test check sees one before and one after: it cannot tell a test that leaks on every call
from one that leaves state behind once (a cache filled once, lazily built state, the gradients the
first ``backward()`` makes on a shared model). Run the test again, unchanged, and it can, as
CPython's ``-R`` does for references. :class:`Repetitions` keeps what each run of a test left,
the memory left after each run, and classifies it with the step check's growth rule
(:func:`~pytest_vramleak.verdict.judge_growth`):

- ``grows``: memory added on every run, or every k-th run;
- ``kept_once``: left by the first run (or the warm-up runs), then flat;
- ``settled``: rose during the measured runs, then held flat.

:func:`run_repeated` is the pytest side: it runs a test's whole protocol (setup, call, teardown
of its function-scoped fixtures) several times, as pytest-repeat and pytest-rerunfailures do,
keeping wider-scoped fixtures between runs, and reports the test once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from _pytest.runner import call_and_report

from .report import render_groups
from .sizes import format_size
from .snapshot import TensorGroup
from .verdict import GrowthVerdict, judge_growth

PATTERNS = ("grows", "kept_once", "settled")


@dataclass
class Run:
    """What one run of a test left: bytes above its own baseline, and the leaked groups where named."""

    leaked_bytes: int
    outcome: str
    groups: list[TensorGroup] = field(default_factory=list)


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
    final: bool = False
    """Whether the run now ending is the last one: its teardown reports for all of them."""
    stopped: str | None = None
    """Why the runs stopped before ``planned``: the test failed, skipped or xfailed."""
    started: int = 0
    """Runs started, checked or not."""
    first: Any = None
    """The first run's :class:`~pytest_vramleak.check.CheckResult`: the whole-test leak and the peak."""
    first_result: Any = None
    """The first run's JSON record (:class:`~pytest_vramleak.report.TestResult`), completed at the last run."""

    @property
    def wants_more(self) -> bool:
        return self.stopped is None and self.started < self.planned and not self.final

    def series(self) -> list[int]:
        """Memory left after each run, above the first run's baseline."""
        total, series = 0, []
        for run in self.runs:
            total += run.leaked_bytes
            series.append(total)
        return series

    def measured(self) -> list[int]:
        """Memory after each measured run, above what the warm-up runs left."""
        series = self.series()
        base = series[self.warmup - 1] if self.warmup else 0
        return [value - base for value in series[self.warmup :]]

    def classify(self, tolerance: int, leak_budget: int, device: str) -> tuple[str | None, GrowthVerdict | None]:
        """The pattern (or None: nothing was left, or too few runs) and the growth verdict it rests on."""
        measured = self.measured()
        if len(measured) < 2:
            return None, None
        verdict = judge_growth(measured, tolerance, device)
        if verdict.grows:
            return "grows", verdict
        kept = self.series()[self.warmup - 1] if self.warmup else 0
        if verdict.settled_at is not None and not (self.warmup == 0 and verdict.settled_at == 1):
            return "settled", verdict
        first = self.runs[0].leaked_bytes
        if max(first, kept, verdict.kept_bytes) > leak_budget:
            return "kept_once", verdict
        return None, verdict

    def growth_groups(self) -> list[TensorGroup]:
        """The leaked tensors of the last measured run that named any: what grew on that run."""
        for run in reversed(self.runs[self.warmup :]):
            if run.groups:
                return run.groups
        return []

    def describe(self, pattern: str | None, verdict: GrowthVerdict | None, device: str) -> str:
        """A few lines on the runs: the pattern, what each left, and what to do."""
        series = self.series()
        runs = len(self.runs)
        figures = ", ".join(format_size(value) for value in series)
        head = f"ran {runs} times ({self.warmup} warm-up); memory left after each run, above the first run's baseline: {figures}"
        if pattern is None or verdict is None:
            if len(self.measured()) < 2:
                return f"{head}\nnot classified: {len(self.measured())} measured run(s), at least 2 are needed"
            return head
        measured = len(series) - self.warmup
        if pattern == "grows":
            text = (
                f"pattern: grows: {format_size(verdict.per_step_bytes)} more per run over {measured} measured runs "
                f"({format_size(verdict.kept_bytes)} in total) on {device}: memory is added by every run (or every few), "
                "a leak that a long run multiplies"
            )
        elif pattern == "kept_once":
            text = (
                f"pattern: kept_once: the first run left {format_size(self.runs[0].leaked_bytes)}, and the next "
                f"{runs - 1} runs left nothing more: state kept once (a cache filled once, lazily built state, the "
                "gradients of a first backward() on a shared model), not growth; --vramleak-fail-on=growth passes such tests"
            )
        else:
            assert verdict.settled_at is not None
            text = (
                f"pattern: settled: memory rose until measured run {verdict.settled_at} and then held flat "
                f"({format_size(verdict.kept_bytes)} kept): a bounded cache that filled up; not growth"
            )
        return f"{head}\n{text}"


def run_repeated(item: pytest.Item, nextitem: pytest.Item | None, repetitions: Repetitions) -> list[pytest.TestReport]:
    """Run ``item``'s protocol until ``repetitions`` wants no more; return the reports of the last run.

    Runs before the last are torn down towards ``item``'s parent, so fixtures of a wider scope stay
    set up between them, as between the parametrized copies of pytest-repeat; the last run is torn
    down towards ``nextitem``. A run that fails, skips or xfails is the last. (Under
    ``--setup-show`` and ``--setup-only`` tests run once: the caller does not come here.)
    """
    reports: list[pytest.TestReport] = []
    spent: dict[str, float] = {}  # seconds per phase over every run: the reports logged carry the sums
    while True:
        repetitions.started += 1
        if hasattr(item, "_request") and not item._request:
            item._initrequest()  # type: ignore[attr-defined]  # as pytest's runtestprotocol on a re-run
        reports = [call_and_report(item, "setup", log=False)]
        if reports[0].passed:
            reports.append(call_and_report(item, "call", log=False))
        if any(report.failed or report.skipped or hasattr(report, "wasxfail") for report in reports):
            repetitions.stopped = next(_why_stopped(report) for report in reports if not report.passed or hasattr(report, "wasxfail"))
        session_ends = item.session.shouldfail or item.session.shouldstop
        last = session_ends or repetitions.stopped is not None or repetitions.started >= repetitions.planned
        repetitions.final = bool(last)
        # Toward the test's parent: the test's own node and function-scoped fixtures are torn
        # down, its module's and class's stay.
        toward = None if session_ends else nextitem if last else item.parent
        reports.append(call_and_report(item, "teardown", log=False, nextitem=toward))
        if hasattr(item, "_request"):
            item._request = False
            item.funcargs = None  # type: ignore[attr-defined]
        if reports[-1].failed and not repetitions.final:
            repetitions.stopped = "teardown failed"
        elif len(repetitions.runs) < repetitions.started and repetitions.stopped is None:
            repetitions.stopped = f"run {repetitions.started} was not checked"
        for report in reports:
            spent[report.when] = spent.get(report.when, 0.0) + report.duration
        if not repetitions.wants_more:
            if not repetitions.final:
                # This run was torn down toward ``item`` but is the last: finish toward ``nextitem``.
                _finish_teardown(item, nextitem, reports[-1])
            for report in reports:
                report.duration = spent[report.when]
            return reports


def _why_stopped(report: pytest.TestReport) -> str:
    if hasattr(report, "wasxfail"):
        return "the test xfailed"
    return f"the test {'was skipped' if report.skipped else 'failed'} in {report.when}"


def _finish_teardown(item: pytest.Item, nextitem: pytest.Item | None, report: pytest.TestReport) -> None:
    """Tear down what the next test does not need; a failure there fails the teardown report."""
    try:
        item.session._setupstate.teardown_exact(nextitem)
    except Exception as error:
        report.outcome = "failed"
        report.longrepr = f"teardown of fixtures after the last run: {type(error).__name__}: {error}"


def report_runs(item: pytest.Item, reports: list[pytest.TestReport]) -> None:
    """Log a repeated test once: its last run's reports."""
    for report in reports:
        item.ihook.pytest_runtest_logreport(report=report)


@dataclass(frozen=True)
class Decision:
    """The verdict on a repeated test: outcome, pattern, failure text (empty when it passes)."""

    outcome: str
    pattern: str | None
    message: str
    groups: list[TensorGroup]


def decide(
    repetitions: Repetitions,
    first: Any,
    *,
    leak_budget: int,
    peak_budget: int | None,
    tolerance: int,
    fail_on: str,
    device: str,
) -> Decision:
    """Judge a repeated test from its first run (``first``, a :class:`~pytest_vramleak.check.CheckResult`:
    the whole-test leak and the peak) and the memory left after each run.

    The first run is judged as a test run once is, so repeating never hides a leak made once from a
    user who wants those to fail; under ``fail_on="growth"`` only a pattern of ``grows`` (and a peak
    over its budget) fails.
    """
    pattern, verdict = repetitions.classify(tolerance, leak_budget, device)
    grows = pattern == "grows"
    peak_over = peak_budget is not None and first.peak_bytes is not None and first.peak_bytes > peak_budget
    leak_fails = grows or (fail_on == "any" and first.outcome == "leaked" and (first.leaked_bytes or 0) > leak_budget)
    outcome = "leaked" if leak_fails else "over_budget" if peak_over else "passed"
    groups = repetitions.growth_groups() if grows else list(first.groups)
    about = repetitions.describe(pattern, verdict, device)
    if outcome == "passed":
        return Decision(outcome, pattern, "", groups)
    if grows:
        assert verdict is not None
        lines = [
            f"memory grew {format_size(verdict.per_step_bytes)} per run of the test over "
            f"{len(repetitions.runs) - repetitions.warmup} measured runs on {device}, tolerance {format_size(tolerance)}",
            about,
        ]
        if first.outcome != "passed" and first.message:
            lines.append(f"first run: {first.message}")
        lines += ["tensors left by the last measured run that left any:", render_groups(groups)]
        return Decision(outcome, pattern, "\n".join(lines), groups)
    return Decision(outcome, pattern, f"{first.report()}\n{about}", groups)

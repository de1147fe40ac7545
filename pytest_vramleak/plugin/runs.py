"""The runs of one checked test and the verdict on them: the first run, the runs again that
tell growth from memory kept once, the run that records where a leak's tensors are made, what
PyTorch or pytest keeps set aside, and the reports pytest gets, once."""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import pytest

from ..check import CPP_HELD, CheckResult, LeakCheck, NamedLeak, groups_held, name_leak
from ..holders.diagnosis import PYTEST_WARNINGS, in_gc_garbage, kept_by_the_interpreter
from ..holders.naming import NAMED_EACH
from ..holders.paths import HolderPath, RootKind
from ..holders.referrers import (
    NamedRoot,
    held_only_inside,
    signal_handlers,
    torch_mode_stacks,
    torch_modes,
    traceback_frames,
    without_python_holders,
)
from ..holders.snapshot import TensorGroup, held_in_cpp_groups, merge_parts
from ..judging.outcome import step_verdict, verdict_with_steps
from ..judging.repeats import (
    RUNS_NOT_USED,
    Decision,
    Repetitions,
    Rule,
    Run,
    decide,
    kept_once_already,
    last_growing_run,
    run_made,
    set_aside_per_run,
    settled_credit,
    undecided_without_runs,
)
from ..judging.sizes import format_size
from ..judging.verdict import Budget
from ..meters.autocast import ThreadRegion, regions_in_other_threads
from ..reporting.report import TestResult, listed_total_text, render_groups
from ..steps import StepResult
from ..tracking import exit_callbacks
from ..tracking.census import StorageKey, collections_paused
from ..tracking.gc_functions import saving_garbage
from ..tracking.graph_sites import GraphSites
from ..tracking.sites import FRAMES_FOR_CPP_HELD, FRAMES_TRACED, SiteRecorder, Sites, SiteSource, StorageSites
from ..tracking.tracker import NODE_BYTES, StorageRef, Tracker
from .options import Settings
from .outcomes import verdict_properties
from .protocol import (
    RandomState,
    failed_call_report,
    failure_line,
    finish_teardown,
    kept_instance,
    run_once,
    why_stopped,
)
from .state import (
    EXEMPT_MARKER,
    Check,
    CheckedTest,
    VramLeak,
    current_check,
    pasteable,
    session_of,
    test_of,
)
from .timeouts import cut_short, rearm


def _is_doctest(item: pytest.Item) -> bool:
    """doctest clears a doctest's globals after it runs: run again, it fails with NameError."""
    return type(item).__name__ == "DoctestItem" and type(item).__module__ == "_pytest.doctest"


@dataclass
class TestRuns:
    """The runs of one checked test while they happen, and how they are judged."""

    repetitions: Repetitions
    rule: Rule
    may_rerun: bool
    """Whether the test may run again (planned repeats, or --vramleak-confirm after a leak)."""
    confirm: int = 0
    why_once: str | None = None
    """Why a test that would be run again is not (a doctest)."""
    checks: list[Check] = field(default_factory=list)
    first_begin: int = 0
    """The tracker's clock as the first run began."""
    sites: Sites | None = None
    """Where the run that records sites notes them (the run after the verdict, for a failing test)."""
    naming_run: bool = False
    """The run now is the one that records sites, after the verdict."""
    cpp_known: bool = False
    """``held_in_cpp`` was read as the runs were judged (before the run that records sites)."""
    held_in_cpp: bool = False
    """Nothing in Python referred to any tensor the runs kept before the run that records sites."""
    first_kept: list[int] | None = None
    """The sizes of the storages the first run kept, where it may run again (sorted)."""
    first_kept_refs: list[StorageRef] | None = None
    """What the first run kept, where it runs again: weak references, dropped as the second run's
    body begins (see :meth:`body_begins`)."""
    freed_as_set_up: int = 0
    """Bytes of what the first run kept that the second run's set-up freed: state the suite
    resets as each test sets up (a ``pytest_runtest_setup`` hook, a fixture)."""
    between: list[tuple[int, int, str]] = field(default_factory=list)
    """What died between the runs, each storage's clock of birth, bytes and device (a run again
    collects every generation as it begins: :meth:`Tracker.collect_between_runs`)."""
    credit: list[int] | None = None
    """Per run, the bytes it freed of an earlier run's garbage on cycles (see :func:`_credit`):
    what died between the runs, and what a full collection before naming freed."""
    known_once: str | None = None
    """Why what the first run kept is known to be kept once, so that the test was not run again
    (a note for the report): it is held only inside the test's own parametrize values (see
    :func:`_kept_in_its_parameters`), or it is the first gradients of older leaves (see
    :func:`_kept_first_gradients`)."""
    as_in: str | None = None
    """The earlier case of the same test function whose runs showed that what this case's first
    run kept, the same storages, is PyTorch's own: this case was not run again."""
    sites_lost: bool = False
    """The test stopped tracemalloc while the run that records sites ran: they are not known."""
    body_ended: Callable[[], None] | None = None
    """While the run that records sites runs: what its check calls as the test's body ends."""
    sites_on_first_run: bool = False
    """``--vramleak-sites=on``: the first run records sites too."""
    cut_short: str | None = None
    """Why the plugin's work after the first run ended before a verdict (a timeout fired in it)."""
    extra_begin: int | None = None
    """The tracker's clock as the run that recorded sites after the verdict began (not one of the
    runs judged: what it left is named, and not counted)."""
    kept_many: int = 0
    """The storages the first run kept, where they were :data:`MANY_KEPT` or more: two runs again
    confirm the leak, and the second records where tensors are made (no run follows the verdict)."""
    sites_unknown: str | None = None
    """Why the run that confirms a leak and records sites did not record them (it failed: an
    untraced run took its place)."""
    recorded_begin: int | None = None
    """The tracker's clock as the run that recorded sites began, where it ran after the first
    (after the verdict, or as the last run that confirms a leak)."""
    result: TestResult | None = None

    @property
    def collects_between(self) -> bool:
        """Whether the run now beginning collects the whole heap first
        (:meth:`Tracker.collect_between_runs`): a run again after one that kept autograd nodes.
        Garbage the last run left on cycles is frozen through the next run otherwise, and kept
        graphs would read as growing; its bytes alone are credited by the full collection after
        the runs (a collection of the heap costs 0.1 s or more with torch loaded: not for every
        run again)."""
        runs = self.repetitions.runs
        return self.repetitions.started > 1 and bool(runs) and runs[-1].history_nodes > 0

    @property
    def clocks(self) -> list[int]:
        """The tracker's clock as each measured run began."""
        return [run.begin_clock for run in self.repetitions.runs]

    judged_after_the_runs: ClassVar[bool] = True
    """This plugin runs the test's phases, and judges its runs after the last (a failing call is
    judged too, its leak shown beside its failure)."""

    def run_torn_down(self, item: pytest.Item, check: Check) -> None:
        """A run's check has finished as it tore down: the runs are judged after the last."""

    def teardown_reported(self, item: pytest.Item, report: pytest.TestReport) -> None:
        """A run's teardown report is made: the record goes on the first run's, after the last."""

    def release(self, test: CheckedTest) -> None:
        """The runs are over: the test no longer has them, and no check keeps its call's failure
        (the exception, whose frames hold the test's locals, is read only while the runs are judged)."""
        test.runs = None
        for check in (*self.checks, test.current):
            if check is not None:
                check.failure = None

    @property
    def first_engine(self) -> LeakCheck | None:
        """The first run's check (None where no run was checked)."""
        return self.checks[0].engine if self.checks else None

    def set_up_by_the_plugin(self) -> None:
        """This plugin's own part of a run's set-up is done (it dropped the last failure's
        traceback, collected what earlier runs left on cycles, let the last run's class instance
        go): what it freed of what the first run kept is not the suite's reset."""
        if self.first_kept_refs is not None and len(self.checks) == 1:
            self.first_kept_refs = [ref for ref in self.first_kept_refs if ref() is not None]

    def body_begins(self) -> None:
        """A run's body begins, its set-up done: where it is the second run, note how much of what
        the first kept its set-up freed (see ``freed_as_set_up``)."""
        refs, self.first_kept_refs = self.first_kept_refs, None
        if refs is not None and len(self.checks) == 1:
            self.freed_as_set_up = sum(ref.nbytes for ref in refs if ref() is None)

    def made_recording_sites(self, born: int) -> bool:
        """Whether a storage first seen at ``born`` was made by the run that recorded sites after
        the verdict (not one of the runs judged)."""
        return self.extra_begin is not None and born >= self.extra_begin


@dataclass
class RunsOfAnotherPlugin(TestRuns):
    """The single run of a test whose phases another plugin runs (pytest-rerunfailures, for a test
    it may run again): judged alone as it tears down, failing its teardown, where its record goes
    too. Each of that plugin's runs is another such run."""

    judged_after_the_runs: ClassVar[bool] = False
    failed_teardown: bool = False
    """The run's leak failed its teardown (a fixture's teardown may fail it too)."""

    def run_torn_down(self, item: pytest.Item, check: Check) -> None:
        self.checks = [check]
        if _usable(check):
            self.repetitions.runs = [_run_record(check)]
        verdict = _judge(item, self)
        if verdict is not None and verdict.failing:
            _name_runs(item, self, verdict)
        self.result = finish_result(item, self, verdict)
        if verdict is not None and verdict.failing:
            self.failed_teardown = True
            raise VramLeak(_failure_text(self, verdict), pytrace=False)

    def teardown_reported(self, item: pytest.Item, report: pytest.TestReport) -> None:
        result = self.result or finish_result(item, self, None)
        if report.failed and self.failed_teardown:  # its status reads LEAKED (or OVER BUDGET)
            report.vramleak_outcome = result.verdict  # type: ignore[attr-defined]
        report.vramleak = result.to_json()  # type: ignore[attr-defined]
        record_properties(report, result)
        test = test_of(item)
        assert test is not None
        self.release(test)


def _tracker(item: pytest.Item) -> Tracker:
    tracker = session_of(item.config).tracker
    assert tracker is not None
    return tracker


def _timeout(item: pytest.Item) -> Any:
    test = test_of(item)
    return test.timeout if test is not None else None


def _settings(item: pytest.Item) -> Settings:
    settings = session_of(item.config).settings
    assert settings is not None
    return settings


def plan(item: pytest.Item, settings: Settings) -> TestRuns:
    test = test_of(item)
    assert test is not None
    budget, marked = test.budget, test.marked
    fail_on = settings.fail_on or ("any" if marked else "significant")
    leak = budget.leak if budget is not None else 0
    rule = Rule(leak, settings.tolerance, fail_on, settings.kept_floor)
    repeat = (test.repeat if test.repeat is not None else settings.repeat) if budget is not None else 1
    why_once = None
    if (repeat > 1 or settings.confirm) and budget is not None and _is_doctest(item):
        repeat, why_once = 1, "doctests are not run again (doctest clears a doctest's globals after it runs)"
    if repeat > 1:
        runs = TestRuns(Repetitions(planned=repeat, warmup=settings.warmup), rule, True)
    else:
        may_rerun = budget is not None and settings.confirm > 0 and why_once is None
        runs = TestRuns(Repetitions(planned=1, warmup=1, mode="confirm"), rule, may_rerun, settings.confirm, why_once)
    runs.sites_on_first_run = settings.sites == "on"
    return runs


def runs_of_another_plugin(item: pytest.Item, settings: Settings) -> RunsOfAnotherPlugin:
    """The run of a checked test another plugin runs (see :class:`RunsOfAnotherPlugin`)."""
    planned = plan(item, settings)
    return RunsOfAnotherPlugin(Repetitions(planned=1, warmup=1, mode="confirm"), planned.rule, may_rerun=False)


def run_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    """Run a checked test (again where a leak must be classified) and report it once (the
    session's hook calls it for checked tests only)."""
    if _run_by_another_plugin(item):
        return None
    test = test_of(item)
    assert test is not None
    runs = test.runs = plan(item, _settings(item))
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    try:
        reports = _run_checked(item, nextitem, runs)
    finally:
        runs.release(test)
    for report in reports:
        item.ihook.pytest_runtest_logreport(report=report)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


def _run_by_another_plugin(item: pytest.Item) -> bool:
    """Whether another plugin runs this test's phases itself: pytest-rerunfailures does for a test
    it may run again (``--reruns``, a ``flaky`` marker). Each of its runs is reported, so each is
    judged alone and fails in its teardown. (A plugin that runs tests itself and is called before
    this one, a conftest's for instance, takes over the same way: this hook is then not called.)"""
    if not item.config.pluginmanager.hasplugin("rerunfailures"):
        return False
    if item.get_closest_marker("flaky") is not None:
        return True
    reruns = getattr(item.config.option, "reruns", None)
    return bool(reruns)


def _ending(item: pytest.Item) -> bool:
    return bool(item.session.shouldfail or item.session.shouldstop)


def _usable(check: Check | None) -> bool:
    """Whether a run's check measured the whole test."""
    return (
        check is not None
        and check.engine is not None
        and check.started
        and check.error is None
        and check.unchecked_reason is None
        and check.engine.result.leaked_bytes is not None
    )


@dataclass
class _Runner:
    """Runs a checked test's phases once more each call, keeping each run's check and adding up
    the time each phase took over the runs."""

    item: pytest.Item
    runs: TestRuns
    parent: pytest.Item | pytest.Collector | None
    """What the runs tear down to: the test's parent where it may run again, else the next test."""
    spent: dict[str, float] = field(default_factory=dict)

    def __call__(self) -> list[pytest.TestReport]:
        again = self.runs.repetitions.started > 0
        if again:  # each run has the test's whole timeout, as the first had
            rearm(self.item, _timeout(self.item))
        self.runs.repetitions.started += 1
        with _warnings_dropped() if again else contextlib.nullcontext():
            reports = run_once(self.item, self.parent)
        for report in reports:
            self.spent[report.when] = self.spent.get(report.when, 0.0) + report.duration
        check = current_check(self.item)
        if check is not None:
            self.runs.checks.append(check)
        return reports

    @property
    def seconds(self) -> float:
        return sum(self.spent.values())


@contextlib.contextmanager
def _warnings_dropped() -> Iterator[None]:
    """Drop the warnings shown meanwhile, keeping nothing of them: pytest's warnings summary lists
    a test's first run's, as it does without the plugin (the test is counted once there, as in
    every report), and a warning's arguments (a tensor) are not held while the run is measured.
    The filters still apply: a warning made an error is raised."""
    with warnings.catch_warnings():
        warnings.showwarning = _drop_warning
        yield


OWN_FAULT = "vramleak failed (a fault of its own, to report with this line)"
"""How a check that the plugin's own error ended says so: the test keeps its outcome."""


def _drop_warning(*_: Any, **__: Any) -> None:
    """A ``warnings.showwarning`` that shows nothing."""


def _run_checked(item: pytest.Item, nextitem: pytest.Item | None, runs: TestRuns) -> list[pytest.TestReport]:
    """Run the test, again where its first run must be confirmed or as planned, judge the runs,
    name what they keep where it fails, and hand back the first run's reports with the verdict."""
    run = _Runner(item, runs, item.parent if runs.may_rerun else nextitem)
    first_reports = run()
    random_state: RandomState | None = None
    verdict: Verdict | None = None
    doing = "judging the first run"
    try:
        rearm(item, _timeout(item))
        _after_first_run(item, runs, first_reports, run.seconds)
        random_state = RandomState() if runs.repetitions.wants_more and not _ending(item) else None
        doing = "running the test again"
        _run_again(item, runs, run)
        doing = "judging the runs"
        rearm(item, _timeout(item))
        verdict = _judge_runs(item, runs, run.seconds)
        # --vramleak-fail-on=growth lists what tests keep once, with its holders: named too.
        listed = (
            verdict is not None
            and runs.rule.fail_on == "growth"
            and verdict.decision.pattern in ("kept_once", "settled")
        )
        if verdict is not None and (verdict.failing or listed):
            # A test that leaks runs once more, recording where its tensors are made (its imports are
            # done by then); then what its runs keep is named once, with that, and what PyTorch itself
            # keeps is set aside (naming walks the heap: once, not before and after the recording run).
            if _wants_sites(item, runs, verdict):
                random_state = random_state or RandomState()
                doing = "running the test again to record where its tensors are made"
                _run_recording_sites(item, runs, run, verdict)
                rearm(item, _timeout(item))
            doing = "naming what holds the memory the runs kept"
            _name_runs(item, runs, verdict, listing=listed)
    except pytest.fail.Exception as error:
        # A timeout's signal handler (pytest-timeout's) raises this wherever the process is: here,
        # in the plugin's own work. The runs end, torn down as usual, and the record says so.
        runs.cut_short, verdict = "undecided: " + cut_short(error, _timeout(item), doing), None
    except Exception as error:  # a fault of the plugin's own: this check ends, the session goes on
        runs.cut_short, verdict = f"undecided: {OWN_FAULT} while {doing}: {type(error).__name__}: {error}", None
    if random_state is not None:  # the tests after it draw the numbers they would without the plugin
        random_state.restore()
    if run.parent is not nextitem:
        _tear_down_last(item, nextitem, first_reports[-1])
    _note_threads_started(item, runs)
    _note_garbage_saver(item, runs)
    _note_modes_entered(item, runs)
    result = finish_result(item, runs, verdict)
    return _final_reports(item, runs, first_reports, result, verdict, run.spent)


def _note_threads_started(item: pytest.Item, runs: TestRuns) -> None:
    """Note the threads the test started that still run: what they make later is this test's."""
    first = runs.first_engine
    if first is None:
        return
    starters = session_of(item.config).thread_starters
    for thread in threading.enumerate():
        if (
            thread.ident is not None
            and thread.ident not in first._threads_before
            and thread is not threading.main_thread()
        ):
            starters.setdefault(thread.ident, pasteable(item.config, item.nodeid))


def _note_garbage_saver(item: pytest.Item, runs: TestRuns) -> None:
    """Note the test that turned gc.DEBUG_SAVEALL on and left it on: what gc.garbage keeps of the
    tests after it is its doing (see :func:`_set_aside_saved_garbage`)."""
    first = runs.first_engine
    session = session_of(item.config)
    if not saving_garbage():
        session.garbage_saver = None
    elif first is not None and not first.saving_garbage_before and session.garbage_saver is None:
        session.garbage_saver = pasteable(item.config, item.nodeid)


def _after_first_run(item: pytest.Item, runs: TestRuns, reports: list[pytest.TestReport], seconds: float) -> None:
    """Record what the first run left, and plan the runs that confirm a suspected leak (none where
    what it kept is known already to be PyTorch's, or to be held by its parametrize values)."""
    first, repetitions = current_check(item), runs.repetitions
    if not _usable(first):
        repetitions.stopped = why_stopped(reports) or "not checked"
        return
    assert first is not None and first.engine is not None
    runs.first_begin = first.engine.begin_clock
    repetitions.runs.append(_run_record(first))
    if (
        repetitions.mode == "confirm"
        and runs.may_rerun
        and first.engine.suspected
        and not first.call_failed
        and not _ending(item)
    ):
        runs.as_in = _kept_as_in_an_earlier_case(item, runs)
        runs.known_once = None if runs.as_in else _known_kept_once(item, runs, seconds)
        repetitions.planned = 1 if runs.as_in or runs.known_once else 1 + _confirming_runs(item, runs, first.engine)
        if repetitions.planned > 1 and first.engine.readings.names_each_storage:
            runs.first_kept_refs = _tracker(item).alive_since(first.engine.result.device, runs.first_begin)


MANY_KEPT = NAMED_EACH
"""A first run that keeps this many storages or more is confirmed by two runs again, the fewest
that tell growth from memory kept once, the second recording where tensors are made: each run
reads every tensor it makes, and naming walks a heap that holds what every run kept, so a test
keeping 10^5 tensors a run would pay seconds for each run more (one after the verdict included)."""


def _confirming_runs(item: pytest.Item, runs: TestRuns, first: LeakCheck) -> int:
    """How many runs again confirm a suspected leak: ``--vramleak-confirm``, at most two where the
    first run kept :data:`MANY_KEPT` storages or more (the last of them then records sites)."""
    kept = len(_tracker(item).alive_since(first.result.device, runs.first_begin))
    runs.kept_many = kept if kept >= MANY_KEPT else 0
    return min(runs.confirm, 2) if runs.kept_many else runs.confirm


def _run_again(item: pytest.Item, runs: TestRuns, run: _Runner) -> list[pytest.TestReport] | None:
    """The runs after the first, as planned (the last of planned repeats records where tensors are
    made; re-runs that confirm a leak do not, but where the first run kept many storages: a test
    that fails runs once more for that). The last run's reports, None where none ran; a run that
    fails stops them, and they are not used."""
    repetitions, last = runs.repetitions, None
    while repetitions.wants_more and not _ending(item):
        recording = (
            (repetitions.mode == "repeat" or (runs.kept_many and runs.sites is None))
            and repetitions.started + 1 == repetitions.planned
            and _checked_records_sites(item)
        )
        last = _recording_run(item, runs, run) if recording else run()
        stopped = _why_run_stopped(item, last)
        if stopped and recording and runs.kept_many and not _ending(item):
            # (tracing made it slower than the test's timeout, say): the runs before it still
            # count, and a run that records nothing takes its place
            runs.sites_unknown = (
                f"where the tensors were made is not known: the run that records it {stopped.removeprefix('the test ')}"
            )
            repetitions.planned += 1
            drop_last_error()
            continue
        if stopped:
            line = failure_line(last)
            repetitions.stopped = (
                f"run {repetitions.started} of {repetitions.planned} {stopped.removeprefix('the test ')}"
                + (f" ({line})" if line else "")
            )
            repetitions.rerun_failed = True
            drop_last_error()
            break
        check = current_check(item)
        assert check is not None
        repetitions.runs.append(_run_record(check, runs))
        if recording and runs.kept_many:
            runs.recorded_begin = repetitions.runs[-1].begin_clock
        if repetitions.mode == "confirm" and kept_once_already(repetitions.runs):
            repetitions.planned = repetitions.started
    return last


def _why_run_stopped(item: pytest.Item, reports: list[pytest.TestReport]) -> str | None:
    """Why a run's figures cannot be used (it failed, skipped, or was not checked); None where they can."""
    return why_stopped(reports) or (None if _usable(current_check(item)) else "was not checked")


def _judge_runs(item: pytest.Item, runs: TestRuns, seconds: float) -> Verdict | None:
    """The verdict on the runs, with what is known before naming set aside: what an earlier case
    showed to be PyTorch's, and garbage on reference cycles a full collection frees."""
    verdict = _judge(item, runs)
    if verdict is None:
        return None
    if runs.as_in is not None:
        _set_aside_as_in(runs, verdict)
    if verdict.failing:
        _credit_cycles_first(item, runs, verdict)
    if verdict.failing and verdict.decision.pattern == "kept_once" and runs.freed_as_set_up:
        _set_aside_freed_as_set_up(runs, verdict)
    if runs.known_once:
        verdict.notes.append(runs.known_once)
    if runs.sites_unknown:
        verdict.notes.append(runs.sites_unknown)
    if runs.kept_many and runs.confirm > 2:
        recorded = ", the second recording where tensors are made" if _checked_records_sites(item) else ""
        verdict.notes.append(
            f"the first run kept {runs.kept_many:,} storages: 2 runs again confirm it, not {runs.confirm}{recorded} "
            "(each run more would read and name as many)"
        )
    return verdict


def _run_recording_sites(
    item: pytest.Item, runs: TestRuns, run: _Runner, verdict: Verdict
) -> list[pytest.TestReport] | None:
    """One more run of a failing test, recording where its tensors are made: its reports, or None
    (with a note saying so) where it could not be used."""
    reports = _recording_run(item, runs, run)
    stopped = _why_run_stopped(item, reports)
    if stopped:
        verdict.notes.append(
            f"where the tensors were made is not known: the run that records it {stopped.removeprefix('the test ')}"
        )
        drop_last_error()
        return None
    last = runs.checks[-1].engine
    runs.extra_begin = runs.recorded_begin = last.begin_clock if last is not None else None
    return reports


def _tear_down_last(item: pytest.Item, nextitem: pytest.Item | None, teardown: pytest.TestReport) -> None:
    """Tear down what the runs shared, down to the next test: a failure there fails the teardown
    pytest gets (the first run's). A run again that failed in its own teardown is the plugin's
    doing: it stops the runs, and the failure says so, but it is not the test's teardown."""
    failure = finish_teardown(item, nextitem)
    if failure is not None and not teardown.failed:
        teardown.outcome, teardown.longrepr = "failed", failure


def _function_key(item: pytest.Item) -> str | None:
    """The test function a parametrized case runs (its id without the parameters), else None."""
    name: str | None = getattr(item, "originalname", None)
    if not name or name == item.name or not item.nodeid.endswith("]"):
        return None
    return item.nodeid[: len(item.nodeid) - len(item.name)] + name


def _kept_as_in_an_earlier_case(item: pytest.Item, runs: TestRuns) -> str | None:
    """The earlier case of this parametrized test whose runs showed that what its first run kept is
    PyTorch's own, where this case's first run kept storages of the same sizes with nothing in
    Python holding any of them (so this case need not run again); else None. One decision per test
    function: the runs again and the naming of a tracing constant cost seconds per case."""
    tracker = _tracker(item)
    if _read_on_the_ledger(runs) is None:
        return None
    runs.first_kept = sorted(ref.nbytes for ref in tracker.alive_since("cpu", runs.first_begin))
    key = _function_key(item)
    earlier = session_of(item.config).pytorchs_own.get(key) if key is not None else None
    if earlier is None or earlier[1] != runs.first_kept or not runs.first_kept:
        return None
    return earlier[0] if _held_from_cpp_only(tracker, runs.first_begin) else None


def _read_on_the_ledger(runs: TestRuns) -> LeakCheck | None:
    """The first run's check, where it read each storage on CPU's ledger and the rule is not
    ``any`` (which judges the first run alone): what that run kept may then be told kept once
    without running again. None elsewhere."""
    first = runs.checks[0].engine
    return first if first is not None and first.readings.names_each_storage and not runs.rule.strict else None


SLOW_RUN_SECONDS = 0.5
"""A test whose run took this long is asked who holds what it kept before it runs again."""


def _known_kept_once(item: pytest.Item, runs: TestRuns, seconds: float) -> str | None:
    """Why what the first run kept is kept once whatever runs next, so that the test need not run
    again (the note the report gives); None where only its runs can tell."""
    if _kept_in_its_parameters(item, runs, seconds):
        names = ", ".join(item.callspec.params)  # type: ignore[attr-defined]
        return (
            f"kept only in its parametrize values ({names}), which pytest keeps for the session and no other run of this "
            f"case adds to: kept once, not run again (its run took {seconds:.1f} s)"
        )
    if _kept_first_gradients(item, runs):
        return (
            "kept only the first gradients of leaves made before the test (the parameters of a model made at import "
            "or by a fixture of a wider scope), which backward accumulates into in place on every later run: kept "
            "once, not run again"
        )
    return None


def _kept_first_gradients(item: pytest.Item, runs: TestRuns) -> bool:
    """Whether all the first run kept on CPU is the first gradient (without autograd history) of
    leaves older than the test, and so little that it passes as memory kept once: a module-level
    model's parameters given gradients by the first test to run backward through it. Running the
    test again would only show that backward accumulates into them in place (a test keeping as
    much as fails it runs again, and its report names what runs again keep, as any other)."""
    first, rule = _read_on_the_ledger(runs), runs.rule
    if first is None:
        return False
    result = first.result
    if result.history_bytes or (result.graph is not None and result.graph.nodes) or result.other_leaks:
        return False
    tracker = _tracker(item)
    refs = tracker.alive_since("cpu", runs.first_begin)
    kept = sum(ref.nbytes for ref in refs)
    if kept != result.leaked_bytes or (
        rule.fail_on == "significant" and kept > rule.leak_budget and kept >= rule.floor
    ):
        return False
    try:
        return tracker.first_gradients(refs, runs.first_begin)
    except Exception:  # running again is never wrong, only slower
        return False


def _kept_in_its_parameters(item: pytest.Item, runs: TestRuns, seconds: float) -> bool:
    """Whether every tensor the first run kept on CPU is held only inside the test's own
    parametrize values (a callback's best score, a metric's cached result). pytest keeps those
    for the session, and runs the case once: it cannot add to them again, so what they keep is
    kept once, and a slow test (a DDP fit of seconds) need not run again to show it."""
    params = getattr(getattr(item, "callspec", None), "params", None)
    first = _read_on_the_ledger(runs)
    if not params or seconds < SLOW_RUN_SECONDS or first is None:
        return False
    if first.result.graph is not None and first.result.graph.nodes:
        return False  # autograd history: judged by its runs
    tracker = _tracker(item)
    tensors: list[Any] = []
    try:
        if _kept_tensors(tracker, tracker.alive_since("cpu", runs.first_begin), tensors) is None:
            return False
        return held_only_inside(tensors, list(params.values()))
    except Exception:  # running again is never wrong, only slower
        return False
    finally:
        tensors.clear()


def _set_aside_as_in(runs: TestRuns, verdict: Verdict) -> None:
    """What the first run kept, set aside as the earlier case's was (see :func:`_kept_as_in_an_earlier_case`)."""
    kept = sum(runs.first_kept or ())
    verdict.adjust = [kept]
    engine = verdict.first.engine
    assert engine is not None
    verdict.decision = _decide(runs, engine.result, verdict.adjust)
    verdict.set_aside_notes.append(
        f"{format_size(kept)} held by PyTorch itself in C++, as the runs of {runs.as_in} showed for the same storages "
        "(nothing in Python refers to them; this case was not run again; --vramleak-fail-on=any counts it): not counted"
    )


def _set_aside_freed_as_set_up(runs: TestRuns, verdict: Verdict) -> None:
    """What the first run kept, where the second run's set-up freed all of it: state the suite
    resets as each test sets up (pyro's conftest clears its parameter store in a
    ``pytest_runtest_setup`` hook), which never outlives the next test's set-up."""
    kept = runs.repetitions.runs[0].leaked_bytes if runs.repetitions.runs else 0
    if kept <= 0 or runs.freed_as_set_up < kept:
        return
    adjust = list(verdict.adjust) or [0]
    adjust[0] += kept
    verdict.adjust = adjust
    engine = verdict.first.engine
    assert engine is not None
    verdict.decision = _decide(runs, engine.result, adjust)
    verdict.set_aside_notes.append(
        f"{format_size(kept)} that the first run kept was freed as the next run set up (a pytest_runtest_setup "
        "hook or a fixture that resets state before each test): it lives until the next test sets up, "
        "not kept past it: not counted"
    )


def _run_record(check: Check, runs: TestRuns | None = None) -> Run:
    """What a run left. ``runs``: the test's runs so far, for a run after the first."""
    assert check.engine is not None
    engine = check.engine.result
    graph = engine.graph
    nodes = graph.nodes if graph is not None else 0
    first = runs.first_engine if runs is not None else None
    if runs is not None and first is not None and first is not check.engine and first.begin_graphs is not None:
        if (
            check.engine.readings.names_each_storage
        ):  # what tensors alive now keep of every run's graphs: a run may free an earlier one's
            tracker = check.engine.tracker
            nodes = tracker.kept_graph(
                threshold=first.begin_graphs, entries=tracker.entries_since_run(runs.first_begin)
            ).nodes
        elif runs.repetitions.runs:  # (accelerators: each run's own, added up)
            nodes += runs.repetitions.runs[-1].history_nodes
    return Run(engine.leaked_bytes or 0, engine.outcome, nodes, check.engine.begin_clock)


def drop_last_error() -> None:
    """pytest keeps the last failed call's traceback (and its frames' tensors) in ``sys.last_*``:
    a re-run's failure is the plugin's doing, not a traceback the user may want."""
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        sys.__dict__.pop(name, None)


@dataclass
class Verdict:
    """What the runs of a checked test come to: the decision, and what the failure text says."""

    decision: Decision
    first: Check
    raw: Decision
    """The decision before anything was set aside."""
    adjust: list[int] = field(default_factory=list)
    named: bool = False
    groups: list[Any] = field(default_factory=list)
    set_aside: list[tuple[str, list[Any]]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    set_aside_notes: list[str] = field(default_factory=list)
    """What was set aside as not the test's, and how much ("...: not counted"), after the notes."""
    shown: str = ""
    """The one run whose tensors ``groups`` are, where they are not all the runs': "run 3 of 4"."""

    @property
    def failing(self) -> bool:
        return self.decision.outcome in ("leaked", "over_budget")

    @property
    def all_notes(self) -> list[str]:
        return [*self.notes, *self.set_aside_notes]


def _decide(runs: TestRuns, first: CheckResult, adjust: Sequence[int] = ()) -> Decision:
    """The rule on the runs so far (:func:`~pytest_vramleak.judging.repeats.decide`), ``adjust``
    set aside per run; a case known to keep what it kept once (see ``known_once``) stays kept once."""
    decision = decide(runs.repetitions, first, runs.rule, device=first.device, adjust=adjust, node_bytes=NODE_BYTES)
    return replace(decision, pattern="kept_once") if runs.known_once else decision


def _judge(item: pytest.Item, runs: TestRuns) -> Verdict | None:
    """The verdict on the runs so far (None where the first run was not checked)."""
    first = runs.checks[0] if runs.checks else None
    if not _usable(first) or first is None or first.engine is None or first.budget is None:
        return None
    engine = first.engine.result
    decision = _decide(runs, engine)
    verdict = Verdict(decision, first, decision)
    credit = _credit(runs, runs.between, engine.device)
    if any(credit):  # what a run freed of an earlier run's garbage as it began
        runs.credit = verdict.adjust = credit
        verdict.decision = _decide(runs, engine, credit)
    return verdict


def _checked_records_sites(item: pytest.Item) -> bool:
    return _settings(item).sites != "off"


def _wants_sites(item: pytest.Item, runs: TestRuns, verdict: Verdict) -> bool:
    """Whether a test that ran again and leaks should run once more, recording where its tensors
    are made (what it keeps is named with that, and what PyTorch keeps for it told from what
    PyTorch made itself)."""
    repetitions = runs.repetitions
    cycles = verdict.first.engine is not None and verdict.first.engine.result.cycles_failed
    if (
        runs.sites is not None
        or repetitions.mode != "confirm"
        or (len(repetitions.runs) < 2 and not cycles)
        or repetitions.rerun_failed
    ):
        return False
    return verdict.decision.outcome == "leaked" and not _ending(item) and _checked_records_sites(item)


def _recording_run(
    item: pytest.Item, runs: TestRuns, run: Callable[[], list[pytest.TestReport]]
) -> list[pytest.TestReport]:
    """The last run of a test run again records where its tensors are made (its imports are done
    by then): what it leaves is named with that, should the test fail."""
    recorder, storages = SiteRecorder(), StorageSites()
    # where the runs keep autograd graphs, what the graphs saved is sited by the forward call that made it
    graphs = GraphSites() if _last_graph_roots(runs) else None
    runs.sites = Sites([storages, recorder, *([graphs] if graphs is not None else [])])
    runs.naming_run = True
    tracker = _tracker(item)
    # Memory only C++ holds is named by where it was made, from the user's line or from inside a
    # library (PyTorch's own, set aside): a few frames tell that, and no view is kept from Python.
    light = runs.held_in_cpp = runs.held_in_cpp if runs.cpp_known else _held_from_cpp_only(tracker, runs.first_begin)
    untraced = tracker.clock  # what was read before tracing began has no site
    tracker.age_young()  # (what the last run kept becomes older now, untraced: see Tracker.age_young)
    recorder.start(frames=FRAMES_FOR_CPP_HELD if light else FRAMES_TRACED)
    if not light:
        storages.start()
    first = runs.checks[0].meter if runs.checks else None
    device = first.name if first is not None else "cpu"
    runs.body_ended = functools.partial(_capture_as_the_body_ends, tracker, recorder, storages, device, untraced)
    try:
        if graphs is not None:
            graphs.start()
        return run()
    finally:
        runs.body_ended = None
        try:
            storages.stop()
            if graphs is not None:
                graphs.stop()
            if recorder.owns_tracing or not recorder.started_tracing:  # (not captured as the body ended)
                _capture_after_the_run(tracker, recorder, tracker.alive_since(device, runs.first_begin), untraced)
            if graphs is not None:
                graphs.capture(_last_graph_roots(runs))
        finally:  # (tracing is never left on, even where a timeout cuts the capture short)
            recorder.stop()
            runs.sites_lost = runs.sites_lost or recorder.stopped_by_others
            runs.naming_run = False


def _capture_as_the_body_ends(
    tracker: Tracker, recorder: SiteRecorder, storages: StorageSites, device: str, untraced: int
) -> None:
    """Capture the sites of what the recording run's body made as it ends, and stop tracing: what
    the check reads next (each of the body's tensors, which with 10^5 of them took seconds under
    tracing) is not traced. Only where the heap was frozen as the body began (what gc tracks
    unfrozen is then the body's); else the sites are captured after the run, as the index lists
    what it kept."""
    if not recorder.owns_tracing:
        return
    made: list[Any] | None = []
    try:
        made = tracker.made_since_freeze()
        if made is None:
            return
        storages.stop()
        # what set-up made (the index read it as the body began), then what the body made, each
        # tensor of which has its own storage
        pairs = tracker.pairs_since(tracker.alive_since(device, untraced), untraced)
        objects = [pair[0] for pair in pairs] + made
        recorder.capture_objects(objects, [pair[1] for pair in pairs] + [None] * len(made))
        pairs.clear()
        objects.clear()
    except Exception:  # tracing goes on: the sites are captured after the run, as the index lists them
        return
    finally:
        if made is not None:
            made.clear()
    recorder.stop()


def _capture_after_the_run(tracker: Tracker, recorder: SiteRecorder, alive: list[StorageRef], untraced: int) -> None:
    """Capture the sites of the tensors, and storage objects kept without one, of ``alive`` (what
    the runs keep), while tracing still knows who made each."""
    if recorder.owns_tracing:  # (the earlier runs' tensors take their group's answer: see made_inside_library)
        pairs = tracker.pairs_since(alive, untraced)
    else:
        pairs = tracker.pairs(alive) + [
            (storage, storage) for storage in (ref() for ref in alive) if storage is not None
        ]
    recorder.capture(pairs)
    pairs.clear()


def _pytorchs_own(tracker: Tracker, runs: TestRuns, refs: list[StorageRef]) -> list[Any] | None:
    """Where every storage the runs keep is a tensor nothing in Python reaches, and the run that
    recorded sites saw torch's own code make each of its tensors: the groups to set aside as
    PyTorch's (else None, and what the runs keep is named as usual)."""
    sites, since = runs.sites, runs.recorded_begin
    if sites is None or since is None:
        return None
    tensors: list[Any] = []
    try:
        owners = _kept_tensors(tracker, refs, tensors)
        if owners is None:
            return None
        made = [sites.made_inside_library(tensor) for tensor in tensors]
        if (
            not any(made)
            or any(ref.born >= since and made_here is not True for ref, made_here in zip(owners, made, strict=False))
            or False in made
        ):
            return None
        return held_in_cpp_groups(tensors, owners)
    except Exception:  # naming as usual is never wrong, only slower
        return None
    finally:
        tensors.clear()


def _kept_tensors(tracker: Tracker, refs: list[StorageRef], tensors: list[Any]) -> list[StorageRef] | None:
    """Fill ``tensors`` with the live tensors that use each of ``refs`` (the caller's list, and no
    other, holds them: another would be a holder to whoever asks who refers to them), and return
    each one's storage; None where a storage is seen through no tensor, or there is none."""
    return tracker.users_of_each(refs, tensors) or None


HELD_SAMPLE = 8
"""Storages asked about first where the runs keep more: one held from Python answers for all
(a test keeping 10^5 tensors in a list), and asking of all takes a pass over the heap in Python."""


def _held_from_cpp_only(tracker: Tracker, since: int) -> bool:
    """Whether nothing in Python refers to any tensor the runs so far keep on CPU (each storage
    seen through a tensor)."""
    refs = tracker.alive_since("cpu", since)
    if len(refs) > HELD_SAMPLE and not _none_held_from_python(tracker, refs[-HELD_SAMPLE:]):
        return False
    return _none_held_from_python(tracker, refs)


def _none_held_from_python(tracker: Tracker, refs: list[StorageRef]) -> bool:
    tensors: list[Any] = []
    try:
        with collections_paused():  # (an object or two per tensor: no collection of the heap every few hundred)
            if _kept_tensors(tracker, refs, tensors) is None:
                return False
            return len(without_python_holders(tensors)) == len({id(tensor) for tensor in tensors})
    except Exception:  # the full recording is never wrong, only slower
        return False
    finally:
        tensors.clear()


def _leak_to_name(decision: Decision, first: CheckResult) -> bool:
    """Whether the runs leaked memory or autograd history (not only another budget) to name."""
    return decision.outcome == "leaked" and bool(
        decision.pattern is not None or first.memory_leaked or first.history_bytes > 0
    )


def _name_runs(item: pytest.Item, runs: TestRuns, verdict: Verdict, *, listing: bool = False) -> None:
    """Name what the runs keep, set aside what is not the test's, and judge again without it."""
    first = verdict.first.engine
    assert first is not None
    if not (_leak_to_name(verdict.decision, first.result) or listing):
        return
    if len(runs.checks) == 1:
        _name_single_run(runs, verdict)
    else:
        if not first.readings.names_each_storage:  # the allocator counted: the rest of the heap is read now
            _tracker(item).catch_up(after_runs=runs.first_begin)
        _name_kept(item, runs, verdict)


def _name_single_run(runs: TestRuns, verdict: Verdict) -> None:
    """A test run once: its check names what it left, where it left naming to runs that did not
    happen, and the verdict is taken again without what naming set aside."""
    engine = verdict.first.engine
    assert engine is not None
    if not engine.result.named:
        engine.explain()
    verdict.groups, verdict.named = list(engine.result.groups), True
    if runs.repetitions.runs:
        runs.repetitions.runs[0].leaked_bytes = engine.result.leaked_bytes or 0  # less what explaining set aside
    verdict.decision = _decide(runs, engine.result)


def _name_kept(item: pytest.Item, runs: TestRuns, verdict: Verdict) -> None:
    """Name, in one walk of the heap, what every run keeps (each group told by the run that made
    it), set aside what is PyTorch's or pytest's in every run, judge again, and show one run's
    tensors where memory grows."""
    tracker, first = _tracker(item), verdict.first.engine
    assert first is not None
    device = first.result.device
    roots = _last_graph_roots(runs)
    # (A test whose run again failed is judged on its first run: what the others made is not named.)
    second = runs.checks[1].engine if runs.repetitions.rerun_failed else None
    refs = tracker.alive_since(device, runs.first_begin, second.begin_clock if second is not None else None)
    # What only PyTorch keeps, made by torch's own code (tracing constants), is set aside without
    # the collection and the walks of the heap that naming takes.
    autocast_open = first.result.autocast_left
    # (what C++ alone holds may be another thread's autocast cache, which naming tells)
    thread_regions = regions_in_other_threads() if runs.held_in_cpp and not autocast_open else []
    quick = _only_pytorch_may_hold(runs, verdict, bool(roots or second or autocast_open or thread_regions))
    pytorchs = _pytorchs_own(tracker, runs, refs) if quick else None
    credit = list(runs.credit) if runs.credit is not None else [0] * len(runs.repetitions.runs)
    all_freed = False
    if pytorchs is None:
        credit = _settle_before_naming(runs, tracker, device, credit)
        all_freed = bool(refs) and all(ref() is None for ref in refs)  # (as the collection left them)
        named = _name_in_one_walk(
            item, runs, verdict, refs, roots, autocast_open=autocast_open, thread_regions=thread_regions
        )
        _set_aside_older_threads(item, runs, named, refs)
        _set_aside_saved_garbage(item, runs, named)
        _set_aside_older_modes(item, runs, named)
    else:
        named = NamedLeak([], [], [(CPP_HELD, pytorchs)])
    verdict.groups, verdict.named = merge_parts(named.groups) + named.history, True
    verdict.set_aside = named.set_aside
    _set_aside(runs, verdict, named, refs, credit)
    if pytorchs is None and all_freed:
        _set_aside_garbage(item, runs, verdict, refs)
    key = _function_key(item)
    if pytorchs is not None and not verdict.failing and key is not None and runs.first_kept:
        session_of(item.config).pytorchs_own.setdefault(key, (pasteable(item.config, item.nodeid), runs.first_kept))
    _show_growing_run(runs, verdict, named)


def _settle_before_naming(runs: TestRuns, tracker: Tracker, device: str, credit: list[int]) -> list[int]:
    """Collect the whole heap before naming (the verdict's collection stands where it freed no
    storage and nothing ran since), and return the runs' credit with what it freed."""
    if tracker.settled_already():
        return credit
    tracker.settle()
    return _add_credit(runs, tracker, device)


def _only_pytorch_may_hold(runs: TestRuns, verdict: Verdict, named_otherwise: bool) -> bool:
    """Whether what the runs keep may be set aside as PyTorch's own without naming it: C++ alone
    holds it, nothing naming must look at may hold it (``named_otherwise``: a kept graph, an open
    autocast region, a failed re-run), and it is judged on memory, not on autograd history."""
    return runs.held_in_cpp and not (named_otherwise or runs.rule.strict or verdict.decision.grows_history)


def _last_graph_roots(runs: TestRuns) -> list[Any]:
    """The roots of the autograd graph the last run that kept one keeps."""
    for check in reversed(runs.checks):
        graph = check.engine.result.graph if check.engine is not None else None
        if graph is not None and graph.roots:
            return list(graph.roots)
    return []


def _name_in_one_walk(
    item: pytest.Item,
    runs: TestRuns,
    verdict: Verdict,
    refs: list[StorageRef],
    roots: list[Any],
    *,
    autocast_open: bool,
    thread_regions: list[ThreadRegion],
) -> NamedLeak:
    """Name the storages ``refs`` (none where autograd history grows: the graph is the leak) and the
    graph at ``roots``, each group told by the run that made it (the run that recorded sites counts
    as one more). ``autocast_open``: the first run left an autocast region open;
    ``thread_regions``: those open in other threads."""
    first = verdict.first.engine
    assert first is not None
    sources: list[SiteSource] = [
        *(runs.sites.sources if runs.sites is not None else ()),
        *([first.sites] if first.sites else []),
    ]
    starts = [*runs.clocks, *([runs.extra_begin] if runs.extra_begin is not None else [])]
    births = {(ref.device, ref.pointer): ref.born for ref in refs}

    def part(key: StorageKey) -> int | None:
        born = births.get(key)
        return None if born is None else run_made(starts, born)

    return name_leak(
        _tracker(item),
        first.result.device,
        refs if not verdict.decision.grows_history else [],
        roots,
        sites=Sites(sources) if sources else None,
        named=named_roots(item),
        collected=True,
        threads_before=first._threads_before,
        count_cpp_held=runs.rule.strict,
        part=part,
        autocast_open=autocast_open,
        thread_regions=thread_regions,
    )


def _set_aside(runs: TestRuns, verdict: Verdict, named: NamedLeak, refs: list[StorageRef], credit: list[int]) -> None:
    """Take off each run what naming set aside (what PyTorch holds in every run, what pytest keeps
    of the runs after the first) and the garbage credited to it, and judge the runs again."""
    verdict.set_aside_notes = []
    if not (named.set_aside or named.kept_by_pytest or any(credit)):
        return
    by_key = {(ref.device, ref.pointer): ref for ref in refs}

    def kept(groups: list[Any]) -> list[tuple[int, int]]:
        found = (by_key.get(key) for group in groups for key in group.keys)
        return [(ref.born, ref.nbytes) for ref in found if ref is not None and not runs.made_recording_sites(ref.born)]

    parts = [credit]
    for holders, groups in named.set_aside:
        parts.append(set_aside_per_run(runs.clocks, kept(groups), first_run_too=True))
        verdict.set_aside_notes.append(f"{format_size(sum(group.bytes for group in groups))} {holders}: not counted")
    # What pytest keeps of each run for the session (a warning, a record_property value) is kept
    # once by a test run once: the runs after the first do not add it up to growth.
    parts.append(set_aside_per_run(runs.clocks, kept(named.kept_by_pytest), first_run_too=False))
    verdict.adjust = [sum(per_run) for per_run in zip(*parts, strict=True)]
    engine = verdict.first.engine
    assert engine is not None
    verdict.decision = _decide(runs, engine.result, verdict.adjust)


def _set_aside_older_threads(item: pytest.Item, runs: TestRuns, named: NamedLeak, refs: list[StorageRef]) -> None:
    """Set aside the groups that threads running since before the test began made, as the run
    that recorded sites saw them made (each sampled tensor's stack starts at the thread's
    bootstrap, in the code such a thread runs, and no thread this test started runs that code):
    their memory is the test's that started the thread, which is told."""
    recorder = next((s for s in runs.sites.sources if isinstance(s, SiteRecorder)), None) if runs.sites else None
    first = runs.first_engine
    if recorder is None or first is None:
        return
    older, newer = _threads_by_entry(first._threads_before)
    if not older:
        return
    # (only the storages whose sites were captured can say which thread made them: a sample of each
    # kind where the runs keep many)
    captured = recorder.captured_pointers()
    by_key = {(ref.device, ref.pointer): ref for ref in refs if ref.pointer in captured}
    starters = session_of(item.config).thread_starters
    # Each group is decided whole, over the runs (the run that recorded sites saw its newest
    # tensors made; a thread the test started, or the test itself, would make some there too).
    for whole in merge_parts(named.groups):
        storages = [by_key[key]() for key in whole.keys if key in by_key]
        made = [recorder.made_on(storage) for storage in storages if storage is not None]
        threads = [_older_thread(entry, older, newer) for entry in made if entry is not None]
        if not threads or None in threads:
            continue
        named.groups[:] = [group for group in named.groups if group not in whole.parts]
        whose = ", ".join(
            f"thread '{thread.name}'"
            + (f", which {starters[thread.ident]} started" if thread.ident in starters else "")
            for thread in sorted({thread for thread in threads if thread is not None}, key=lambda thread: thread.name)
        )
        named.set_aside.append(
            (
                f"made by {whose}, running since before this test began (the memory is the test's that started it)",
                whole.parts,
            )
        )


def _set_aside_saved_garbage(item: pytest.Item, runs: TestRuns, named: NamedLeak) -> None:
    """Set aside the groups only ``gc.garbage`` holds where gc.DEBUG_SAVEALL was on before the test
    began: the collector keeps there the test's garbage (a harmless reference cycle) instead of
    freeing it, because of whoever turned the flag on, which is told."""
    first = runs.first_engine
    if first is None or not first.saving_garbage_before:
        return
    saver = session_of(item.config).garbage_saver
    who = f"{saver} turned it on" if saver else "turned on before this test's check"
    _set_aside_held_only(
        named,
        in_gc_garbage,
        f"kept in gc.garbage: gc.DEBUG_SAVEALL was on before this test began ({who}), and the collector keeps "
        "there what it finds unreachable instead of freeing it (the memory is not this test's)",
    )


def _set_aside_older_modes(item: pytest.Item, runs: TestRuns, named: NamedLeak) -> None:
    """Set aside the groups only modes on torch's stacks hold that were entered before the test
    began and never exited: such a mode runs on every torch call, and keeps what it records of the
    tests after it too; the memory is the test's that entered it, which is told."""
    first = runs.first_engine
    if first is None or not first.modes_before:
        return
    enterers = session_of(item.config).mode_enterers
    older = {root.label: id(root.value) for root in torch_mode_stacks() if id(root.value) in first.modes_before}
    if not older:
        return

    def by_an_older_mode(path: HolderPath) -> bool:
        return path.root.kind == "mode stack" and path.root.label in older

    whose = sorted({f"{enterers[ident]} entered it" for ident in older.values() if ident in enterers})
    _set_aside_held_only(
        named,
        by_an_older_mode,
        f"kept by a mode on torch's stack entered before this test began and not exited"
        f"{' (' + '; '.join(whose) + ')' if whose else ''}: it records what the tests after it do (the memory is "
        "not this test's)",
    )


def _set_aside_held_only(named: NamedLeak, held: Callable[[HolderPath], bool], why: str) -> None:
    """Set aside, with ``why``, the groups every holder path of which is ``held`` (each decided on
    its runs' parts joined, as naming sets aside what no test is charged for: see :func:`name_leak`)."""
    kept = groups_held(
        named.groups, lambda group: bool(group.holders) and all(held(path) for path in group.holders), parted=True
    )
    if kept:
        named.groups[:] = [group for group in named.groups if group not in kept]
        named.set_aside.append((why, kept))


def _note_modes_entered(item: pytest.Item, runs: TestRuns) -> None:
    """Note the modes the test entered on torch's stacks and left there: what they keep of the
    tests after it is its doing (see :func:`_set_aside_older_modes`)."""
    first = runs.first_engine
    if first is None:
        return
    enterers = session_of(item.config).mode_enterers
    alive = {id(mode) for *_, mode in torch_modes()}
    for ident in list(enterers):
        if ident not in alive:
            del enterers[ident]
    for ident in alive - first.modes_before:
        enterers.setdefault(ident, pasteable(item.config, item.nodeid))


def _older_thread(
    entry: tuple[str, int] | str, older: dict[Any, threading.Thread], newer: dict[Any, threading.Thread]
) -> threading.Thread | None:
    """The thread running since before the test that made a tensor, from where its thread entered
    the code it runs (``entry``, see :meth:`SiteRecorder.made_on`); None where the main thread or a
    thread the test started may have made it."""
    if not isinstance(entry, tuple) or _code_at(newer, entry) is not None:
        return None
    code = _code_at(older, entry)
    return older[code] if code is not None else None


def _threads_by_entry(before: set[int]) -> tuple[dict[Any, threading.Thread], dict[Any, threading.Thread]]:
    """The code each live thread other than the main one runs (its outermost frame below
    threading's), as ``{code: thread}`` for those running since before the test (``before``: their
    idents) and for those started since."""
    frames = sys._current_frames()
    older: dict[Any, threading.Thread] = {}
    newer: dict[Any, threading.Thread] = {}
    for thread in threading.enumerate():
        frame = frames.get(thread.ident) if thread.ident is not None and thread is not threading.main_thread() else None
        entry = None
        while frame is not None:
            if frame.f_code.co_filename != threading.__file__:
                entry = frame.f_code
            frame = frame.f_back
        if entry is not None:
            (older if thread.ident in before else newer).setdefault(entry, thread)
    return older, newer


def _code_at(codes: dict[Any, threading.Thread], entry: tuple[str, int]) -> Any:
    """The code among ``codes`` whose lines hold ``entry`` (file, line), or None."""
    filename, line = entry
    for code in codes:
        if code.co_filename == filename and any(start_line == line for _, _, start_line in code.co_lines()):
            return code
    return None


def _set_aside_garbage(item: pytest.Item, runs: TestRuns, verdict: Verdict, refs: list[StorageRef]) -> None:
    """Where the full collection before naming freed every storage the runs kept (``refs``), and as
    much memory as they kept, what they kept was garbage on reference cycles that their checks'
    collections could not reach (frozen with the heap): nothing is kept, and the runs are judged
    again with each one's memory set aside."""
    if _settings(item).strict_cycles:
        return
    freed = sum({(ref.device, ref.pointer): ref.nbytes for ref in refs}.values())
    series = runs.repetitions.series(verdict.adjust)
    if not series or freed < series[-1] or series[-1] <= 0:
        return
    engine = verdict.first.engine
    assert engine is not None
    verdict.adjust = [run.leaked_bytes for run in runs.repetitions.runs]
    verdict.decision = _decide(runs, engine.result, verdict.adjust)
    verdict.groups = [group for group in verdict.groups if group.kind == "history"]
    # pytester's in-process sessions (runpytest_inprocess, inline_run) check their own tests with
    # this plugin, whose holder search thaws and freezes the heap again: their garbage, which
    # pytester's records keep until the test ends, is then frozen out of the outer check's reach.
    inner = "pytester" in getattr(item, "fixturenames", ())
    why = (
        "the in-process pytest sessions the test ran through pytester kept their tensors until it ended, "
        "and left them as garbage that the checks' collections could not reach"
        if inner
        else "garbage on reference cycles that the checks' collections could not reach"
    )
    verdict.set_aside_notes.append(
        f"{format_size(series[-1])} the runs left was freed by a full collection after them: {why}: not counted"
    )


def _show_growing_run(runs: TestRuns, verdict: Verdict, named: NamedLeak) -> None:
    """For memory that grows, show what one run left: the run that recorded sites where it grew
    too (its tensors have them), else the last measured run that left any."""
    decision, repetitions = verdict.decision, runs.repetitions
    if decision.pattern != "grows" or decision.grows_history or not verdict.failing:
        return
    shown: list[Any] = []
    if runs.extra_begin is not None:
        shown = [group for group in named.groups if group.part == len(repetitions.runs)]
        which = _recording_run_text(repetitions)
    growing = last_growing_run(repetitions.series(verdict.adjust), repetitions.warmup)
    if not shown and growing is not None:
        shown = [group for group in named.groups if group.part == growing]
        which = f"run {growing + 1} of {len(repetitions.runs)}, the last measured run that left any"
    if shown:  # (where a run's tensors were all set aside, what all runs keep stands)
        for group in shown:
            _hold_as_earlier_runs(group, named.groups)
        verdict.groups, verdict.shown = merge_parts(shown) + named.history, which


def _hold_as_earlier_runs(group: TensorGroup, groups: list[TensorGroup]) -> None:
    """Where the alike tensors the run before ``group``'s left are held no way ``group``'s are, put
    one of their holders first (with its run): the newest object is often held twice, by what
    keeps them all and by what points at the current one (``state['active_dataloader']``, beside
    ``state['dataloader_references'][4]``), and the shortest path, the one named, may be the second."""
    before = [
        other
        for other in groups
        if other.alike == group.alike and type(other.part) is int and other.part < group.part and other.holders
    ]
    if not before:
        return
    earlier = max(before, key=lambda other: other.part)
    ways = {path.way() for path in group.holders}
    if any(path.way() in ways for path in earlier.holders):
        return
    path = next((path for path in earlier.holders if not path.opaque), None)
    if path is not None:
        group.holders.insert(0, replace(path, earlier_run=earlier.part + 1))


def _recording_run_text(repetitions: Repetitions) -> str:
    """Which run the run that recorded sites after the verdict was: one more than those judged
    (its tensors' indices in a list the test appends to are that run's)."""
    judged = len(repetitions.runs)
    return f"run {judged + 1}, which recorded where tensors are made after the {judged} above"


def _credit(runs: TestRuns, deaths: list[tuple[int, int, str]], device: str) -> list[int]:
    """After a full collection (:meth:`Tracker.settle`, or a run again as it began): from what it
    freed, the bytes each run freed that an earlier run made on a reference cycle (see
    :func:`~pytest_vramleak.judging.repeats.settled_credit`)."""
    settled = [
        (born, nbytes) for born, nbytes, where in deaths if where == device and not runs.made_recording_sites(born)
    ]
    return settled_credit(runs.clocks, settled)


def _add_credit(runs: TestRuns, tracker: Tracker, device: str) -> list[int]:
    """The runs' credit so far, and what the full collection just taken freed of their garbage."""
    credit = runs.credit or [0] * len(runs.repetitions.runs)
    return [a + b for a, b in zip(credit, _credit(runs, tracker.settled, device), strict=False)]


def _credit_cycles_first(item: pytest.Item, runs: TestRuns, verdict: Verdict) -> None:
    """Memory that grows on CPU is judged again after a full collection, before anything runs
    again to record sites or walks the heap to name holders: a test replacing an object on a
    reference cycle each run only looked like growth (the replaced ones were garbage)."""
    decision = verdict.decision
    if decision.pattern != "grows" or decision.grows_history or len(runs.checks) < 2 or verdict.first.engine is None:
        return
    engine = verdict.first.engine.result
    if not verdict.first.engine.readings.names_each_storage:
        return
    tracker = _tracker(item)
    # Garbage on a cycle refers to what it holds: memory nothing in Python refers to (what
    # PyTorch's tracing keeps in C++) was made garbage by no run, and needs no collection.
    runs.held_in_cpp, runs.cpp_known = _held_from_cpp_only(tracker, runs.first_begin), True
    if runs.held_in_cpp:
        return
    tracker.settle()
    runs.credit = _add_credit(runs, tracker, "cpu")
    if any(runs.credit):
        verdict.adjust = list(runs.credit)
        verdict.decision = _decide(runs, engine, verdict.adjust)


def finish_result(item: pytest.Item, runs: TestRuns, verdict: Verdict | None) -> TestResult:
    """The JSON record of a checked test, from its first run and the verdict on all of them."""
    first = runs.checks[0] if runs.checks else current_check(item)
    if first is None:
        return TestResult(item.nodeid, None, "unchecked", reason="not set up")
    budget = first.budget or Budget(leak=None)  # type: ignore[arg-type]
    result = TestResult(
        nodeid=item.nodeid,
        device=first.meter.name if first.meter else None,
        verdict="unchecked",
        budget={"peak": budget.peak, "leak": budget.leak},
    )
    engine = first.engine.result if first.engine is not None and first.started else None
    if engine is not None:
        result.baseline_bytes = engine.baseline_bytes
        result.peak_bytes = engine.peak_bytes
        result.peak_breakdown = engine.peak_breakdown.to_json() if engine.peak_breakdown is not None else None
    if first.budget is not None:
        result.rule = runs.rule.fail_on
    if verdict is not None and engine is not None:
        _judged_figures(result, runs, verdict, engine)
    else:
        result.reason = runs.cut_short or _unchecked_reason(first, runs.repetitions)
        if runs.cut_short and runs.repetitions.runs:
            result.repetitions = series = runs.repetitions.series()
            result.reason = (
                f"{runs.cut_short}; memory left after each run so far: {', '.join(map(format_size, series))}"
            )
    if runs.why_once:
        result.notes.append(runs.why_once)
    test = test_of(item)
    _step_figures(first, result, allowed=test is not None and test.allowed)
    return result


def _judged_figures(result: TestResult, runs: TestRuns, verdict: Verdict, engine: CheckResult) -> None:
    """The record's verdict, figures, notes and tensors, from the first run and the verdict on the runs."""
    result.verdict = verdict.decision.outcome
    result.end_bytes = engine.end_bytes
    result.leaked_bytes = max(0, (engine.leaked_bytes or 0) - (verdict.adjust[0] if verdict.adjust else 0))
    result.details = dict(engine.details)
    if engine.graph is not None and engine.graph.nodes:
        result.details["history_nodes"] = engine.graph.nodes
    result.cycle_bytes = engine.cycle_bytes
    result.trace = engine.trace
    result.notes = [note for note in engine.notes if note] + list(engine.left_behind) + verdict.all_notes
    result.ranks = [{key: value for key, value in rank.items() if key != "report"} for rank in engine.ranks]
    result.tensors = [group.to_json() for group in verdict.groups]
    result.tensors_from = verdict.shown or None
    result.tensors += [group.to_json() for groups in engine.other_groups.values() for group in groups]
    if engine.cycles_failed:
        result.tensors += [group.to_json() for group in _cycle_groups(runs, engine)]
    _runs_figures(result, runs, verdict)


def _runs_figures(result: TestResult, runs: TestRuns, verdict: Verdict) -> None:
    """What the runs after the first showed (their pattern, what each left, the growth), and where
    one failed, whether the first run alone decides the test or leaves it undecided."""
    decision, repetitions = verdict.decision, runs.repetitions
    if len(repetitions.runs) > 1 or repetitions.rerun_failed:
        result.pattern = decision.pattern
        result.repetitions = repetitions.series(verdict.adjust)
        result.repetition_warmup = repetitions.warmup
        result.growth_bytes = decision.growth_bytes
    elif runs.known_once:
        result.pattern = decision.pattern
    if repetitions.rerun_failed and repetitions.stopped:
        if undecided_without_runs(repetitions, decision, runs.rule, verdict.adjust):
            kept = format_size(repetitions.series(verdict.adjust)[0])
            result.verdict = "unchecked"
            result.reason = (
                f"undecided: the first run kept {kept}, and the runs again that tell growth from memory kept once "
                f"could not be used: {repetitions.stopped} (a run again that cannot be run as the first was: its "
                "parametrize values or the state it shares changed)"
            )
        else:
            result.notes.append(f"{RUNS_NOT_USED}: {repetitions.stopped}; judged on the first run")


def _unchecked_reason(check: Check, repetitions: Repetitions) -> str | None:
    """Why a test's first run could not be judged (an error of the plugin's own, a reason its check
    or a step check gave), and at which run it stopped."""
    reason = (
        check.error
        and f"vramleak internal error: {check.error}"
        or check.unchecked_reason
        or next((step.reason for step in check.steps if step.reason), None)
    )
    if repetitions.stopped and repetitions.started > 1 and reason:
        reason += f" (run {repetitions.started} of {repetitions.planned})"
    return reason


def _step_figures(check: Check, result: TestResult, *, allowed: bool = False) -> None:
    """A test's step checks: its verdict with them (see
    :func:`~pytest_vramleak.judging.outcome.verdict_with_steps`), and the figures of the one that
    grew (else the last). ``allowed``: the test is marked ``allow_vram_leak``."""
    result.step_verdict = step_verdict(check.steps)
    result.verdict = verdict_with_steps(
        result.verdict,
        check.steps,
        budget_checked=check.budget is not None,
        unchecked=check.unchecked_reason is not None,
        allowed=allowed,
    )
    if not check.steps:
        return
    shown = next((step for step in reversed(check.steps) if step.grows), check.steps[-1])
    _one_step_check(result, shown, allowed)
    undecided = [step.undecided for step in check.steps if step.undecided]
    if result.verdict == "unchecked" and result.reason is None:
        result.reason = next((step.reason for step in check.steps if step.reason), None) or next(iter(undecided), None)
    elif undecided and result.step_verdict != "leaked":
        result.notes += undecided


def _one_step_check(result: TestResult, step: StepResult, allowed: bool) -> None:
    """The record's figures of one step check (the one that grew, else the last): its steps, what
    it kept, its growth, where it settled. ``allowed``: the test is marked ``allow_vram_leak``."""
    if allowed and step.grows:
        result.reason = f"allowed by @pytest.mark.{EXEMPT_MARKER}: {step.describe().splitlines()[0]}"
    result.steps = list(step.steps)
    result.warmup_steps = list(step.warmup_steps)
    result.step_history_nodes = list(step.history) if step.history else None
    if step.leak is not None and not result.tensors:
        result.tensors = [group.to_json() for group in step.leak.groups]
    result.growth_bytes = step.verdict.growth_bytes if step.verdict is not None else result.growth_bytes
    result.settled_after_step = step.settled_after
    if step.settled_after is not None:
        result.notes.append(step.describe())
    result.device = result.device or step.device


def _cycle_groups(runs: TestRuns, first: CheckResult) -> list[Any]:
    """The tensors a test failing --vramleak-strict-cycles left on reference cycles, as the run that
    recorded where tensors are made found them, where it ran."""
    last = runs.checks[-1].engine
    if runs.extra_begin is not None and last is not None and last.result.cycle_groups:
        return last.result.cycle_groups
    return first.cycle_groups


def _failure_text(runs: TestRuns, verdict: Verdict) -> str:
    """The failure: the verdict's sentence, the first run's figures and notes, the runs, the tensors."""
    decision = verdict.decision
    engine = verdict.first.engine
    assert engine is not None
    first = engine.result
    # where the test ran again, the figures are its first run's: say so beside the runs' own
    figures = ("first run: " if len(runs.repetitions.runs) > 1 else "") + first.figures()
    lines = [decision.message, figures, *[note for note in first.notes if note], *verdict.all_notes]
    if first.peak_over and first.peak_breakdown is not None:
        lines.append(first.peak_breakdown.render())
    lines += first.left_behind
    if first.cycles_failed:
        lines += ["tensors freed only by the cycle collector:", render_groups(_cycle_groups(runs, first))]
    # Growth shows the runs first, then what the last of them that grew left; other leaks the
    # tensors the test keeps, then what its runs showed.
    if decision.opens_with_growth:
        lines.append(decision.about)
    if _leak_to_name(decision, first) and verdict.named and (verdict.groups or not first.cycles_failed):
        lines += _leaked_tensor_lines(runs, verdict)
    if not decision.opens_with_growth:
        lines.append(decision.about)
    if _built_once_in_a_module(verdict):
        lines.append(BUILT_ONCE)
    return "\n".join(line for line in lines if line)


BUILT_ONCE = (
    "kept once by module-level state built on first use (a table, a model or a cache a module builds lazily): "
    "whichever test touches it first keeps it. Where it is meant to stay, build it before the checks, in a "
    "session-scoped fixture the tests use (what a wider fixture makes as it sets up is not the test's), or mark "
    "the test that builds it with @pytest.mark.allow_vram_leak"
)


def _built_once_in_a_module(verdict: Verdict) -> bool:
    """Whether a failing test kept memory once (its runs again added nothing), all of it held
    from modules' globals: lazily built state, not a leak that grows."""
    stored = [group for group in verdict.groups if group.kind != "history"]
    return (
        verdict.failing
        and verdict.decision.pattern == "kept_once"
        and bool(stored)
        and all(
            group.holders
            and all(path.root.kind == "module" and not kept_by_the_interpreter(path) for path in group.holders)
            for group in stored
        )
    )


def _leaked_tensor_lines(runs: TestRuns, verdict: Verdict) -> list[str]:
    """The leaked tensors, under a heading that says which run's they are, and why none has a site."""
    if verdict.decision.opens_with_growth:
        heading = f"tensors left by {verdict.shown}:" if verdict.shown else "tensors left by the runs:"
    elif verdict.shown:
        heading = f"leaked tensors, as one run leaves them ({verdict.shown}){_listed_total(verdict)}:"
    else:
        heading = "leaked tensors:"
    lines = [heading, render_groups(verdict.groups)]
    stored = [group for group in verdict.groups if group.kind != "history"]
    if stored and not any(group.allocated_at for group in stored) and runs.sites is not None:
        lines.append(f"allocated at: not recorded: {_why_no_sites(runs)}")
    return lines


def _listed_total(verdict: Verdict) -> str:
    """What the groups listed add up to, and, where that is not the leak the failure opens with
    (the first run's), why: the groups are another run's."""
    listed = sum(group.total_bytes for group in verdict.groups if group.kind != "history")
    engine = verdict.first.engine
    return listed_total_text(listed, engine.result.leaked_bytes if engine is not None else None, "figure")


def _why_no_sites(runs: TestRuns) -> str:
    """Why the run that recorded sites knows none of the tensors listed."""
    if runs.sites_lost:
        return "the test called tracemalloc.stop(), which ended the tracing that records where tensors are made"
    if runs.sites_on_first_run:
        return "the runs that record where tensors are made made none of these"
    return (
        "the run that records where tensors are made made none of these (made by an earlier run only: "
        "--vramleak-sites=on records the first run too)"
    )


def _final_reports(
    item: pytest.Item,
    runs: TestRuns,
    reports: list[pytest.TestReport],
    result: TestResult,
    verdict: Verdict | None,
    spent: dict[str, float],
) -> list[pytest.TestReport]:
    """The first run's reports, with every run's durations, the verdict in the call's report where
    the test leaked, and the record on the teardown's."""
    for report in reports:
        report.duration = spent.get(report.when, report.duration)
    first = verdict.first if verdict is not None else (runs.checks[0] if runs.checks else None)
    call = next((report for report in reports if report.when == "call"), None)
    failure: str | None = None
    if verdict is not None and verdict.decision.outcome in ("leaked", "over_budget"):
        failure = _failure_text(runs, verdict)
    elif first is not None and first.left_early is not None and call is not None and call.passed:
        failure = first.left_early.describe()
    if failure is not None and call is not None and call.passed and not hasattr(call, "wasxfail"):
        index = reports.index(call)
        reports[index] = failed_call_report(item, call, VramLeak(failure, pytrace=False))
        reports[index].vramleak_outcome = result.verdict  # type: ignore[attr-defined]
    elif failure is not None and call is not None and call.failed:  # one failure, both reasons
        call.sections.append(("vramleak: the test also leaked", failure))
    teardown = reports[-1]
    teardown.vramleak = result.to_json()  # type: ignore[attr-defined]
    record_properties(teardown, result)
    return reports


def record_properties(teardown: pytest.TestReport, result: TestResult) -> None:
    """JUnit XML writes a test's teardown properties: CI dashboards read the figures there (pytest's
    outcome, ``vramleak_outcome``, is added as the teardown is logged: see :mod:`.outcomes`)."""
    teardown.user_properties += verdict_properties(result)
    if result.verdict == "unchecked" and result.reason:
        teardown.user_properties.append(("vramleak_reason", result.reason))
    for name in ("leaked_bytes", "peak_bytes", "growth_bytes"):
        value = getattr(result, name)
        if value is not None:
            teardown.user_properties.append((f"vramleak_{name}", value))


def named_roots(item: pytest.Item) -> list[NamedRoot]:
    """Values pytest keeps for many tests, named as the user wrote them: the test's parametrize
    values, the values of fixtures wider than a test, what pytest keeps of a test until the
    session ends (its class instance, its record_property values, the warnings it recorded), and
    what CPython and torch keep outside gc: the callbacks registered with ``atexit`` while checks
    ran, the signal handlers, the modes entered on torch's mode stacks."""
    named = []
    callspec = getattr(item, "callspec", None)
    for name, value in getattr(callspec, "params", {}).items():
        named.append(NamedRoot(f"parametrize value {name} of {item.name}", value, "parametrize", name=name))
    instance = kept_instance(item)
    if instance is not None:
        named.append(
            NamedRoot(
                f"self (the {type(instance).__name__} instance pytest keeps until the session ends)",
                instance,
                "pytest",
                role="pytest instance",
            )
        )
    named += _test_classes(item)
    if getattr(item, "user_properties", None):
        named.append(
            NamedRoot(f"record_property values of {item.name}", item.user_properties, "pytest", role="record_property")
        )
    # Warnings pytest catches while the test runs, then keeps for the session in its hook's history.
    catching = getattr(getattr(sys.modules.get("warnings"), "_showwarnmsg_impl", None), "__self__", None)
    recorded = getattr(getattr(item.config.hook, "pytest_warning_recorded", None), "_call_history", None)
    for warnings_kept in (catching, recorded):
        if type(warnings_kept) is list and warnings_kept:
            named.append(NamedRoot(PYTEST_WARNINGS, warnings_kept, "pytest", role="pytest warnings"))
    named += _failure_frames(item)
    named += [NamedRoot(label, value, "value", role="atexit") for label, value in exit_callbacks.noted()]
    named += signal_handlers()
    named += torch_mode_stacks()
    for fixturedef in session_of(item.config).fixture_defs.values():
        cached = fixturedef.cached_result
        if cached is not None and cached[0] is not None:
            named.append(
                NamedRoot(
                    f"fixture '{fixturedef.argname}' ({fixturedef.scope} scope)",
                    cached[0],
                    "fixture",
                    name=fixturedef.argname,
                )
            )
    return named


def _test_classes(item: pytest.Item) -> list[NamedRoot]:
    """The test's class and the classes it derives from, named as the test's code names them:
    what their attributes hold is kept for the session, whichever instance added to it."""
    cls = item.cls if isinstance(item, pytest.Function) else None
    if cls is None:
        return []
    unittest = sys.modules.get("unittest")
    role: RootKind = "TestCase class" if unittest is not None and issubclass(cls, unittest.TestCase) else "test class"
    return [NamedRoot(klass.__qualname__, klass, "pytest", role=role) for klass in cls.__mro__ if klass is not object]


def _failure_frames(item: pytest.Item) -> list[NamedRoot]:
    """The frames of the test's own failure, where its call failed and its exception is alive."""
    check = current_check(item)
    return [
        NamedRoot(
            f"the frame {frame.f_code.co_name}:{line} of the failure of {item.name}", frame, "pytest", role="failure"
        )
        for frame, line in traceback_frames(check.failure if check is not None else None)
    ]

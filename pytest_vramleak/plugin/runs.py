"""The runs of one checked test and the verdict on them: the first run, the runs again that
tell growth from memory kept once, the run that records where a leak's tensors are made, what
PyTorch or pytest keeps set aside, and the reports pytest gets, once."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from ..check import CPP_HELD, CheckResult, NamedLeak, name_leak
from ..holders.diagnosis import PYTEST_WARNINGS
from ..holders.referrers import NamedRoot, held_only_inside, without_python_holders
from ..holders.snapshot import held_in_cpp_groups, merge_parts
from ..judging.repeats import Decision, Repetitions, Rule, Run, decide
from ..judging.sizes import format_size
from ..judging.verdict import Budget
from ..reporting.report import TestResult, render_groups
from ..tracking.census import StorageKey
from ..tracking.sites import FRAMES_FOR_CPP_HELD, FRAMES_TRACED, SiteRecorder, Sites, SiteSource, StorageSites
from ..tracking.tracker import NODE_BYTES, StorageRef, Tracker
from .options import Settings
from .outcomes import step_verdict, verdict_properties
from .protocol import RandomState, failed_call_report, failure_line, finish_teardown, run_once, why_stopped
from .state import Check, VramLeak, pasteable, session_of


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
    foreign: bool = False
    """Another plugin runs the test's phases: the run is judged as it tears down, and fails there."""
    first_kept: list[int] | None = None
    """The sizes of the storages the first run kept, where it may run again (sorted)."""
    credit: list[int] | None = None
    """Per run, the bytes it freed of an earlier run's garbage on cycles (see :func:`_settled_credit`),
    where a full collection was taken before naming."""
    in_parameters: bool = False
    """What the first run kept is held only inside the test's own parametrize values (see
    :func:`_kept_in_its_parameters`): the test was not run again."""
    as_in: str | None = None
    """The earlier case of the same test function whose runs showed that what this case's first
    run kept, the same storages, is PyTorch's own: this case was not run again."""
    extra_begin: int | None = None
    """The tracker's clock as the run that recorded sites after the verdict began (not one of the
    runs judged: what it left is named, and not counted)."""
    result: TestResult | None = None


@dataclass
class CheckedTest:
    """One checked test: what collection planned for it, its runs while they happen, and the
    current run's check."""

    budget: Budget | None = None
    """None for a test checked only through the vramleak fixture."""
    marked: bool = False
    """Its own ``vram_budget`` marker gives its budget (judged strictly by default)."""
    repeat: int | None = None
    """Runs its marker asks for (``repeat=``); None: the session's setting."""
    skipped: bool = False
    """Skipped because its device is missing: no check is set up for it."""
    runs: TestRuns | None = None
    """Its runs, while they happen (see :mod:`~pytest_vramleak.plugin.runs`)."""
    current: Check | None = None
    """The check of its current (or last) run."""


TEST = pytest.StashKey[CheckedTest]()


def test_of(item: pytest.Item) -> CheckedTest | None:
    """The checked test an item is, if collection or the fixture made it one."""
    return item.stash.get(TEST, None)


def current_check(item: pytest.Item) -> Check | None:
    test = item.stash.get(TEST, None)
    return test.current if test is not None else None


def current_runs(item: pytest.Item) -> TestRuns | None:
    test = item.stash.get(TEST, None)
    return test.runs if test is not None else None


def _tracker(item: pytest.Item) -> Tracker:
    tracker = session_of(item.config).tracker
    assert tracker is not None
    return tracker


def _settings(item: pytest.Item) -> Settings:
    settings = session_of(item.config).settings
    assert settings is not None
    return settings


def checked(item: pytest.Item) -> bool:
    test = test_of(item)
    if test is None or test.skipped or session_of(item.config).torch_missing is not None:
        return False
    return test.budget is not None or "vramleak" in getattr(item, "fixturenames", ())


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
        return TestRuns(Repetitions(planned=repeat, warmup=settings.warmup), rule, True)
    may_rerun = budget is not None and settings.confirm > 0 and why_once is None
    return TestRuns(Repetitions(planned=1, warmup=1, mode="confirm"), rule, may_rerun, settings.confirm, why_once)


def run_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    """Run a checked test (again where a leak must be classified) and report it once."""
    if not checked(item) or _run_by_another_plugin(item):
        return None
    test = test_of(item)
    assert test is not None
    runs = test.runs = plan(item, _settings(item))
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    try:
        reports = _run_checked(item, nextitem, runs)
    finally:
        test.runs = None
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


def _run_checked(item: pytest.Item, nextitem: pytest.Item | None, runs: TestRuns) -> list[pytest.TestReport]:
    repetitions = runs.repetitions
    parent = item.parent if runs.may_rerun else nextitem
    spent: dict[str, float] = {}

    def run() -> list[pytest.TestReport]:
        repetitions.started += 1
        reports = run_once(item, parent)
        for report in reports:
            spent[report.when] = spent.get(report.when, 0.0) + report.duration
        check = current_check(item)
        if check is not None:
            runs.checks.append(check)
        return reports

    first_reports = run()
    first = current_check(item)
    last_reports = first_reports
    if _usable(first):
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
            runs.in_parameters = runs.as_in is None and _kept_in_its_parameters(item, runs, sum(spent.values()))
            repetitions.planned = 1 if runs.as_in or runs.in_parameters else 1 + runs.confirm
    else:
        repetitions.stopped = why_stopped(first_reports) or "not checked"
    random_state = RandomState() if repetitions.wants_more and not _ending(item) else None
    while repetitions.wants_more and not _ending(item):
        # Planned runs (repeat=N): the last records where tensors are made. Re-runs that confirm
        # a leak do not: a test that fails runs once more for that (below).
        recording = (
            repetitions.mode == "repeat"
            and repetitions.started + 1 == repetitions.planned
            and _checked_records_sites(item)
        )
        reports = _recording_run(item, runs, run) if recording else run()
        last_reports = reports
        check = current_check(item)
        stopped = why_stopped(reports) or (None if _usable(check) else "was not checked")
        if stopped:
            line = failure_line(reports)
            repetitions.stopped = (
                f"run {repetitions.started} of {repetitions.planned} {stopped.removeprefix('the test ')}"
                + (f" ({line})" if line else "")
            )
            repetitions.rerun_failed = True
            drop_last_error()
            break
        assert check is not None
        repetitions.runs.append(_run_record(check, runs))
        if repetitions.mode == "confirm" and _kept_once_already(repetitions):
            repetitions.planned = repetitions.started
    verdict = _judge(item, runs)
    if verdict is not None and runs.as_in is not None:
        _set_aside_as_in(runs, verdict)
    if verdict is not None and verdict.failing:
        _credit_cycles_first(item, runs, verdict)
    if verdict is not None and runs.in_parameters:
        names = ", ".join(item.callspec.params)  # type: ignore[attr-defined]
        verdict.notes.append(
            f"kept only in its parametrize values ({names}), which pytest keeps for the session and no other run of this case "
            f"adds to: kept once, not run again (its run took {sum(spent.values()):.1f} s)"
        )
    # --vramleak-fail-on=growth lists what tests keep once, with its holders: named too.
    listed = (
        verdict is not None and runs.rule.fail_on == "growth" and verdict.decision.pattern in ("kept_once", "settled")
    )
    if verdict is not None and (verdict.failing or listed):
        # A test that leaks runs once more, recording where its tensors are made (its imports are
        # done by then); then what its runs keep is named once, with that, and what PyTorch itself
        # keeps is set aside (naming walks the heap: once, not before and after the recording run).
        if _wants_sites(item, runs, verdict):
            random_state = random_state or RandomState()
            reports = _recording_run(item, runs, run)
            stopped = why_stopped(reports) or (None if _usable(current_check(item)) else "was not checked")
            if stopped:
                verdict.notes.append(
                    f"where the tensors were made is not known: the run that records it {stopped.removeprefix('the test ')}"
                )
                drop_last_error()
            else:
                last_reports = reports
                runs.extra_begin = runs.checks[-1].engine.begin_clock if runs.checks[-1].engine is not None else None
        _name_runs(item, runs, verdict, listing=listed)
    if random_state is not None:  # the tests after it draw the numbers they would without the plugin
        random_state.restore()
    if parent is not nextitem:
        finish_teardown(item, nextitem, last_reports[-1])
        if last_reports is not first_reports and last_reports[-1].failed and not first_reports[-1].failed:
            first_reports[-1].outcome, first_reports[-1].longrepr = "failed", last_reports[-1].longrepr
    result = finish_result(item, runs, verdict)
    return _final_reports(item, runs, first_reports, result, verdict, spent)


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
    first = runs.checks[0].engine
    if first is None or not first.readings.names_each_storage or runs.rule.strict:
        return None
    runs.first_kept = sorted(ref.nbytes for ref in tracker.alive_since("cpu", runs.first_begin))
    key = _function_key(item)
    earlier = session_of(item.config).pytorchs_own.get(key) if key is not None else None
    if earlier is None or earlier[1] != runs.first_kept or not runs.first_kept:
        return None
    return earlier[0] if _held_from_cpp_only(tracker, runs.first_begin) else None


SLOW_RUN_SECONDS = 0.5
"""A test whose run took this long is asked who holds what it kept before it runs again."""


def _kept_in_its_parameters(item: pytest.Item, runs: TestRuns, seconds: float) -> bool:
    """Whether every tensor the first run kept on CPU is held only inside the test's own
    parametrize values (a callback's best score, a metric's cached result). pytest keeps those
    for the session, and runs the case once: it cannot add to them again, so what they keep is
    kept once, and a slow test (a DDP fit of seconds) need not run again to show it."""
    params = getattr(getattr(item, "callspec", None), "params", None)
    first = runs.checks[0].engine
    if (
        not params
        or seconds < SLOW_RUN_SECONDS
        or first is None
        or not first.readings.names_each_storage
        or runs.rule.strict
    ):
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
    verdict.notes.append(
        f"{format_size(kept)} held by PyTorch itself in C++, as the runs of {runs.as_in} showed for the same storages "
        "(nothing in Python refers to them; this case was not run again; --vramleak-fail-on=any counts it): not counted"
    )


def _kept_once_already(repetitions: Repetitions) -> bool:
    """Confirming re-runs stop once two in a row after the first added nothing at all (no byte,
    no autograd node): memory kept once, whatever the runs left would follow. (A test that grows
    only every third run or less often then reads as kept once.)"""
    runs = repetitions.runs
    return len(runs) >= 3 and all(
        run.leaked_bytes <= 0 and run.history_nodes <= before.history_nodes
        for before, run in zip(runs[1:], runs[2:], strict=False)
    )


def _run_record(check: Check, runs: TestRuns | None = None) -> Run:
    """What a run left. ``runs``: the test's runs so far, for a run after the first."""
    assert check.engine is not None
    engine = check.engine.result
    graph = engine.graph
    nodes = graph.nodes if graph is not None else 0
    first = runs.checks[0].engine if runs is not None and runs.checks else None
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
    shown: str = ""
    """The one run whose tensors ``groups`` are, where they are not all the runs': "run 3 of 4"."""

    @property
    def failing(self) -> bool:
        return self.decision.outcome in ("leaked", "over_budget")


def _decide(runs: TestRuns, first: CheckResult, adjust: Sequence[int] = ()) -> Decision:
    """The rule on the runs so far (:func:`~pytest_vramleak.judging.repeats.decide`), ``adjust``
    set aside per run; a case judged by what its parametrize values keep stays kept once."""
    decision = decide(runs.repetitions, first, runs.rule, device=first.device, adjust=adjust, node_bytes=NODE_BYTES)
    return replace(decision, pattern="kept_once") if runs.in_parameters else decision


def _judge(item: pytest.Item, runs: TestRuns) -> Verdict | None:
    """The verdict on the runs so far (None where the first run was not checked)."""
    first = runs.checks[0] if runs.checks else None
    if not _usable(first) or first is None or first.engine is None or first.budget is None:
        return None
    engine = first.engine.result
    decision = _decide(runs, engine)
    return Verdict(decision, first, decision)


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
    runs.sites = Sites([storages, recorder])
    runs.naming_run = True
    tracker = _tracker(item)
    # Memory only C++ holds is named by where it was made, from the user's line or from inside a
    # library (PyTorch's own, set aside): a few frames tell that, and no view is kept from Python.
    light = runs.held_in_cpp = runs.held_in_cpp if runs.cpp_known else _held_from_cpp_only(tracker, runs.first_begin)
    recorder.start(frames=FRAMES_FOR_CPP_HELD if light else FRAMES_TRACED)
    if not light:
        storages.start()
    try:
        return run()
    finally:
        storages.stop()
        alive = tracker.alive_since("cpu", runs.first_begin)
        # tensors, and storage objects kept without one: who made each, while tracing still knows
        recorder.capture(
            tracker.pairs(alive) + [(storage, storage) for storage in (ref() for ref in alive) if storage is not None]
        )
        recorder.stop()
        runs.naming_run = False


def _pytorchs_own(tracker: Tracker, runs: TestRuns, refs: list[StorageRef]) -> list[Any] | None:
    """Where every storage the runs keep is a tensor nothing in Python reaches, and the run that
    recorded sites saw torch's own code make each of its tensors: the groups to set aside as
    PyTorch's (else None, and what the runs keep is named as usual)."""
    sites, since = runs.sites, runs.extra_begin
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
    owners: list[StorageRef] = []
    for ref in refs:
        count = len(tensors)
        tensors += tracker.users([ref])
        if len(tensors) == count:
            return None
        owners += [ref] * (len(tensors) - count)
    return owners or None


def _held_from_cpp_only(tracker: Tracker, since: int) -> bool:
    """Whether nothing in Python refers to any tensor the runs so far keep on CPU (each storage
    seen through a tensor)."""
    tensors: list[Any] = []
    try:
        if _kept_tensors(tracker, tracker.alive_since("cpu", since), tensors) is None:
            return False
        return len(without_python_holders(tensors)) == len({id(tensor) for tensor in tensors})
    except Exception:  # the full recording is never wrong, only slower
        return False
    finally:
        tensors.clear()


def _name_runs(item: pytest.Item, runs: TestRuns, verdict: Verdict, *, listing: bool = False) -> None:
    """Name what the runs keep, set aside what is not the test's, and judge again without it."""
    first = verdict.first
    assert first.engine is not None
    engine = first.engine.result
    leaked = verdict.decision.outcome == "leaked" and (
        engine.memory_leaked or verdict.decision.pattern is not None or engine.history_bytes
    )
    if not (leaked or listing):
        return
    if len(runs.checks) == 1:
        if not engine.named:
            first.engine.explain()  # a test run once whose check left naming to runs that did not happen
        verdict.groups, verdict.named = list(engine.groups), True
        if runs.repetitions.runs:
            runs.repetitions.runs[0].leaked_bytes = engine.leaked_bytes or 0  # less what explaining set aside
        verdict.decision = _decide(runs, engine)
        return
    device = engine.device
    last = runs.checks[-1]
    if (
        not first.engine.readings.names_each_storage
    ):  # the last run's check named what it left, while the allocator's index was at hand
        if last.engine is not None:
            verdict.groups, verdict.named = list(last.engine.result.groups), True
        return
    tracker = _tracker(item)
    roots: list[Any] = []
    for check in reversed(runs.checks):
        graph = check.engine.result.graph if check.engine is not None else None
        if graph is not None and graph.roots:
            roots = list(graph.roots)
            break
    # (A test whose run again failed is judged on its first run: what the others made is not named.)
    second = runs.checks[1].engine if runs.repetitions.rerun_failed else None
    until = second.begin_clock if second is not None else None
    # What only PyTorch keeps, made by torch's own code (tracing constants), is set aside without
    # the collection and the walks of the heap that naming takes.
    pytorchs = None
    if (
        runs.held_in_cpp
        and not runs.rule.strict
        and not roots
        and second is None
        and not verdict.decision.grows_history
    ):
        pytorchs = _pytorchs_own(tracker, runs, tracker.alive_since(device, runs.first_begin))
    clocks = [run.begin_clock for run in runs.repetitions.runs]
    credit = list(runs.credit) if runs.credit is not None else [0] * len(clocks)
    if pytorchs is None:
        tracker.settle()
        credit = [a + b for a, b in zip(credit, _settled_credit(tracker, runs, device), strict=False)]
    sources: list[SiteSource] = [
        *(runs.sites.sources if runs.sites is not None else ()),
        *([first.engine.sites] if first.engine.sites else []),
    ]
    name = functools.partial(
        name_leak,
        tracker,
        device,
        sites=Sites(sources) if sources else None,
        named=named_roots(item),
        collected=True,
        threads_before=first.engine._threads_before,
        count_cpp_held=runs.rule.strict,
    )
    # Everything the runs keep is named once, to set aside what is PyTorch's in every run ...
    refs = tracker.alive_since(device, runs.first_begin, until)
    # Named per run, in one walk of the heap: the run shown below is one of them.
    starts = [*clocks, *([runs.extra_begin] if runs.extra_begin is not None else [])]
    births = {(ref.device, ref.pointer): ref.born for ref in refs}
    run_of = functools.partial(_run_index, starts, births)
    if pytorchs is not None:
        named = NamedLeak([], [], [(CPP_HELD, pytorchs)])
    else:
        named = name(refs if not verdict.decision.grows_history else [], roots, part=run_of)
    verdict.groups, verdict.named = merge_parts(named.groups) + named.history, True
    verdict.set_aside = named.set_aside
    verdict.notes = [note for note in verdict.notes if not note.endswith(": not counted")]
    if named.set_aside or named.kept_by_pytest or any(credit):
        by_key = {(ref.device, ref.pointer): ref for ref in refs}
        adjust = list(credit)

        def take_out(groups: list[Any], *, first_run_too: bool) -> None:
            for group in groups:
                for key in group.keys:
                    ref = by_key.get(key)
                    if ref is None or (runs.extra_begin is not None and ref.born >= runs.extra_begin):
                        continue  # made by the run that recorded sites: not one of the runs judged
                    index = max((i for i, clock in enumerate(clocks) if clock <= ref.born), default=None)
                    if index is not None and (first_run_too or index > 0):
                        adjust[index] += ref.nbytes

        for holders, groups in named.set_aside:
            take_out(groups, first_run_too=True)
            verdict.notes.append(f"{format_size(sum(group.bytes for group in groups))} {holders}: not counted")
        # What pytest keeps of each run for the session (a warning, a record_property value) is
        # kept once by a test run once: the runs after the first do not add it up to growth.
        take_out(named.kept_by_pytest, first_run_too=False)
        verdict.adjust = adjust
        verdict.decision = _decide(runs, engine, adjust)
    key = _function_key(item)
    if pytorchs is not None and not verdict.failing and key is not None and runs.first_kept:
        session_of(item.config).pytorchs_own.setdefault(key, (pasteable(item.config, item.nodeid), runs.first_kept))
    # ... and, for memory that grows, what the last measured run that left any left is shown.
    decision, repetitions = verdict.decision, runs.repetitions
    if decision.pattern == "grows" and not decision.grows_history and verdict.failing:
        series = repetitions.series(verdict.adjust)
        leaving = [
            index
            for index in range(repetitions.warmup, len(series))
            if series[index] > (series[index - 1] if index else 0)
        ]
        shown: list[Any] = []
        if runs.extra_begin is not None:  # the run that recorded sites, where it grew too: its tensors have them
            shown, which = (
                [group for group in named.groups if group.part == len(clocks)],
                "the run that recorded where tensors are made",
            )
        if not shown and leaving:
            shown, which = (
                [group for group in named.groups if group.part == leaving[-1]],
                f"run {leaving[-1] + 1} of {len(repetitions.runs)}",
            )
        if shown:  # (where a run's tensors were all set aside, what all runs keep stands)
            verdict.groups, verdict.shown = merge_parts(shown) + named.history, which


def _settled_credit(tracker: Tracker, runs: TestRuns, device: str) -> list[int]:
    """After a full collection (:meth:`Tracker.settle`): the bytes each run freed that an earlier
    run made on a reference cycle. An object a run made on a cycle, which the next run replaced,
    is freed only by a full collection: it counts as freed by the run after the one that made it."""
    clocks = [run.begin_clock for run in runs.repetitions.runs]
    credit = [0] * len(clocks)
    for born, nbytes, where in tracker.settled:
        made = max((index for index, clock in enumerate(clocks) if clock <= born), default=None)
        if (
            where == device
            and made is not None
            and made + 1 < len(clocks)
            and not (runs.extra_begin is not None and born >= runs.extra_begin)
        ):
            credit[made + 1] += nbytes
    return credit


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
    runs.credit = _settled_credit(tracker, runs, "cpu")
    if any(runs.credit):
        verdict.adjust = list(runs.credit)
        verdict.decision = _decide(runs, engine, verdict.adjust)


def _run_index(starts: list[int], born: dict[StorageKey, int], key: StorageKey) -> int | None:
    """Which run (by the clocks the runs began at) made the storage at ``key``."""
    clock = born.get(key)
    return None if clock is None else max((index for index, start in enumerate(starts) if start <= clock), default=None)


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
    repetitions = runs.repetitions
    if first.budget is not None:
        result.rule = runs.rule.fail_on
    if verdict is not None and engine is not None:
        decision = verdict.decision
        result.verdict = decision.outcome
        result.end_bytes = engine.end_bytes
        result.leaked_bytes = max(0, (engine.leaked_bytes or 0) - (verdict.adjust[0] if verdict.adjust else 0))
        result.details = dict(engine.details)
        if engine.graph is not None and engine.graph.nodes:
            result.details["history_nodes"] = engine.graph.nodes
        result.cycle_bytes = engine.cycle_bytes
        result.trace = engine.trace
        result.notes = [note for note in engine.notes if note] + list(engine.left_behind) + verdict.notes
        result.ranks = [{key: value for key, value in rank.items() if key != "report"} for rank in engine.ranks]
        result.tensors = [group.to_json() for group in verdict.groups]
        result.tensors += [group.to_json() for groups in engine.other_groups.values() for group in groups]
        if engine.cycles_failed:
            result.tensors += [group.to_json() for group in _cycle_groups(runs, engine)]
        if len(repetitions.runs) > 1 or repetitions.rerun_failed:
            result.pattern = decision.pattern
            result.repetitions = repetitions.series(verdict.adjust)
            result.repetition_warmup = repetitions.warmup
            result.growth_bytes = decision.growth_bytes
        elif runs.in_parameters:
            result.pattern = decision.pattern
        if repetitions.rerun_failed and repetitions.stopped:
            result.notes.append(
                f"the runs after the first were not used: {repetitions.stopped}; judged on the first run"
            )
    else:
        check = first
        result.reason = (
            check.error
            and f"vramleak internal error: {check.error}"
            or check.unchecked_reason
            or next((step.reason for step in check.steps if step.reason), None)
        )
        if repetitions.stopped and repetitions.started > 1 and result.reason:
            result.reason += f" (run {repetitions.started} of {repetitions.planned})"
    if runs.why_once:
        result.notes.append(runs.why_once)
    _step_figures(first, result)
    return result


def _step_figures(check: Check, result: TestResult) -> None:
    """A test's step checks: the figures of the one that grew (else the last)."""
    result.step_verdict = step_verdict(check.steps, check.step_leaked)
    if check.step_leaked and result.verdict == "unchecked":
        result.verdict = "leaked"
    if not check.steps:
        return
    last = next((step for step in reversed(check.steps) if step.grows), check.steps[-1])
    if check.step_leaked:
        result.verdict = "leaked"
    elif (
        result.verdict == "unchecked"
        and check.budget is None
        and any(step.verdict is not None and not step.undecided for step in check.steps)
        and check.unchecked_reason is None
    ):
        result.verdict = "passed"  # checked through the fixture alone
    result.steps = list(last.steps)
    result.warmup_steps = list(last.warmup_steps)
    result.step_history_nodes = list(last.history) if last.history else None
    if last.leak is not None and not result.tensors:
        result.tensors = [group.to_json() for group in last.leak.groups]
    result.growth_bytes = last.verdict.growth_bytes if last.verdict is not None else result.growth_bytes
    result.settled_after_step = last.settled_after
    if last.settled_after is not None:
        result.notes.append(last.describe())
    result.device = result.device or last.device
    undecided = [step.undecided for step in check.steps if step.undecided]
    if result.verdict == "unchecked" and result.reason is None:
        result.reason = next((step.reason for step in check.steps if step.reason), None) or next(iter(undecided), None)
    elif undecided and not check.step_leaked:
        result.notes += undecided


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
    lines = [decision.message, first.figures(), *[note for note in first.notes if note], *verdict.notes]
    if first.peak_over and first.peak_breakdown is not None:
        lines.append(first.peak_breakdown.render())
    lines += first.left_behind
    if first.cycles_failed:
        lines += ["tensors freed only by the cycle collector:", render_groups(_cycle_groups(runs, first))]
    growth_first = (
        decision.pattern == "grows" and not decision.grows_history and not decision.message.startswith("leaked ")
    )
    if decision.about and growth_first:  # the runs, then what the last of them that grew left
        lines.append(decision.about)
    leaked = decision.outcome == "leaked" and (
        decision.pattern is not None or first.memory_leaked or first.history_bytes > 0
    )
    if leaked and verdict.named and (verdict.groups or not first.cycles_failed):
        groups = verdict.groups
        if growth_first:
            heading = "tensors left by the last measured run that left any:"
        elif verdict.shown:
            heading = f"leaked tensors, as one run leaves them ({verdict.shown}):"
        else:
            heading = "leaked tensors:"
        lines += [heading, render_groups(groups)]
        stored = [group for group in groups if group.kind != "history"]
        if stored and not any(group.allocated_at for group in stored) and runs.sites is not None:
            lines.append(
                "allocated at: not recorded: the run that records where tensors are made made none of these (made by an "
                "earlier run only: --vramleak-sites=on records the first run too)"
            )
    if decision.about and not growth_first:  # the tensors the test keeps, then what its runs showed
        lines.append(decision.about)
    return "\n".join(line for line in lines if line)


def judge_foreign_run(item: pytest.Item, runs: TestRuns, check: Check) -> None:
    """A run another plugin runs: judged alone, failing its teardown (where the record goes too)."""
    runs.checks = [check]
    if _usable(check):
        runs.repetitions.runs = [_run_record(check)]
    verdict = _judge(item, runs)
    if verdict is not None and verdict.failing:
        _name_runs(item, runs, verdict)
    runs.result = finish_result(item, runs, verdict)
    if verdict is not None and verdict.failing:
        raise VramLeak(_failure_text(runs, verdict), pytrace=False)


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
    for name in ("leaked_bytes", "peak_bytes", "growth_bytes"):
        value = getattr(result, name)
        if value is not None:
            teardown.user_properties.append((f"vramleak_{name}", value))


def named_roots(item: pytest.Item) -> list[NamedRoot]:
    """Values pytest keeps for many tests, named as the user wrote them: the test's parametrize
    values, the values of fixtures wider than a test, and what pytest keeps of a test until the
    session ends (its class instance, its record_property values, the warnings it recorded)."""
    named = []
    callspec = getattr(item, "callspec", None)
    for name, value in getattr(callspec, "params", {}).items():
        named.append(NamedRoot(f"parametrize value {name} of {item.name}", value, "parametrize"))
    instance = getattr(item, "instance", None)
    if instance is not None:
        named.append(
            NamedRoot(
                f"self (the {type(instance).__name__} instance pytest keeps until the session ends)", instance, "pytest"
            )
        )
    if getattr(item, "user_properties", None):
        named.append(NamedRoot(f"record_property values of {item.name}", item.user_properties, "pytest"))
    # Warnings pytest catches while the test runs, then keeps for the session in its hook's history.
    catching = getattr(getattr(sys.modules.get("warnings"), "_showwarnmsg_impl", None), "__self__", None)
    recorded = getattr(getattr(item.config.hook, "pytest_warning_recorded", None), "_call_history", None)
    for warnings_kept in (catching, recorded):
        if type(warnings_kept) is list and warnings_kept:
            named.append(NamedRoot(PYTEST_WARNINGS, warnings_kept, "pytest"))
    for fixturedef in session_of(item.config).fixture_defs.values():
        cached = fixturedef.cached_result
        if cached is not None and cached[0] is not None:
            named.append(NamedRoot(f"fixture '{fixturedef.argname}' ({fixturedef.scope} scope)", cached[0], "fixture"))
    return named

"""The pytest layer: options, the marker, the ``vramleak`` fixture and the hooks that run checks.

Everything that measures, decides, names or writes lives in plain modules; this one only wires
them into pytest's phases:

- setup: after the test's fixtures are set up, collect young garbage and take the baseline;
- call: watch the peak while the test body runs (when a peak budget asks for it, or for free on
  accelerators);
- teardown: after function-scoped fixtures are torn down, measure again; a leak fails the test
  in its teardown phase, reported as LEAKED with the holders named.

Where the rest lives: :mod:`~pytest_vramleak.plugin.runs` (a checked test's runs and the verdict on
them), :mod:`~pytest_vramleak.plugin.state` (what hooks and runs share: the stash keys, one test's check,
the meter), :mod:`~pytest_vramleak.plugin.marker`, :mod:`~pytest_vramleak.plugin.fixture`,
:mod:`~pytest_vramleak.plugin.leftovers` (fixtures' tensors after teardown, older tensors changed
between checks), :mod:`~pytest_vramleak.plugin.summary` (the terminal's lines) and
:mod:`~pytest_vramleak.plugin.outputs` (the files a run writes).
"""

from __future__ import annotations

import functools
import gc
import importlib.util
import os
import sys
from collections.abc import Generator
from typing import Any

import pytest

from ..check import LeakCheck, Rules
from ..holders.snapshot import memory_contents
from ..judging.verdict import Budget
from ..meters.devices import CudaMeter, is_out_of_memory, pin_worker
from ..meters.release import ReleaseScheduler
from ..tracking.tracker import Tracker
from . import fixture
from .leftovers import DRIFT, DRIFT_SPAN, FIXTURES, FixtureMemory, fixture_leftovers, look_for_drift
from .marker import parse_marker
from .options import OPTIONS, OptionError, Settings
from .options import read_settings as read_options
from .outputs import trace_folder, write_outputs
from .runs import (
    PYTORCHS_OWN,
    RUNS,
    checked,
    drop_last_error,
    finish_result,
    judge_foreign_run,
    named_roots,
    plan,
    record_properties,
    run_protocol,
)
from .state import (
    ACTIVE,
    BUDGET,
    CHECK,
    EXEMPT_MARKER,
    FIXTURE_DEFS,
    MARKED,
    MARKER,
    NOT_WRITTEN,
    OUTPUT_ERRORS,
    RESULTS,
    SETTINGS,
    SKIPPED,
    TORCH_MISSING,
    TRACKER,
    Check,
    VramLeak,
    check_device_option,
    drop_fixture_values,
    import_torch,
    meter_for,
    option_and_source,
    pasteable,
    skipped_by_mark,
    why_unavailable,
)
from .summary import header_notes, header_settings, idle_options, latest, status_word, summary_lines

vramleak = fixture.vramleak
"""The ``vramleak`` fixture (see :mod:`pytest_vramleak.plugin.fixture`): pytest finds fixtures in the plugin's module."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("vramleak", "tensor memory leak checks (pytest-vramleak)")
    for option in OPTIONS:
        if option.flag:
            group.addoption(option.cli, action="store_true", default=None, help=option.cli_help)
        else:
            action = "append" if option.repeat else "store"
            group.addoption(option.cli, action=action, default=None, metavar=option.metavar, help=option.cli_help)
        if option.repeat:
            parser.addini(option.ini, option.help, type="args", default=[])
        else:
            parser.addini(option.ini, option.help, type="string", default=option.default)


def read_settings(config: pytest.Config) -> Settings:
    """Read and check every option; a bad value is a usage error naming its source."""
    try:
        return read_options(functools.partial(option_and_source, config), config.rootpath)
    except OptionError as error:
        raise pytest.UsageError(str(error)) from None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(peak=None, *, leak=0, device=None, repeat=None, reserved=None, pinned=None): fail the test if it leaves more than `leak` bytes "
        "of tensor memory allocated after teardown, or holds more than `peak` bytes above its baseline "
        "during the call. Sizes are bytes or strings like '512 MiB'. device: auto|cpu|cuda|cuda:N|mps|xpu. "
        "repeat: run the test N times and classify what it leaves (grows, kept_once, settled). "
        "reserved, pinned (CUDA): bound the caching allocator's reserved memory and pinned host memory during the call.",
    )
    config.addinivalue_line("markers", f"{EXEMPT_MARKER}: exempt this test from the leak check of --vramleak.")
    config.stash[SETTINGS] = settings = read_settings(config)
    config.stash[TORCH_MISSING] = missing = _torch_missing()
    if missing is not None and settings.every_test:
        # A run asked to check every test must not pass having checked none.
        raise pytest.UsageError(
            f"--vramleak checks tensor memory, and {missing}: install torch, or run without --vramleak"
        )
    if missing is None and settings.device not in ("auto", "cpu"):
        check_device_option(config, settings.device)
    config.stash[RESULTS] = []
    config.stash[PYTORCHS_OWN] = {}
    config.stash[OUTPUT_ERRORS] = []
    config.stash[TRACKER] = Tracker(defer=True)  # what checks defer is compared between tests (look_for_drift)
    config.stash[FIXTURES] = []
    config.pluginmanager.register(_Recorder(config.stash[RESULTS]), "vramleak-recorder")
    config.pluginmanager.register(_XdistController(config), "vramleak-xdist")
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and config.stash[SETTINGS].pin_workers:
        torch = import_torch()
        if torch is not None:
            pin_worker(str(workerinput.get("workerid", "")), torch, os.environ)
    fraction = config.stash[SETTINGS].release_above
    if fraction is not None:
        config.pluginmanager.register(_Releaser(config, fraction), "vramleak-releaser")


def _torch_missing() -> str | None:
    """Why torch cannot be imported, found without importing it (importing it takes seconds)."""
    try:
        found = importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        found = False
    return None if found else "torch is not installed"


def pytest_report_header(config: pytest.Config) -> str | list[str]:
    missing = config.stash.get(TORCH_MISSING, None)
    if missing is not None:
        return f"vramleak: {missing}: tests marked {MARKER} and the vramleak fixture run unchecked"
    return ["vramleak: " + header_settings(config), *header_notes(config)]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    settings = config.stash[SETTINGS]
    if config.stash.get(TORCH_MISSING, None) is not None:
        return  # nothing can be checked: every test runs as without the plugin
    unavailable: dict[str, str | None] = {}
    for item in items:
        mark = item.get_closest_marker(MARKER)
        if item.get_closest_marker(EXEMPT_MARKER) is not None:
            item.stash[BUDGET] = None
        elif mark is not None:
            item.stash[BUDGET] = parse_marker(item, mark)
            item.stash[MARKED] = True
        elif settings.every_test:
            item.stash[BUDGET] = Budget(leak=settings.default_leak)
        budget = item.stash.get(BUDGET, None)
        if budget is None and "vramleak" not in getattr(item, "fixturenames", ()):
            continue
        # A device a marker asks for that is not there skips the test, with the reason, where the test is.
        spec = (budget.device if budget else None) or settings.device
        if spec in ("auto", "cpu"):
            continue
        if spec not in unavailable:
            unavailable[spec] = why_unavailable(spec)
        reason = unavailable[spec]
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))
            item.stash[SKIPPED] = True


@pytest.hookimpl
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    """Run a checked test (again where a leak must be classified) and report it once."""
    return run_protocol(item, nextitem)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    budget = item.stash.get(BUDGET, None)
    tracker = item.config.stash[TRACKER]
    runs = item.stash.get(RUNS, None)
    if runs is None and checked(item):  # another plugin runs the test: each run is judged alone
        runs = item.stash[RUNS] = plan(item, item.config.stash[SETTINGS])
        runs.may_rerun, runs.foreign = False, True
    if runs is None:  # not checked: this test runs untracked, the index must be rebuilt after it
        tracker.stale = True
        return
    check = Check(budget)
    item.stash[CHECK] = item.config.stash[ACTIVE] = check
    check.meter = meter_for(item, budget.device if budget else None)
    if skipped_by_mark(item):  # pytest skips it next, before its fixtures: nothing to measure
        return
    # pytest keeps the last failed test's traceback, and its frames' tensors, in sys.last_* until
    # the next test's call starts. Drop them now and collect: the failed test's frames sit in
    # reference cycles that would otherwise be frozen, and kept in memory, through this test.
    dropped = [sys.__dict__.pop(name, None) for name in ("last_type", "last_value", "last_traceback", "last_exc")]
    if any(value is not None for value in dropped):
        dropped.clear()
        gc.collect()
    if budget is None:
        return
    settings = item.config.stash[SETTINGS]
    first = runs.repetitions.started <= 1
    try:
        saved = (settings.compare or {}).get(item.nodeid)
        saved_peak = saved.get("peak_bytes") if saved and saved.get("device") == check.meter.name else None
        rules = Rules(
            strict_cycles=settings.strict_cycles,
            saved_peak=saved_peak,
            max_increase=settings.max_increase,
            watch_peak=None if not (settings.save or settings.compare is not None or settings.peaks) else True,
            count_cpp_held=runs.rule.strict,
        )
        trace = settings.trace and isinstance(check.meter, CudaMeter)
        check.engine = LeakCheck(
            check.meter.name,
            budget,
            meter=check.meter,
            tracker=tracker,
            # (the run that records where tensors are made names the cycles the first run failed on)
            rules=rules
            if first
            else Rules(
                count_cpp_held=runs.rule.strict,
                watch_peak=False,
                strict_cycles=settings.strict_cycles and runs.naming_run,
                keep_cycle_garbage=True,
            ),
            record_sites=settings.sites == "on" and first,
            trace_folder=trace_folder(item.config) if trace and first else None,
            name=item.nodeid,
            named_roots=functools.partial(named_roots, item),
            # A test run again is confirmed once, after its runs (a full collection costs a walk of
            # the heap); a test run once is confirmed as it ends.
            settle_leaks=not runs.may_rerun,
            name_leaks=not runs.may_rerun or (runs.naming_run and check.meter.name != "cpu"),
            sites=runs.sites if runs.naming_run else None,
            clear_caches=first,
        )
        check.engine.begin()
    except Exception as error:
        check.error = f"{type(error).__name__}: {error}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    check = item.stash.get(CHECK, None)
    if check is None or check.engine is None or check.error or check.budget is None:
        return (yield)
    try:
        check.engine.start()
        check.started = True
    except Exception as error:  # the plugin's own failure: report it on this test, run the test anyway
        check.error = f"{type(error).__name__}: {error}"
        return (yield)
    try:
        return (yield)
    finally:
        try:
            check.engine.stop()
        except Exception as error:
            check.error = f"{type(error).__name__}: {error}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    check = item.stash.get(CHECK, None)
    if check is None:
        return report
    if (
        report.when == "call"
        and call.excinfo is not None
        and check.meter is not None
        and is_out_of_memory(call.excinfo.value)
    ):
        tracker = item.config.stash[TRACKER]
        try:
            with tracker.unfrozen():
                contents = memory_contents(check.meter, call.excinfo.value)
            breakdown = check.engine.result.peak_breakdown if check.engine is not None else None
            if breakdown is not None:
                contents += "\n" + breakdown.render()
            report.sections.append(("vramleak: what filled the memory", contents))
        except Exception as error:  # never let the forensics replace the test's own failure
            report.sections.append(
                ("vramleak: what filled the memory", f"could not be read: {type(error).__name__}: {error}")
            )
    if report.when == "call":
        check.call_passed = report.passed
    runs = item.stash.get(RUNS, None)
    if report.when in ("setup", "call") and check.unchecked_reason is None:
        if check.step_leaked:
            check.unchecked_reason = "memory grew across the steps of the vramleak fixture"
        elif (
            report.failed
            and report.when == "call"
            and check.budget is not None
            and runs is not None
            and not runs.foreign
        ):
            check.call_failed = True  # its own failure stands; what it leaked is shown beside it
        elif report.failed:
            check.unchecked_reason = f"the test failed in {report.when}"
        elif report.skipped:
            check.unchecked_reason = "the test was skipped" if not hasattr(report, "wasxfail") else "the test xfailed"
    if (
        report.when == "teardown"
        and report.failed
        and check.unchecked_reason is None
        and check.error is None
        and not isinstance(call.excinfo and call.excinfo.value, VramLeak)
    ):
        check.unchecked_reason = "teardown failed"
    if report.when == "teardown" and runs is not None and runs.foreign:
        result = runs.result or finish_result(item, runs, None)
        report.vramleak = result.to_json()  # type: ignore[attr-defined]
        record_properties(report, result)
        del item.stash[RUNS]
    return report


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, Any, Any]:
    """Measure once the test's own node is torn down and pytest's other teardown wrappers (its
    logging plugin drops each test's log records there) are done."""
    check = item.stash.get(CHECK, None)
    if check is None or check.meter is None:
        return (yield)
    try:
        outcome = yield
        if check.error:
            raise VramLeak(f"vramleak could not check this test: {check.error}", pytrace=False)
        if check.unchecked_reason or not check.started or check.engine is None:
            return outcome
        if check.call_failed:
            # pytest keeps the failure's traceback (its frames, their tensors) in sys.last_* until
            # the next failure; the next checked test drops it anyway: what it holds is not a leak.
            drop_last_error()
            # Checked on this run alone, as a test run once is: a suspected leak is confirmed by a
            # full collection, which frees those frames where an observation during the call froze
            # them with the heap (they were alive then: the error was being raised).
            check.engine.settle_leaks = True
        try:
            check.engine.finish(confirm=functools.partial(drop_fixture_values, item))
        except Exception as error:
            check.error = f"{type(error).__name__}: {error}"
            raise VramLeak(
                f"vramleak could not check this test: {type(error).__name__}: {error}", pytrace=False
            ) from None
        runs = item.stash.get(RUNS, None)
        if runs is not None and runs.foreign:
            judge_foreign_run(item, runs, check)
        return outcome
    finally:
        item.config.stash[ACTIVE] = None
        if check.engine is not None:
            check.engine.close()
        item.config.stash.setdefault(DRIFT_SPAN, [item.nodeid, item.nodeid])[1] = item.nodeid
        look_for_drift(item.config, due=True)


def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config) -> tuple[str, str, Any] | None:
    outcome = getattr(report, "vramleak_outcome", None)
    if report.when == "teardown" and report.failed:  # a run another plugin ran: it fails as it tears down
        outcome = (getattr(report, "vramleak", None) or {}).get("outcome")
    elif report.when != "call" or not report.failed:
        return None
    if outcome == "leaked":
        return "failed", "L", status_word("LEAKED")
    if outcome == "over_budget":
        return "failed", "B", status_word("OVER BUDGET")
    return None


WORKER_LEFTOVERS = pytest.StashKey[list[dict[str, Any]]]()


class _XdistController:
    """Gathers what each pytest-xdist worker found about fixtures, as its node goes down."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        output = getattr(node, "workeroutput", {})
        self.config.stash.setdefault(WORKER_LEFTOVERS, []).extend(output.get("vramleak_fixtures", []))
        self.config.stash.setdefault(DRIFT, []).extend(output.get("vramleak_drift", []))


class _Recorder:
    """Collects each test's result from its teardown report, in the process that writes reports.

    Under pytest-xdist the reports arrive from the workers with the result attached, so the
    controller sees every worker's tests.
    """

    def __init__(self, results: list[dict[str, Any]]) -> None:
        self.results = results
        self.ran = False
        """Whether any test ran (set up at least): a run that ran none writes no report."""

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.ran = True
        result = getattr(report, "vramleak", None)
        if report.when == "teardown" and result:
            self.results.append(result)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(
    fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
) -> Generator[None, Any, Any]:
    """Note what a wider-scoped fixture makes while a checked test sets up: it is indexed now (a
    check on an accelerator reads nothing otherwise), and, with --vramleak, reported if still
    alive after the fixture's teardown."""
    config = request.config
    if fixturedef.scope != "function":
        config.stash.setdefault(FIXTURE_DEFS, {})[id(fixturedef)] = fixturedef
    tracker = config.stash[TRACKER]
    check = config.stash.get(ACTIVE, None) if fixturedef.scope != "function" else None
    if check is None or check.meter is None or not tracker.active:
        return (yield)
    before = tracker.clock
    allocated = check.meter.allocated_bytes() if check.meter.name != "cpu" else 0
    value = yield
    if check.engine is not None:  # what the fixture made or started belongs to its scope, not to the test
        check.engine.left_behind.adopt()
        if check.meter.name != "cpu":
            check.engine.adopt_bytes(check.meter.allocated_bytes() - allocated)
    tracker.observe(collect=False, watch=False)
    created = tracker.created(check.meter.name, since=before)
    tracker.adopt(created)
    if config.stash[SETTINGS].every_test:
        if created:
            where = fixturedef.baseid or "conftest"
            config.stash[FIXTURES].append(
                FixtureMemory(fixturedef.argname, fixturedef.scope, where, check.meter.name, created)
            )
    return value


RELEASER = pytest.StashKey[ReleaseScheduler]()


class _Releaser:
    """Runs the release scheduler after each test, where CUDA is in use."""

    def __init__(self, config: pytest.Config, fraction: float) -> None:
        self.config = config
        self.fraction = fraction

    def pytest_runtest_logfinish(self) -> None:
        torch = sys.modules.get("torch")
        if torch is None or not torch.cuda.is_available():
            return
        scheduler = self.config.stash.get(RELEASER, None)
        if scheduler is None:
            scheduler = self.config.stash[RELEASER] = ReleaseScheduler(torch.cuda, self.fraction)
        scheduler.between_tests()


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    scheduler = config.stash.get(RELEASER, None)
    fixtures: list[dict[str, Any]] = config.stash.get(LEFTOVERS, [])
    between_checks: list[dict[str, Any]] = config.stash.get(DRIFT, [])
    lines = summary_lines(
        latest(config.stash.get(RESULTS, [])),
        fixtures=fixtures,
        between_checks=between_checks,
        releases=(scheduler.releases, scheduler.released_bytes) if scheduler is not None else (0, 0),
        verbosity=config.get_verbosity(),
        shown_id=functools.partial(pasteable, config),
    )
    if lines:
        terminalreporter.write_sep("=", "vramleak summary")
        for line in lines:
            terminalreporter.write_line(line)
    for error in config.stash.get(OUTPUT_ERRORS, []):
        terminalreporter.write_line(f"vramleak: {error}", red=True, bold=True)
    idle = idle_options(config)
    if idle:
        terminalreporter.write_line(
            f"vramleak: no test was checked (no --vramleak, no test marked {MARKER} or using the vramleak fixture): "
            f"{', '.join(idle)} had nothing to act on",
            yellow=True,
        )
    not_written = config.stash.get(NOT_WRITTEN, [])
    if not_written:
        terminalreporter.write_line(
            f"vramleak: no test ran, so no report was written ({', '.join(not_written)} left as they were)"
        )


LEFTOVERS = pytest.StashKey[list[dict[str, Any]]]()


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    tracker = config.stash.get(TRACKER, None)
    if tracker is not None:
        tracker.end()  # never leave the heap frozen behind a session
        if OUTPUT_ERRORS in config.stash:
            look_for_drift(config, due=False)
    settings = config.stash.get(SETTINGS, None)
    if settings is None:
        return
    config.stash[LEFTOVERS] = fixture_leftovers(config) + config.stash.get(WORKER_LEFTOVERS, [])
    workeroutput = getattr(config, "workeroutput", None)
    if workeroutput is not None:  # a pytest-xdist worker: the controller reports for it
        # Each worker sets up its own module- and session-scoped fixtures: say whose this is.
        worker = getattr(config, "workerinput", {}).get("workerid")
        workeroutput["vramleak_fixtures"] = [{**leftover, "worker": worker} for leftover in config.stash[LEFTOVERS]]
        workeroutput["vramleak_drift"] = [{**finding, "worker": worker} for finding in config.stash.get(DRIFT, [])]
        return
    write_outputs(session, settings, config.stash[LEFTOVERS])

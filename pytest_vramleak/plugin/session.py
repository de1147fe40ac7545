"""One pytest session's checks: their settings and state, and the hooks that run them.

:class:`VramleakSession` is the plugin's one owner of a session, as pytest-memray's ``Manager``
and pytest-xdist's ``DSession`` are: its attributes are the session's state, its methods are the
hooks. It is registered as the plugin module is loaded (in ``pytest_addoption``), so that its
hooks sit where the module's would, before a conftest's: a conftest that runs tests itself, or
adds markers as it collects, is heard first.

A test's phases:

- setup: after the test's fixtures are set up, collect young garbage and take the baseline;
- call: watch the peak while the test body runs (when a peak budget asks for it, or for free on
  accelerators);
- teardown: after function-scoped fixtures are torn down, measure again; a leak fails the test,
  reported as LEAKED with the holders named.

One checked test's runs and the verdict on them are :mod:`~pytest_vramleak.plugin.runs`'.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import pytest

from ..judging.verdict import Budget
from ..meters.devices import CudaMeter, Meter, is_out_of_memory, pin_worker
from ..meters.release import ReleaseScheduler
from ..tracking import gc_functions as gc
from .leftovers import fixture_leftovers, look_for_drift
from .marker import parse_marker
from .options import OptionError, Settings
from .options import read_settings as read_options
from .outputs import files_line, trace_folder, write_outputs
from .protocol import fresh_instance
from .state import (
    EXEMPT_MARKER,
    MARKER,
    SESSION,
    TEST,
    Check,
    CheckedTest,
    FixtureMemory,
    SessionState,
    VramLeak,
    check_device_option,
    checked,
    current_check,
    current_runs,
    drop_fixture_values,
    import_torch,
    meter_for,
    option_and_source,
    pasteable,
    skipped_by_mark,
    test_of,
    why_unavailable,
)
from .summary import header_notes, header_settings, idle_options, latest, status_word, summary_lines
from .timeouts import armed_settings, cut_short

if TYPE_CHECKING:
    from ..check import LeakCheck
    from .runs import TestRuns

# The engine (the check, the naming of holders, a checked test's runs) is imported where a test is
# to be checked (:meth:`VramleakSession._load_engine`; the hooks import what they call from it):
# pytest loads the plugin in every run of an environment it is installed in, and a run that
# checks nothing loads only this layer, the options, the meters and the report writer.


class VramleakSession(SessionState):
    """The state of one pytest session's checks, and the hooks that run them (see the module docstring)."""

    # -- the session ----------------------------------------------------------------------------

    def pytest_configure(self, config: pytest.Config) -> None:
        config.addinivalue_line(
            "markers",
            f"{MARKER}(peak=None, *, leak=0, device=None, repeat=None, reserved=None, pinned=None): fail the test if it leaves more than `leak` bytes "
            "of tensor memory allocated after teardown, or holds more than `peak` bytes above its baseline "
            "during the call. Sizes are bytes or strings like '512 MiB'. device: auto|cpu|cuda|cuda:N|mps|xpu. "
            "repeat: run the test N times and classify what it leaves (grows, kept_once, settled). "
            "reserved, pinned (CUDA): bound the caching allocator's reserved memory and pinned host memory during the call.",
        )
        config.addinivalue_line(
            "markers",
            f"{EXEMPT_MARKER}: exempt this test from the leak check of --vramleak, and let its vramleak step checks grow without failing it.",
        )
        self.config = config
        config.stash[SESSION] = self
        self.settings = settings = _read_settings(config)
        self.torch_missing = missing = _torch_missing()
        if missing is not None and settings.every_test:
            # A run asked to check every test must not pass having checked none.
            raise pytest.UsageError(
                f"--vramleak checks tensor memory, and {missing}: install torch, or run without --vramleak"
            )
        if missing is None and settings.device not in ("auto", "cpu"):
            check_device_option(config, settings.device)
        if missing is None and settings.every_test:
            self._load_engine()  # every test is checked: loaded now, before pytest times the session
        workerinput = getattr(config, "workerinput", None)
        if workerinput is not None and settings.pin_workers:
            torch = import_torch()
            if torch is not None:
                pin_worker(str(workerinput.get("workerid", "")), torch, os.environ)

    def _load_engine(self) -> None:
        """Import the engine and make the session's tracker: some test will be checked."""
        from . import fixture, runs  # noqa: F401

        self.start_tracking()

    def pytest_report_header(self, config: pytest.Config) -> str | list[str]:
        if self.torch_missing is not None:
            return f"vramleak: {self.torch_missing}: tests marked {MARKER} and the vramleak fixture run unchecked"
        assert self.settings is not None
        return ["vramleak: " + header_settings(self.settings), *header_notes(self.settings)]

    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        settings = self.settings
        assert settings is not None
        if self.torch_missing is not None:
            return  # nothing can be checked: every test runs as without the plugin
        unavailable: dict[str, str | None] = {}
        planned = False
        for item in items:
            mark = item.get_closest_marker(MARKER)
            test = CheckedTest()
            if item.get_closest_marker(EXEMPT_MARKER) is not None:
                test.allowed = True
            elif mark is not None:
                test.budget, test.repeat = parse_marker(item, mark)
                test.marked = True
            elif settings.every_test:
                test.budget = Budget(leak=settings.default_leak)
            budget = test.budget
            if budget is None and "vramleak" not in getattr(item, "fixturenames", ()):
                continue
            item.stash[TEST] = test
            planned = True
            # A device a marker asks for that is not there skips the test, with the reason, where the test is.
            spec = (budget.device if budget else None) or settings.device
            if spec in ("auto", "cpu"):
                continue
            if spec not in unavailable:
                unavailable[spec] = why_unavailable(spec)
            reason = unavailable[spec]
            if reason is not None:
                item.add_marker(pytest.mark.skip(reason=reason))
                test.skipped = True
        if planned:
            self._load_engine()

    # -- one test -------------------------------------------------------------------------------

    @pytest.hookimpl
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
        """Run a checked test (again where a leak must be classified) and report it once."""
        if not checked(item):
            return None
        from .runs import run_protocol

        return run_protocol(item, nextitem)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        settings = self.settings
        assert settings is not None
        test = test_of(item)
        runs = test.runs if test is not None else None
        if test is not None and runs is None and checked(item):
            from .runs import runs_of_another_plugin

            runs = test.runs = runs_of_another_plugin(item, settings)
        if test is None or runs is None:  # not checked: this test runs untracked, the next check reads what it made
            if self.tracker is not None:
                self.tracker.stale = True
            return
        tracker = self.start_tracking()
        budget = test.budget
        check = test.current = self.active = Check(budget)
        meter = check.meter = meter_for(item, budget.device if budget else None)
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
            self._track_for_steps(check, meter)
            return
        from ..readings import readings_for

        try:
            if runs.collects_between and readings_for(meter, tracker).names_each_storage:
                runs.between += tracker.collect_between_runs()
            check.engine = self._leak_check(item, runs, meter, budget)
            check.engine.begin()
        except Exception as error:
            check.error = f"{type(error).__name__}: {error}"
        if runs.repetitions.started > 1:
            # A run again gets a fresh instance of the test's class, as every test does; the last
            # run's goes as this run sets up, inside its check, as a test's own would after it.
            fresh_instance(item)
        runs.set_up_by_the_plugin()

    @pytest.hookimpl(specname="pytest_runtest_setup")
    def pytest_runtest_setup_after_the_suites_hooks(self, item: pytest.Item) -> None:
        """Heard after a conftest's ``pytest_runtest_setup`` (this object is registered before any
        conftest) and before pytest's own, which sets up the test's fixtures: what older than the
        test the suite's hooks freed (the last test's state, reset as each test sets up: pyro
        clears its parameter store so) is not the test's doing, and hides none of its leak. What
        earlier runs of the same test left still offsets a run again's."""
        check = current_check(item)
        engine = check.engine if check is not None else None
        if engine is None or self.tracker is None or not engine.readings.names_each_storage:
            return
        runs = current_runs(item)
        again = runs is not None and runs.repetitions.started > 1
        self.tracker.suite_set_up((runs.first_begin if runs is not None and again else 0) or engine.begin_clock)

    def _track_for_steps(self, check: Check, meter: Meter) -> None:
        """A test checked only through the vramleak fixture is tracked from its set-up to the end of
        its teardown, as a checked test is: its step loops then read only what was made since it
        began, so a loop after another checked test's indexes nothing again, and what the test made
        before its loop is read whole, whichever generation Python's collector has moved it to."""
        from ..readings import readings_for

        tracker = self.start_tracking()
        try:
            tracker.begin(index=readings_for(meter, tracker).names_each_storage)
        except Exception as error:
            check.error = f"{type(error).__name__}: {error}"
        else:
            check.tracks_steps = True

    def _leak_check(self, item: pytest.Item, runs: TestRuns, meter: Meter, budget: Budget) -> LeakCheck:
        """The check of a test's run: the first measures and names as asked; a run again only
        measures, and the run that records sites names the cycles the first run failed on."""
        from ..check import LeakCheck, Rules
        from .runs import named_roots

        settings, tracker = self.settings, self.tracker
        assert settings is not None and tracker is not None
        first = runs.repetitions.started <= 1
        if first:
            saved = (settings.compare or {}).get(item.nodeid)
            rules = Rules(
                strict_cycles=settings.strict_cycles,
                saved_peak=saved.get("peak_bytes") if saved and saved.get("device") == meter.name else None,
                max_increase=settings.max_increase,
                watch_peak=None if not (settings.save or settings.compare is not None or settings.peaks) else True,
                count_cpp_held=runs.rule.strict,
            )
        else:
            rules = Rules(
                count_cpp_held=runs.rule.strict,
                watch_peak=False,
                strict_cycles=settings.strict_cycles and runs.naming_run,
                keep_cycle_garbage=True,
            )
        trace = settings.trace and isinstance(meter, CudaMeter) and first
        return LeakCheck(
            meter.name,
            budget,
            meter=meter,
            tracker=tracker,
            rules=rules,
            record_sites=settings.sites == "on" and first,
            trace_folder=trace_folder(settings, item.config.rootpath) if trace else None,
            name=item.nodeid,
            named_roots=functools.partial(named_roots, item),
            # A test run again is confirmed once, after its runs (a full collection costs a walk of
            # the heap); a test run once is confirmed as it ends.
            settle_leaks=not runs.may_rerun,
            name_leaks=not runs.may_rerun,
            sites=runs.sites if runs.naming_run else None,
            clear_caches=first,
            # (a strict-cycles check names the cycles' tensors as the body ends, from tracing still running)
            body_ended=runs.body_ended if runs.naming_run and not settings.strict_cycles else None,
        )

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, Any, Any]:
        check = current_check(item)
        if check is None or check.engine is None or check.error or check.budget is None:
            return (yield)
        runs = current_runs(item)
        if runs is not None:
            runs.body_begins()
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
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        check = current_check(item)
        if check is None:
            return report
        if report.when == "call" and call.excinfo is not None:
            self._what_filled_the_memory(check, call.excinfo.value, report)
            check.failure = call.excinfo.value if report.failed else None
        runs = current_runs(item)
        _note_phase(check, report, call, judged_with_its_failure=runs is not None and runs.judged_after_the_runs)
        if report.when == "teardown" and runs is not None:
            runs.teardown_reported(item, report)
        return report

    @pytest.hookimpl(wrapper=True, tryfirst=True, specname="pytest_runtest_makereport")
    def pytest_runtest_makereport_of_a_leak_not_run_again(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        """A run that pytest-rerunfailures makes and whose leak fails its teardown is no failure a
        run again would mend: memory kept once leaves nothing the second time, and the test would
        pass. Outermost, after that plugin's own wrapper has set it, this marks the teardown's
        failure as one it must not run again for (its ``_terminal_errors``, which ``--rerun-except``
        sets on the same item)."""
        report = yield
        errors = getattr(item, "_terminal_errors", None)
        if (
            report.when == "teardown"
            and report.failed
            and call.excinfo is not None
            and call.excinfo.errisinstance(VramLeak)
            and type(errors) is dict
        ):
            errors["teardown"] = True
        return report

    def _what_filled_the_memory(self, check: Check, error: BaseException, report: pytest.TestReport) -> None:
        """An out-of-memory error's report gets a section on what filled the memory."""
        if check.meter is None or not is_out_of_memory(error):
            return
        from ..holders.snapshot import memory_contents

        assert self.tracker is not None
        try:
            with self.tracker.unfrozen():
                contents = memory_contents(check.meter, error)
            breakdown = check.engine.result.peak_breakdown if check.engine is not None else None
            if breakdown is not None:
                contents += "\n" + breakdown.render()
            report.sections.append(("vramleak: what filled the memory", contents))
        except Exception as failure:  # never let the forensics replace the test's own failure
            report.sections.append(
                ("vramleak: what filled the memory", f"could not be read: {type(failure).__name__}: {failure}")
            )

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, Any, Any]:
        """Measure once the test's own node is torn down and pytest's other teardown wrappers (its
        logging plugin drops each test's log records there) are done."""
        check = current_check(item)
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
                from .runs import drop_last_error

                drop_last_error()
                # Checked on this run alone, as a test run once is: a suspected leak is confirmed by a
                # full collection, which frees those frames where an observation during the call froze
                # them with the heap (they were alive then: the error was being raised).
            try:
                check.engine.finish(confirm=functools.partial(drop_fixture_values, item), settle=check.call_failed)
            except pytest.fail.Exception as error:  # a timeout fired as the check measured: the teardown's failure
                check.unchecked_reason = cut_short(error, None, "measuring what the test left")
                raise
            except Exception as error:
                check.error = f"{type(error).__name__}: {error}"
                raise VramLeak(
                    f"vramleak could not check this test: {type(error).__name__}: {error}", pytrace=False
                ) from None
            runs = current_runs(item)
            if runs is not None:
                runs.run_torn_down(item, check)
            return outcome
        finally:
            self.active = None
            if check.engine is not None:
                check.engine.close()
            elif check.tracks_steps and self.tracker is not None:
                check.tracks_steps = False
                self.tracker.end()
            if self.drift_span is None:
                self.drift_span = [item.nodeid, item.nodeid]
            self.drift_span[1] = item.nodeid
            look_for_drift(self, due=True)

    @pytest.hookimpl(optionalhook=True, tryfirst=True)
    def pytest_timeout_set_timer(self, item: pytest.Item, settings: Any) -> None:
        """pytest-timeout arms a test's timer: its settings are noted, so that each run of a checked
        test, and the check after them, get the whole of it (see :mod:`.timeouts`)."""
        test = test_of(item)
        if test is not None and (settings := armed_settings(settings)) is not None:
            test.timeout = settings

    def pytest_report_teststatus(self, report: pytest.TestReport, config: pytest.Config) -> tuple[str, str, Any] | None:
        outcome = getattr(report, "vramleak_outcome", None)  # (a run another plugin ran fails as it tears down)
        if report.when == "setup" or not report.failed:
            return None
        if outcome == "leaked":
            return "failed", "L", status_word("LEAKED")
        if outcome == "over_budget":
            return "failed", "B", status_word("OVER BUDGET")
        return None

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Each test's record arrives on its teardown report, in the process that writes reports
        (under pytest-xdist, from the workers, so the controller sees every worker's tests); it
        gets pytest's outcome before JUnit XML reads its properties."""
        self.ran = True
        assert self.config is not None
        self.outcomes.note(self.config, report)
        result = getattr(report, "vramleak", None)
        if report.when == "teardown" and result:
            self.results.append(result)

    def pytest_runtest_logfinish(self) -> None:
        """Release cached memory between tests, where CUDA is in use and --vramleak-release-above asks."""
        fraction = self.settings.release_above if self.settings is not None else None
        torch = sys.modules.get("torch")
        if fraction is None or torch is None or not torch.cuda.is_available():
            return
        if self.releaser is None:
            self.releaser = ReleaseScheduler(torch.cuda, fraction)
        self.releaser.between_tests()

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(
        self, fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
    ) -> Generator[None, Any, Any]:
        """Note what a wider-scoped fixture makes while a checked test sets up: it is indexed now (a
        check on an accelerator reads nothing otherwise), and, with --vramleak, reported if still
        alive after the fixture's teardown."""
        if fixturedef.scope != "function":
            self.fixture_defs[id(fixturedef)] = fixturedef
        tracker, settings = self.tracker, self.settings
        check = self.active if fixturedef.scope != "function" else None
        if check is None or check.meter is None or tracker is None or settings is None or not tracker.active:
            return (yield)
        before = tracker.clock
        mark = check.engine.readings.fixture_mark() if check.engine is not None else 0
        value = yield
        if check.engine is not None:  # what the fixture made or started belongs to its scope, not to the test
            check.engine.left_behind.adopt()
            check.engine.adopt_bytes(check.engine.readings.fixture_bytes(mark))
        tracker.observe(collect=False, watch=False)
        created = tracker.created(check.meter.name, since=before)
        tracker.adopt(created)
        if settings.every_test and created:
            where = fixturedef.baseid or "conftest"
            self.fixtures.append(FixtureMemory(fixturedef.argname, fixturedef.scope, where, check.meter.name, created))
        return value

    # -- the end --------------------------------------------------------------------------------

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """A pytest-xdist worker went down: what it found about fixtures and between checks is the controller's to report."""
        output = getattr(node, "workeroutput", {})
        self.worker_leftovers.extend(output.get("vramleak_fixtures", []))
        self.drift.extend(output.get("vramleak_drift", []))

    def pytest_terminal_summary(self, terminalreporter: Any, config: pytest.Config) -> None:
        releaser = self.releaser
        lines = summary_lines(
            latest(self.results),
            fixtures=self.leftovers,
            between_checks=self.drift,
            releases=(releaser.releases, releaser.released_bytes) if releaser is not None else (0, 0),
            verbosity=config.get_verbosity(),
            shown_id=functools.partial(pasteable, config),
        )
        if lines:
            terminalreporter.write_sep("=", "vramleak summary")
            for line in lines:
                terminalreporter.write_line(line)
        for error in self.output_errors:
            terminalreporter.write_line(f"vramleak: {error}", red=True, bold=True)
        idle = idle_options(config, self.ran, self.results)
        if idle:
            terminalreporter.write_line(
                f"vramleak: no test was checked (no --vramleak, no test marked {MARKER} or using the vramleak fixture): "
                f"{', '.join(idle)} had nothing to act on",
                yellow=True,
            )
        files = files_line(self.written, self.not_written, self.output_errors, self.interrupted, self.not_made)
        if files:
            terminalreporter.write_line(files)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        config = session.config
        if self.tracker is not None:
            self.tracker.end()  # never leave the heap frozen behind a session
            look_for_drift(self, due=False)
        if self.settings is None:
            return
        self.leftovers = fixture_leftovers(self) + self.worker_leftovers
        workeroutput = getattr(config, "workeroutput", None)
        if workeroutput is not None:  # a pytest-xdist worker: the controller reports for it
            # Each worker sets up its own module- and session-scoped fixtures: say whose this is.
            worker = getattr(config, "workerinput", {}).get("workerid")
            workeroutput["vramleak_fixtures"] = [{**leftover, "worker": worker} for leftover in self.leftovers]
            workeroutput["vramleak_drift"] = [{**finding, "worker": worker} for finding in self.drift]
            return
        write_outputs(session, self)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        """The tracker forgets what it read before pytest's own last collections, which walk the
        heap (pytest's clean-ups run after every plugin has unconfigured)."""
        if self.tracker is not None:
            self.tracker.close()


def _read_settings(config: pytest.Config) -> Settings:
    """Read and check every option; a bad value is a usage error naming its source."""
    try:
        get = functools.partial(option_and_source, config)
        return read_options(get, config.rootpath, other_outputs=_other_outputs(config))
    except OptionError as error:
        raise pytest.UsageError(str(error)) from None


OTHER_OUTPUTS = (
    ("xmlpath", "--junitxml"),
    ("debug", "--debug"),
    ("report_log", "--report-log"),  # pytest-reportlog
    ("htmlpath", "--html"),  # pytest-html
)
"""Files that pytest and well-known plugins write, by the option's destination and its flag."""


def _other_outputs(config: pytest.Config) -> list[tuple[str, str]]:
    """The files of :data:`OTHER_OUTPUTS` this run writes, each as its option was given and its
    path, with ``~`` and environment variables expanded as pytest expands them in ``--junitxml``."""
    outputs = []
    for destination, flag in OTHER_OUTPUTS:
        path = getattr(config.option, destination, None)
        if isinstance(path, str) and path.strip():
            outputs.append((f"{flag}={path}", os.path.expanduser(os.path.expandvars(path))))
    return outputs


def _torch_missing() -> str | None:
    """Why torch cannot be imported, found without importing it (importing it takes seconds)."""
    try:
        found = importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        found = False
    return None if found else "torch is not installed"


def _note_phase(
    check: Check, report: pytest.TestReport, call: pytest.CallInfo[None], *, judged_with_its_failure: bool
) -> None:
    """What a phase's report tells the run's check: why it cannot measure the test (a step check
    failed it, it failed, was skipped or xfailed), or that its call failed on its own, with the
    leak still shown beside its failure (``judged_with_its_failure``: the plugin runs its phases)."""
    if report.when in ("setup", "call") and check.unchecked_reason is None:
        if check.step_leaked:
            check.unchecked_reason = "memory grew across the steps of the vramleak fixture"
        elif report.failed and report.when == "call" and check.budget is not None and judged_with_its_failure:
            check.call_failed = True  # its own failure stands; what it leaked is shown beside it
        elif report.failed:
            check.unchecked_reason = f"the test failed in {report.when}"
        elif report.skipped:
            check.unchecked_reason = "the test was skipped" if not hasattr(report, "wasxfail") else "the test xfailed"
    leak = isinstance(call.excinfo and call.excinfo.value, VramLeak)
    if report.when == "teardown" and report.failed and check.unchecked_reason is None and check.error is None:
        if not leak:
            check.unchecked_reason = "teardown failed"

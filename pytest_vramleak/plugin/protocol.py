"""Running a checked test's phases, once or again, and handing pytest one set of reports.

pytest runs a test as three phases (set-up, call, teardown), each reported as it ends. A leak is
known only after teardown, and a test run again to classify its leak must be reported once. So a
checked test's phases run here with their reports held back (as pytest-rerunfailures and
pytest-repeat do), and the caller logs one set: the first run's, with the verdict in the call's
report where the leak fails the test (one test, one failure: in the terminal, in ``-rA``, in
JUnit XML and for ``--lf``).

Between runs only the test's own node is torn down (its function-scoped fixtures); fixtures of a
wider scope stay set up, and are torn down towards the next test once the runs are over.
"""

from __future__ import annotations

import bdb
import functools
import random
import sys
from collections.abc import Iterable
from typing import Any, Literal

import pytest


def _interactive(call: pytest.CallInfo[None], report: pytest.TestReport) -> bool:
    """Whether pytest would hand this failure to ``--pdb`` (as its own runner decides)."""
    if call.excinfo is None or hasattr(report, "wasxfail"):
        return False
    return not isinstance(call.excinfo.value, (pytest.skip.Exception, bdb.BdbQuit))


def call_and_report(item: pytest.Item, when: Literal["setup", "call", "teardown"], **kwargs: Any) -> pytest.TestReport:
    """Run one phase through pytest's hooks and make its report, without logging it."""
    ihook = item.ihook
    hooks = {
        "setup": ihook.pytest_runtest_setup,
        "call": ihook.pytest_runtest_call,
        "teardown": ihook.pytest_runtest_teardown,
    }
    hook = hooks[when]
    reraise: tuple[type[BaseException], ...] = (pytest.exit.Exception,)
    if not item.config.getoption("usepdb", False):
        reraise += (KeyboardInterrupt,)
    call = pytest.CallInfo.from_call(lambda: hook(item=item, **kwargs), when=when, reraise=reraise)
    report: pytest.TestReport = ihook.pytest_runtest_makereport(item=item, call=call)
    if _interactive(call, report):
        ihook.pytest_exception_interact(node=item, call=call, report=report)
    return report


def _show_test_item(item: pytest.Item) -> None:
    """What ``--setup-show`` prints for a test, as pytest prints it."""
    writer = item.config.get_terminal_writer()
    writer.line()
    writer.write(" " * 8)
    writer.write(item.nodeid)
    used = sorted(getattr(item, "fixturenames", []))
    if used:
        writer.write(f" (fixtures used: {', '.join(used)})")
    writer.flush()


def run_once(item: pytest.Item, toward: pytest.Item | pytest.Collector | None) -> list[pytest.TestReport]:
    """Set the test up, call it and tear it down towards ``toward`` (the test's parent keeps
    wider fixtures set up; the next test tears down what it does not need), as pytest's
    ``runtestprotocol`` does; the reports are returned, not logged."""
    if hasattr(item, "_request") and not item._request:
        item._initrequest()  # type: ignore[attr-defined]  # as pytest's runtestprotocol on a re-run
    try:
        reports = [call_and_report(item, "setup")]
        if reports[0].passed:
            setup_only = item.config.getoption("setuponly", False)
            if item.config.getoption("setupshow", False):
                _show_test_item(item)
            if not setup_only:
                reports.append(call_and_report(item, "call"))
        if item.session.shouldfail or item.session.shouldstop:
            toward = None  # the session ends: tear everything down, as pytest does
        reports.append(call_and_report(item, "teardown", nextitem=toward))
    finally:
        if hasattr(item, "_request"):
            item._request = False
            item.funcargs = None  # type: ignore[attr-defined]
    return reports


def fresh_instance(item: pytest.Item) -> None:
    """Let the next run of a test method make its own instance of the test's class, as pytest
    gives every test a fresh one: pytest makes an item's instance once, as it collects it, and
    keeps it (a run again would otherwise find what the last run set on ``self``). A unittest
    ``TestCase``'s item makes its own as it sets up, and is left alone."""
    cls = item.cls if isinstance(item, pytest.Function) else None
    unittest = sys.modules.get("unittest")
    if cls is None or (unittest is not None and issubclass(cls, unittest.TestCase)):
        return
    attributes = vars(item)
    instance = kept_instance(item)
    bound = attributes.get("_obj")
    if instance is None or getattr(bound, "__self__", None) is not instance:
        return  # (a function pytest did not bind to the instance, such as --trace's wrapper: left as it is)
    attributes.pop("_instance", None)  # (pytest 8.2 and later keep it apart from the bound method)
    item._obj = None  # type: ignore[attr-defined]  # made again, on a new instance, as the run sets up


def kept_instance(item: pytest.Item) -> Any:
    """The class instance pytest keeps of a test, read without making one (reading
    ``item.instance`` of a unittest item after its teardown makes a new ``TestCase``)."""
    attributes = vars(item)
    if "_instance" in attributes:
        return attributes["_instance"]
    return getattr(attributes.get("_obj"), "__self__", None)  # (pytest 8.1: the method bound to it)


def finish_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> str | None:
    """Tear down what the next test does not need, after runs torn down towards the test's parent:
    the failure there, which is the test's teardown's as in pytest (None where it passed)."""
    if item.session.shouldfail or item.session.shouldstop:
        nextitem = None
    try:
        item.session._setupstate.teardown_exact(nextitem)
    except (Exception, pytest.fail.Exception) as error:  # (a timeout fires as pytest.fail's)
        return f"teardown of fixtures after the test: {type(error).__name__}: {error}"
    return None


def why_stopped(reports: Iterable[pytest.TestReport]) -> str | None:
    """Why a run is the last: it failed, was skipped or xfailed (None where it passed, an
    unexpected pass of an ``xfail`` test too: pytest gives its report ``wasxfail`` as well)."""
    for report in reports:
        if hasattr(report, "wasxfail") and report.skipped:
            return "the test xfailed"
        if report.failed or report.skipped:
            return f"the test {'was skipped' if report.skipped else 'failed'} in {report.when}"
    return None


def failure_line(reports: Iterable[pytest.TestReport]) -> str:
    """The first line of a failed run's error, to say why the run was not used."""
    for report in reports:
        if report.failed:
            crash = getattr(report.longrepr, "reprcrash", None)
            text = crash.message if crash is not None else str(report.longrepr)
            first = text.strip().splitlines()[0] if text.strip() else "?"
            return first if len(first) <= 160 else first[:157] + "..."
    return ""


def failed_call_report(item: pytest.Item, call: pytest.TestReport, error: BaseException) -> pytest.TestReport:
    """The call's report made into a failure with ``error`` (a ``pytest.fail.Exception`` with
    ``pytrace=False``), keeping what it captured and how long it took."""
    info = pytest.CallInfo.from_call(functools.partial(_reraise, error), when="call")
    failed = pytest.TestReport.from_item_and_call(item, info)
    for name in ("sections", "user_properties", "duration", "start", "stop"):
        setattr(failed, name, getattr(call, name))
    return failed


def _reraise(error: BaseException) -> None:
    raise error


class RandomState:
    """The random number generators' states as the first run of a test left them, put back once
    the runs after it are over: a test run again for the check draws numbers the tests after it
    would otherwise have drawn (a test checking that an optimizer converges on random data then
    fails where it passes without the plugin). Covers Python's ``random``, numpy's global
    generator where numpy is imported, and torch's default generators (CPU, and each CUDA device
    where CUDA is initialized)."""

    def __init__(self) -> None:
        self._python = random.getstate()
        numpy = sys.modules.get("numpy")
        self._numpy = numpy.random.get_state() if numpy is not None else None
        # (as bytes: a tensor kept here would be memory the check sees the test make)
        torch = sys.modules.get("torch")
        self._torch = bytes(torch.get_rng_state().tolist()) if torch is not None else None
        cuda = getattr(torch, "cuda", None) if torch is not None else None
        self._cuda = (
            [bytes(state.tolist()) for state in cuda.get_rng_state_all()]
            if cuda is not None and cuda.is_initialized()
            else None
        )

    def restore(self) -> None:
        random.setstate(self._python)
        numpy = sys.modules.get("numpy")
        if numpy is not None and self._numpy is not None:
            numpy.random.set_state(self._numpy)
        torch = sys.modules.get("torch")
        if torch is not None and self._torch is not None:
            # (made on the CPU, whatever default device the suite set: a generator's state is a CPU tensor)
            torch.set_rng_state(torch.tensor(list(self._torch), dtype=torch.uint8, device="cpu"))
            if self._cuda is not None:
                states = [torch.tensor(list(state), dtype=torch.uint8, device="cpu") for state in self._cuda]
                torch.cuda.set_rng_state_all(states)

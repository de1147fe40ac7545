"""The pytest layer: options, markers, the ``vramleak`` fixture and the hooks that run checks.

Everything that measures, decides or names lives in plain modules; this one only wires them into
pytest's test phases:

- setup: after the test's fixtures are set up, collect garbage and take the baseline snapshot;
- call: watch the peak while the test body runs (when a peak budget asks for it, or for free on
  accelerators);
- teardown: after function-scoped fixtures are torn down, snapshot again; a leak fails the test
  in its teardown phase, reported as LEAKED with the holders named.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import gc
import importlib.util
import json
import os
import socket
import sys
from pathlib import Path
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Optional

import pytest

from .census import StorageKey
from .referrers import NamedRoot, held_only_inside, without_python_holders
from .check import CPP_HELD, CheckResult, LeakCheck, NamedLeak, Rules, name_leak
from .devices import CudaMeter, DeviceUnavailable, Meter, is_out_of_memory, make_meter, pin_worker, resolve_device
from .html_report import is_html_path, render_html
from .release import ReleaseScheduler
from .protocol import RandomState, failed_call_report, failure_line, finish_teardown, run_once, why_stopped
from .repeats import Decision, Repetitions, Rule, Run, decide
from .sites import FRAMES_FOR_CPP_HELD, FRAMES_TRACED, SiteRecorder, Sites, SiteSource, StorageSites
from .report import TestResult, benchmark_entries, render_groups, render_markdown, write_json, write_text_atomically
from .sizes import SizeError, format_size, parse_size
from .snapshot import describe, held_in_cpp_groups, memory_contents, merge_parts
from .steps import StepNotRun, StepResult, StepWatcher, step_caller
from .summary import summary_lines
from .tracker import NODE_BYTES, StorageRef, Tracker
from .diagnosis import PYTEST_WARNINGS
from .options import CHECK_ONLY, OPTIONS, OptionError, Settings, check_device_spec, saved_run_path
from .options import read_settings as read_options
from .verdict import Budget

MARKER = "vram_budget"
EXEMPT_MARKER = "allow_vram_leak"
class VramLeak(pytest.fail.Exception):  # type: ignore[name-defined,misc]
    """A test leaked or went over its peak budget."""

    __module__ = "builtins"  # shown as "VramLeak: ..." like pytest's own "Failed: ..."


@dataclass
class Check:
    """One test's check in progress: the engine's check, and what pytest's phases told about it."""

    budget: Budget | None
    """None for a test checked only through the vramleak fixture."""
    meter: Meter | None = None
    engine: LeakCheck | None = None
    started: bool = False
    unchecked_reason: str | None = None
    error: str | None = None
    steps: list[StepResult] = field(default_factory=list)
    step_leaked: bool = False
    left_early: StepResult | None = None
    """A step loop left early that grew: it fails the test as it tears down."""
    call_passed: bool = False
    call_failed: bool = False
    """The test's call failed on its own: checked once, on what remains once its traceback is let go."""
    result: TestResult | None = None


SETTINGS = pytest.StashKey[Settings]()
RESULTS = pytest.StashKey[list[dict[str, Any]]]()
CHECK = pytest.StashKey[Check]()
BUDGET = pytest.StashKey[Budget | None]()
TRACKER = pytest.StashKey[Tracker]()
ACTIVE = pytest.StashKey[Optional[Check]]()
"""The check of the test being set up, run or torn down."""
REPEAT = pytest.StashKey[int]()
"""Runs of a test whose marker says ``repeat=``."""
MARKED = pytest.StashKey[bool]()
"""Set on a test whose own ``vram_budget`` marker gives its budget (judged strictly by default)."""


def vram_budget(
    peak: Any = None, *, leak: Any = 0, device: str | None = None, repeat: int | None = None, reserved: Any = None, pinned: Any = None
) -> Any:
    """Put a test under a leak budget and a peak-memory budget: ``@vram_budget("2 GiB", leak="1 MiB")``.

    The same as ``@pytest.mark.vram_budget(...)``; sizes are bytes or strings such as ``"512 MiB"``.
    Also usable bare, ``@vram_budget``, for the defaults (no peak limit, no leak allowed).
    ``repeat=N`` runs the test N times to classify what it leaves (see ``--vramleak-repeat``);
    on CUDA, ``reserved`` and ``pinned`` bound the caching allocator's reserved memory and pinned
    host memory above their levels at the start of the call.
    """
    if callable(peak):
        return getattr(pytest.mark, MARKER)(peak)
    extra = {name: value for name, value in (("repeat", repeat), ("reserved", reserved), ("pinned", pinned)) if value is not None}
    return getattr(pytest.mark, MARKER)(peak, leak=leak, device=device, **extra)


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


def _option(config: pytest.Config, ini_name: str) -> tuple[Any, str]:
    """The value of a setting and where it came from, for error messages."""
    value = config.getoption(ini_name)
    if value is not None:
        return value, "--" + ini_name.replace("_", "-")
    return config.getini(ini_name), f"ini option {ini_name}"


def read_settings(config: pytest.Config) -> Settings:
    """Read and check every option; a bad value is a usage error naming its source."""
    try:
        return read_options(functools.partial(_option, config), config.rootpath)
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
        raise pytest.UsageError(f"--vramleak checks tensor memory, and {missing}: install torch, or run without --vramleak")
    if missing is None and settings.device not in ("auto", "cpu"):
        _check_device_option(config, settings.device)
    config.stash[RESULTS] = []
    config.stash[PYTORCHS_OWN] = {}
    config.stash[OUTPUT_ERRORS] = []
    config.stash[TRACKER] = Tracker(defer=True)  # what checks defer is compared between tests (_look_for_drift)
    config.stash[FIXTURES] = []
    config.pluginmanager.register(_Recorder(config.stash[RESULTS]), "vramleak-recorder")
    config.pluginmanager.register(_XdistController(config), "vramleak-xdist")
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and config.stash[SETTINGS].pin_workers:
        torch = _import_torch()
        if torch is not None:
            pin_worker(str(workerinput.get("workerid", "")), torch, os.environ)
    fraction = config.stash[SETTINGS].release_above
    if fraction is not None:
        config.pluginmanager.register(_Releaser(config, fraction), "vramleak-releaser")


TORCH_MISSING = pytest.StashKey[Optional[str]]()
"""Why torch cannot be imported here (None where it can): marked tests then run unchecked."""


def _torch_missing() -> str | None:
    """Why torch cannot be imported, found without importing it (importing it takes seconds)."""
    try:
        found = importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        found = False
    return None if found else "torch is not installed"


def _check_device_option(config: pytest.Config, spec: str) -> None:
    """A device asked for on the command line or in the ini file that is not there stops the run
    at start: a GPU job on a runner without a GPU must not pass having checked nothing."""
    torch = _import_torch()
    if torch is None:
        return
    try:
        resolve_device(spec, torch)
    except DeviceUnavailable as error:
        _, source = _option(config, "vramleak_device")
        seen = ", ".join(["cpu"] + [f"{kind} ({backend.device_count()} device(s))" for kind in ("cuda", "xpu") for backend in [getattr(torch, kind, None)] if backend is not None and backend.is_available()])
        raise pytest.UsageError(f"{source}={spec}: {error}; torch {torch.__version__} sees: {seen}") from None


_torch_import_error: list[str] = []


def _import_torch() -> Any | None:
    """torch, or None where it is not installed (the reason is kept for skip messages)."""
    try:
        import torch
    except ImportError as error:
        if not _torch_import_error:
            _torch_import_error.append(str(error))
        return None
    return torch


def pytest_report_header(config: pytest.Config) -> str:
    missing = config.stash.get(TORCH_MISSING, None)
    if missing is not None:
        return f"vramleak: {missing}: tests marked {MARKER} and the vramleak fixture run unchecked"
    return "vramleak: " + _header_settings(config)


def _header_settings(config: pytest.Config) -> str:
    """The effective device and settings, e.g. ``device cpu, checking every test (--vramleak), step warm-up 2``."""
    settings = config.stash[SETTINGS]
    scope = "every test (--vramleak)" if settings.every_test else f"tests marked {MARKER}"
    torch = sys.modules.get("torch")  # not imported here only to say which device: it takes seconds
    try:
        device = resolve_device(settings.device, torch) if torch is not None else settings.device
    except (DeviceUnavailable, ValueError) as error:
        device = f"{settings.device} ({error})"
    report = f", report {', '.join(settings.report_paths)}" if settings.report_paths else ""
    return f"device {device}, checking {scope}, {_rule_text(settings)}, step warm-up {settings.warmup}{report}"


def _rule_text(settings: Settings) -> str:
    """How leaks fail tests, in a few words for the header."""
    runs = f"a leaking test runs {settings.confirm} more times" if settings.confirm else "tests run once"
    if settings.repeat > 1:
        runs = f"each test runs {settings.repeat} times"
    floor = format_size(settings.kept_floor)
    rules = {
        "significant": f"failing growth or memory kept once from {floor}",
        "growth": "failing growth only",
        "any": "failing any leak past the budget",
    }
    if settings.fail_on is not None:
        return f"{runs}, {rules[settings.fail_on]}"
    return f"{runs}, failing growth or memory kept once from {floor} (marked tests: any leak past their budget)"


def _parse_marker(item: pytest.Item, mark: pytest.Mark) -> Budget:
    where = f"{item.nodeid}: @pytest.mark.{MARKER}"
    # The closest marker wins (a method's over its class's, a class's over its module's), but two
    # on one node leave no closest: pytest would take the first, which is not what anyone reads.
    marked = [node for node, _ in item.iter_markers_with_node(MARKER)]
    for node in dict.fromkeys(marked):
        if marked.count(node) > 1:
            if node is item:
                on = "the test (its decorators and pytest.param marks)"
            elif isinstance(node, pytest.Class):
                on = f"class {node.nodeid} (its decorators and its base classes')"
            else:
                on = f"{node.nodeid or 'the root folder'} (its pytestmark)"
            raise pytest.UsageError(f"{where}: {marked.count(node)} budgets on {on}: keep one; a budget on a test overrides its class's or module's")
    if len(mark.args) > 1:
        raise pytest.UsageError(f"{where} takes one positional argument (peak), got {len(mark.args)}: {mark.args!r}")
    unknown = sorted(set(mark.kwargs) - {"peak", "leak", "device", "repeat", "reserved", "pinned"})
    if unknown:
        raise pytest.UsageError(f"{where}: unknown keyword {unknown[0]!r}; use peak, leak, device, repeat, reserved or pinned")
    if "repeat" in mark.kwargs and mark.kwargs["repeat"] is not None:
        item.stash[REPEAT] = _check_repeat(mark.kwargs["repeat"], item.config.stash[SETTINGS].warmup, f"{where}(repeat=...)")
    if mark.args and "peak" in mark.kwargs:
        raise pytest.UsageError(f"{where}: peak given both by position and by keyword")
    values = {
        "peak": mark.args[0] if mark.args else mark.kwargs.get("peak"),
        "leak": mark.kwargs.get("leak", 0),
        "reserved": mark.kwargs.get("reserved"),
        "pinned": mark.kwargs.get("pinned"),
    }
    sizes: dict[str, int | None] = {}
    for name, value in values.items():
        try:
            sizes[name] = None if value is None and name != "leak" else parse_size(value)
        except SizeError as error:
            raise pytest.UsageError(f"{where}({name}={value!r}): {error}") from None
    device = mark.kwargs.get("device")
    if device is not None:
        try:
            device = check_device_spec(device) if isinstance(device, str) else check_device_spec(repr(device))
        except ValueError as error:
            raise pytest.UsageError(f"{where}(device={device!r}): {error}") from None
    leak = sizes["leak"]
    assert leak is not None  # parse_size never returns None
    return Budget(peak=sizes["peak"], leak=leak, device=device, reserved=sizes["reserved"], pinned=sizes["pinned"])


def _check_repeat(value: Any, warmup: int, where: str) -> int:
    """A number of runs that leaves at least two measured after ``warmup``, or a usage error."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise pytest.UsageError(f"{where}: expected a whole number of runs >= 1, got {value!r}")
    if value > 1 and value < warmup + 2:
        raise pytest.UsageError(
            f"{where}: {value} runs leave {max(0, value - warmup)} measured after {warmup} warm-up runs; "
            f"at least 2 are needed: use repeat={warmup + 2} or more, or a shorter --vramleak-warmup"
        )
    return value


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
            item.stash[BUDGET] = _parse_marker(item, mark)
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
            unavailable[spec] = _unavailable(spec)
        reason = unavailable[spec]
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))
            item.stash[SKIPPED] = True


SKIPPED = pytest.StashKey[bool]()
"""Set on a test skipped because torch or its device is missing: no check is set up for it."""


def _unavailable(spec: str) -> str | None:
    """Why a check on device ``spec`` cannot run here, if so."""
    torch = _import_torch()
    if torch is None:
        return f"vramleak: torch is not installed ({_torch_import_error[0]})"
    try:
        resolve_device(spec, torch)
    except DeviceUnavailable as error:
        return f"vramleak: {error}"
    return None


def _meter_for(item: pytest.Item, device_spec: str | None) -> Meter:
    """The meter for a test, or a skip naming what is missing."""
    torch = _import_torch()
    if torch is None:
        pytest.skip(f"vramleak: torch is not installed ({_torch_import_error[0]})")
    spec = device_spec or item.config.stash[SETTINGS].device
    try:
        return make_meter(resolve_device(spec, torch), torch)
    except DeviceUnavailable as error:
        pytest.skip(f"vramleak: {error}")


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


RUNS = pytest.StashKey[TestRuns]()
PYTORCHS_OWN = pytest.StashKey[dict[str, tuple[str, list[int]]]]()
"""Per parametrized test function: the case whose runs showed that what it keeps is PyTorch's own,
and the sizes of the storages its first run kept."""


def _checked(item: pytest.Item) -> bool:
    if item.stash.get(SKIPPED, False) or item.config.stash.get(TORCH_MISSING, None) is not None:
        return False
    return item.stash.get(BUDGET, None) is not None or "vramleak" in getattr(item, "fixturenames", ())


def _plan(item: pytest.Item, settings: Settings) -> TestRuns:
    budget = item.stash.get(BUDGET, None)
    marked = item.stash.get(MARKED, False)
    fail_on = settings.fail_on or ("any" if marked else "significant")
    leak = budget.leak if budget is not None else 0
    rule = Rule(leak, budget.peak if budget is not None else None, settings.tolerance, fail_on, settings.kept_floor)
    repeat = item.stash.get(REPEAT, settings.repeat) if budget is not None else 1
    why_once = None
    if (repeat > 1 or settings.confirm) and budget is not None and _is_doctest(item):
        repeat, why_once = 1, "doctests are not run again (doctest clears a doctest's globals after it runs)"
    if repeat > 1:
        return TestRuns(Repetitions(planned=repeat, warmup=settings.warmup), rule, True)
    may_rerun = budget is not None and settings.confirm > 0 and why_once is None
    return TestRuns(Repetitions(planned=1, warmup=1, mode="confirm"), rule, may_rerun, settings.confirm, why_once)


@pytest.hookimpl
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    """Run a checked test (again where a leak must be classified) and report it once."""
    if not _checked(item) or _run_by_another_plugin(item):
        return None
    runs = item.stash[RUNS] = _plan(item, item.config.stash[SETTINGS])
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    try:
        reports = _run_checked(item, nextitem, runs)
    finally:
        del item.stash[RUNS]
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
    return check is not None and check.engine is not None and check.started and check.error is None and check.unchecked_reason is None and check.engine.result.leaked_bytes is not None


def _run_checked(item: pytest.Item, nextitem: pytest.Item | None, runs: TestRuns) -> list[pytest.TestReport]:
    repetitions = runs.repetitions
    parent = item.parent if runs.may_rerun else nextitem
    spent: dict[str, float] = {}

    def run() -> list[pytest.TestReport]:
        repetitions.started += 1
        reports = run_once(item, parent)
        for report in reports:
            spent[report.when] = spent.get(report.when, 0.0) + report.duration
        runs.checks.append(item.stash[CHECK]) if CHECK in item.stash else None
        return reports

    first_reports = run()
    first = item.stash.get(CHECK, None)
    last_reports = first_reports
    if _usable(first):
        assert first is not None and first.engine is not None
        runs.first_begin = first.engine.begin_clock
        repetitions.runs.append(_run_record(first))
        if repetitions.mode == "confirm" and runs.may_rerun and first.engine.suspected and not first.call_failed and not _ending(item):
            runs.as_in = _kept_as_in_an_earlier_case(item, runs)
            runs.in_parameters = runs.as_in is None and _kept_in_its_parameters(item, runs, sum(spent.values()))
            repetitions.planned = 1 if runs.as_in or runs.in_parameters else 1 + runs.confirm
    else:
        repetitions.stopped = why_stopped(first_reports) or "not checked"
    random_state = RandomState() if repetitions.wants_more and not _ending(item) else None
    while repetitions.wants_more and not _ending(item):
        # Planned runs (repeat=N): the last records where tensors are made. Re-runs that confirm
        # a leak do not: a test that fails runs once more for that (below).
        recording = repetitions.mode == "repeat" and repetitions.started + 1 == repetitions.planned and _checked_records_sites(item)
        reports = _recording_run(item, runs, run) if recording else run()
        last_reports = reports
        check = item.stash.get(CHECK, None)
        stopped = why_stopped(reports) or (None if _usable(check) else "was not checked")
        if stopped:
            line = failure_line(reports)
            repetitions.stopped = f"run {repetitions.started} of {repetitions.planned} {stopped.removeprefix('the test ')}" + (f" ({line})" if line else "")
            repetitions.rerun_failed = True
            _drop_last_error()
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
        verdict.decision = replace(verdict.decision, pattern="kept_once")
        names = ", ".join(getattr(item, "callspec").params)
        verdict.notes.append(
            f"kept only in its parametrize values ({names}), which pytest keeps for the session and no other run of this case "
            f"adds to: kept once, not run again (its run took {sum(spent.values()):.1f} s)"
        )
    # --vramleak-fail-on=growth lists what tests keep once, with its holders: named too.
    listed = verdict is not None and runs.rule.fail_on == "growth" and verdict.decision.pattern in ("kept_once", "settled")
    if verdict is not None and (verdict.failing or listed):
        # A test that leaks runs once more, recording where its tensors are made (its imports are
        # done by then); then what its runs keep is named once, with that, and what PyTorch itself
        # keeps is set aside (naming walks the heap: once, not before and after the recording run).
        if _wants_sites(item, runs, verdict):
            random_state = random_state or RandomState()
            reports = _recording_run(item, runs, run)
            stopped = why_stopped(reports) or (None if _usable(item.stash.get(CHECK, None)) else "was not checked")
            if stopped:
                verdict.notes.append(f"where the tensors were made is not known: the run that records it {stopped.removeprefix('the test ')}")
                _drop_last_error()
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
    result = _finish_result(item, runs, verdict)
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
    tracker = item.config.stash[TRACKER]
    first = runs.checks[0].engine
    if first is None or first.result.device != "cpu" or runs.rule.strict:
        return None
    runs.first_kept = sorted(ref.nbytes for ref in tracker.alive_since("cpu", runs.first_begin))
    key = _function_key(item)
    earlier = item.config.stash[PYTORCHS_OWN].get(key) if key is not None else None
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
    if not params or seconds < SLOW_RUN_SECONDS or first is None or first.result.device != "cpu" or runs.rule.strict:
        return False
    if first.result.graph is not None and first.result.graph.nodes:
        return False  # autograd history: judged by its runs
    tracker = item.config.stash[TRACKER]
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
    verdict.decision = decide(runs.repetitions, engine.result, runs.rule, device="cpu", adjust=verdict.adjust, node_bytes=NODE_BYTES)
    verdict.notes.append(
        f"{format_size(kept)} held by PyTorch itself in C++, as the runs of {runs.as_in} showed for the same storages "
        "(nothing in Python refers to them; this case was not run again; --vramleak-fail-on=any counts it): not counted"
    )


def _kept_once_already(repetitions: Repetitions) -> bool:
    """Confirming re-runs stop once two in a row after the first added nothing at all (no byte,
    no autograd node): memory kept once, whatever the runs left would follow. (A test that grows
    only every third run or less often then reads as kept once.)"""
    runs = repetitions.runs
    return len(runs) >= 3 and all(run.leaked_bytes <= 0 and run.history_nodes <= before.history_nodes for before, run in zip(runs[1:], runs[2:]))


def _run_record(check: Check, runs: TestRuns | None = None) -> Run:
    """What a run left. ``runs``: the test's runs so far, for a run after the first."""
    assert check.engine is not None
    engine = check.engine.result
    graph = engine.graph
    nodes = graph.nodes if graph is not None else 0
    if runs is None or not runs.checks:
        return Run(engine.leaked_bytes or 0, engine.outcome, nodes, check.engine.begin_clock)
    first = runs.checks[0].engine
    if first is not None and first is not check.engine and first.begin_graphs is not None:
        if engine.device == "cpu":  # what tensors alive now keep of every run's graphs: a run may free an earlier one's
            tracker = check.engine.tracker
            nodes = tracker.kept_graph(threshold=first.begin_graphs, entries=tracker.entries_since_run(runs.first_begin)).nodes
        elif runs.repetitions.runs:  # (accelerators: each run's own, added up)
            nodes += runs.repetitions.runs[-1].history_nodes
    return Run(engine.leaked_bytes or 0, engine.outcome, nodes, check.engine.begin_clock)


def _drop_last_error() -> None:
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


def _judge(item: pytest.Item, runs: TestRuns) -> Verdict | None:
    """The verdict on the runs so far (None where the first run was not checked)."""
    first = runs.checks[0] if runs.checks else None
    if not _usable(first) or first is None or first.engine is None or first.budget is None:
        return None
    engine = first.engine.result
    repetitions = runs.repetitions
    decision = decide(repetitions, engine, runs.rule, device=engine.device, node_bytes=NODE_BYTES)
    return Verdict(decision, first, decision)


def _checked_records_sites(item: pytest.Item) -> bool:
    return item.config.stash[SETTINGS].sites != "off"


def _wants_sites(item: pytest.Item, runs: TestRuns, verdict: Verdict) -> bool:
    """Whether a test that ran again and leaks should run once more, recording where its tensors
    are made (what it keeps is named with that, and what PyTorch keeps for it told from what
    PyTorch made itself)."""
    repetitions = runs.repetitions
    cycles = verdict.first.engine is not None and verdict.first.engine.result.cycles_failed
    if runs.sites is not None or repetitions.mode != "confirm" or (len(repetitions.runs) < 2 and not cycles) or repetitions.rerun_failed:
        return False
    return verdict.decision.outcome == "leaked" and not _ending(item) and _checked_records_sites(item)


def _recording_run(item: pytest.Item, runs: TestRuns, run: Callable[[], list[pytest.TestReport]]) -> list[pytest.TestReport]:
    """The last run of a test run again records where its tensors are made (its imports are done
    by then): what it leaves is named with that, should the test fail."""
    recorder, storages = SiteRecorder(), StorageSites()
    runs.sites = Sites([storages, recorder])
    runs.naming_run = True
    tracker = item.config.stash[TRACKER]
    # Memory only C++ holds is named by where it was made, from the user's line or from inside a
    # library (PyTorch's own, set aside): a few frames tell that, and no view is kept from Python.
    light = runs.held_in_cpp = _held_from_cpp_only(tracker, runs.first_begin)
    recorder.start(frames=FRAMES_FOR_CPP_HELD if light else FRAMES_TRACED)
    if not light:
        storages.start()
    try:
        return run()
    finally:
        storages.stop()
        alive = tracker.alive_since("cpu", runs.first_begin)
        # tensors, and storage objects kept without one: who made each, while tracing still knows
        recorder.capture(tracker.pairs(alive) + [(storage, storage) for storage in (ref() for ref in alive) if storage is not None])
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
        if not any(made) or any(ref.born >= since and made_here is not True for ref, made_here in zip(owners, made)) or False in made:
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
    leaked = verdict.decision.outcome == "leaked" and (engine.memory_leaked or verdict.decision.pattern is not None or engine.history_bytes)
    if not (leaked or listing):
        return
    if len(runs.checks) == 1:
        if not engine.named:
            first.engine.explain()  # a test run once whose check left naming to runs that did not happen
        verdict.groups, verdict.named = list(engine.groups), True
        if runs.repetitions.runs:
            runs.repetitions.runs[0].leaked_bytes = engine.leaked_bytes or 0  # less what explaining set aside
        verdict.decision = decide(runs.repetitions, engine, runs.rule, device=engine.device, node_bytes=NODE_BYTES)
        return
    device = engine.device
    last = runs.checks[-1]
    if device != "cpu":  # the last run's check named what it left, while the allocator's index was at hand
        if last.engine is not None:
            verdict.groups, verdict.named = list(last.engine.result.groups), True
        return
    tracker = item.config.stash[TRACKER]
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
    if runs.held_in_cpp and not runs.rule.strict and not roots and second is None and not verdict.decision.grows_history:
        pytorchs = _pytorchs_own(tracker, runs, tracker.alive_since(device, runs.first_begin))
    clocks = [run.begin_clock for run in runs.repetitions.runs]
    credit = list(runs.credit) if runs.credit is not None else [0] * len(clocks)
    if pytorchs is None:
        tracker.settle()
        credit = [a + b for a, b in zip(credit, _settled_credit(tracker, runs, device))]
    sources: list[SiteSource] = [*(runs.sites.sources if runs.sites is not None else ()), *([first.engine.sites] if first.engine.sites else [])]
    name = functools.partial(
        name_leak,
        tracker,
        device,
        sites=Sites(sources) if sources else None,
        named=_named_roots(item),
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
        verdict.decision = decide(runs.repetitions, engine, runs.rule, device=device, adjust=adjust, node_bytes=NODE_BYTES)
    key = _function_key(item)
    if pytorchs is not None and not verdict.failing and key is not None and runs.first_kept:
        item.config.stash[PYTORCHS_OWN].setdefault(key, (_pasteable(item.config, item.nodeid), runs.first_kept))
    # ... and, for memory that grows, what the last measured run that left any left is shown.
    decision, repetitions = verdict.decision, runs.repetitions
    if decision.pattern == "grows" and not decision.grows_history and verdict.failing:
        series = repetitions.series(verdict.adjust)
        leaving = [index for index in range(repetitions.warmup, len(series)) if series[index] > (series[index - 1] if index else 0)]
        shown: list[Any] = []
        if runs.extra_begin is not None:  # the run that recorded sites, where it grew too: its tensors have them
            shown, which = [group for group in named.groups if group.part == len(clocks)], "the run that recorded where tensors are made"
        if not shown and leaving:
            shown, which = [group for group in named.groups if group.part == leaving[-1]], f"run {leaving[-1] + 1} of {len(repetitions.runs)}"
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
        if where == device and made is not None and made + 1 < len(clocks) and not (runs.extra_begin is not None and born >= runs.extra_begin):
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
    if engine.device != "cpu":
        return
    tracker = item.config.stash[TRACKER]
    tracker.settle()
    runs.credit = _settled_credit(tracker, runs, "cpu")
    if any(runs.credit):
        verdict.adjust = list(runs.credit)
        verdict.decision = decide(runs.repetitions, engine, runs.rule, device="cpu", adjust=verdict.adjust, node_bytes=NODE_BYTES)


def _run_index(starts: list[int], born: dict[StorageKey, int], key: StorageKey) -> int | None:
    """Which run (by the clocks the runs began at) made the storage at ``key``."""
    clock = born.get(key)
    return None if clock is None else max((index for index, start in enumerate(starts) if start <= clock), default=None)


def _finish_result(item: pytest.Item, runs: TestRuns, verdict: Verdict | None) -> TestResult:
    """The JSON record of a checked test, from its first run and the verdict on all of them."""
    first = runs.checks[0] if runs.checks else item.stash.get(CHECK, None)
    if first is None:
        return TestResult(item.nodeid, None, "unchecked", reason="not set up")
    budget = first.budget or Budget(leak=None)  # type: ignore[arg-type]
    result = TestResult(nodeid=item.nodeid, device=first.meter.name if first.meter else None, outcome="unchecked", budget={"peak": budget.peak, "leak": budget.leak})
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
        result.outcome = decision.outcome
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
            result.notes.append(f"the runs after the first were not used: {repetitions.stopped}; judged on the first run")
    else:
        check = first
        result.reason = check.error and f"vramleak internal error: {check.error}" or check.unchecked_reason or next((step.reason for step in check.steps if step.reason), None)
        if repetitions.stopped and repetitions.started > 1 and result.reason:
            result.reason += f" (run {repetitions.started} of {repetitions.planned})"
    if runs.why_once:
        result.notes.append(runs.why_once)
    _step_figures(first, result)
    return result


def _step_figures(check: Check, result: TestResult) -> None:
    """A test's step checks: the figures of the one that grew (else the last)."""
    if check.step_leaked and result.outcome == "unchecked":
        result.outcome = "leaked"
    if not check.steps:
        return
    last = next((step for step in reversed(check.steps) if step.grows), check.steps[-1])
    if check.step_leaked:
        result.outcome = "leaked"
    elif result.outcome == "unchecked" and check.budget is None and any(step.verdict is not None for step in check.steps) and check.unchecked_reason is None:
        result.outcome = "passed"  # checked through the fixture alone
    result.steps = list(last.steps)
    result.warmup_steps = list(last.warmup_steps)
    if last.leak is not None and not result.tensors:
        result.tensors = [group.to_json() for group in last.leak.groups]
    result.growth_bytes = last.verdict.growth_bytes if last.verdict is not None else result.growth_bytes
    result.settled_after_step = last.settled_after
    if last.settled_after is not None:
        result.notes.append(last.describe())
    result.device = result.device or last.device
    if result.outcome == "unchecked" and result.reason is None:
        result.reason = next((step.reason for step in check.steps if step.reason), None)


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
    growth_first = decision.pattern == "grows" and not decision.grows_history and not decision.message.startswith("leaked ")
    if decision.about and growth_first:  # the runs, then what the last of them that grew left
        lines.append(decision.about)
    leaked = decision.outcome == "leaked" and (decision.pattern is not None or first.memory_leaked or first.history_bytes > 0)
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


def _judge_foreign_run(item: pytest.Item, runs: TestRuns, check: Check) -> None:
    """A run another plugin runs: judged alone, failing its teardown (where the record goes too)."""
    runs.checks = [check]
    if _usable(check):
        runs.repetitions.runs = [_run_record(check)]
    verdict = _judge(item, runs)
    if verdict is not None and verdict.failing:
        _name_runs(item, runs, verdict)
    runs.result = _finish_result(item, runs, verdict)
    if verdict is not None and verdict.failing:
        raise VramLeak(_failure_text(runs, verdict), pytrace=False)


def _final_reports(
    item: pytest.Item, runs: TestRuns, reports: list[pytest.TestReport], result: TestResult, verdict: Verdict | None, spent: dict[str, float]
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
        reports[index].vramleak_outcome = result.outcome  # type: ignore[attr-defined]
    elif failure is not None and call is not None and call.failed:  # one failure, both reasons
        call.sections.append(("vramleak: the test also leaked", failure))
    teardown = reports[-1]
    teardown.vramleak = result.to_json()  # type: ignore[attr-defined]
    _record_properties(teardown, result)
    return reports


def _record_properties(teardown: pytest.TestReport, result: TestResult) -> None:
    """JUnit XML writes a test's teardown properties: CI dashboards read the figures there."""
    teardown.user_properties.append(("vramleak_outcome", result.outcome))
    for name in ("leaked_bytes", "peak_bytes", "growth_bytes"):
        value = getattr(result, name)
        if value is not None:
            teardown.user_properties.append((f"vramleak_{name}", value))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    budget = item.stash.get(BUDGET, None)
    tracker = item.config.stash[TRACKER]
    runs = item.stash.get(RUNS, None)
    if runs is None and _checked(item):  # another plugin runs the test: each run is judged alone
        runs = item.stash[RUNS] = _plan(item, item.config.stash[SETTINGS])
        runs.may_rerun, runs.foreign = False, True
    if runs is None:  # not checked: this test runs untracked, the index must be rebuilt after it
        tracker.stale = True
        return
    check = Check(budget)
    item.stash[CHECK] = item.config.stash[ACTIVE] = check
    check.meter = _meter_for(item, budget.device if budget else None)
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
            rules=rules if first else Rules(count_cpp_held=runs.rule.strict, watch_peak=False, strict_cycles=settings.strict_cycles and runs.naming_run, keep_cycle_garbage=True),
            record_sites=settings.sites == "on" and first,
            trace_folder=_trace_folder(item.config) if trace and first else None,
            name=item.nodeid,
            named_roots=functools.partial(_named_roots, item),
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
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    check = item.stash.get(CHECK, None)
    if check is None:
        return report
    if report.when == "call" and call.excinfo is not None and check.meter is not None and is_out_of_memory(call.excinfo.value):
        tracker = item.config.stash[TRACKER]
        try:
            with tracker.unfrozen():
                contents = memory_contents(check.meter, call.excinfo.value)
            breakdown = check.engine.result.peak_breakdown if check.engine is not None else None
            if breakdown is not None:
                contents += "\n" + breakdown.render()
            report.sections.append(("vramleak: what filled the memory", contents))
        except Exception as error:  # never let the forensics replace the test's own failure
            report.sections.append(("vramleak: what filled the memory", f"could not be read: {type(error).__name__}: {error}"))
    if report.when == "call":
        check.call_passed = report.passed
    runs = item.stash.get(RUNS, None)
    if report.when in ("setup", "call") and check.unchecked_reason is None:
        if check.step_leaked:
            check.unchecked_reason = "memory grew across the steps of the vramleak fixture"
        elif report.failed and report.when == "call" and check.budget is not None and runs is not None and not runs.foreign:
            check.call_failed = True  # its own failure stands; what it leaked is shown beside it
        elif report.failed:
            check.unchecked_reason = f"the test failed in {report.when}"
        elif report.skipped:
            check.unchecked_reason = "the test was skipped" if not hasattr(report, "wasxfail") else "the test xfailed"
    if report.when == "teardown" and report.failed and check.unchecked_reason is None and check.error is None and not isinstance(call.excinfo and call.excinfo.value, VramLeak):
        check.unchecked_reason = "teardown failed"
    if report.when == "teardown" and runs is not None and runs.foreign:
        result = runs.result or _finish_result(item, runs, None)
        report.vramleak = result.to_json()  # type: ignore[attr-defined]
        _record_properties(report, result)
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
            _drop_last_error()
            # Checked on this run alone, as a test run once is: a suspected leak is confirmed by a
            # full collection, which frees those frames where an observation during the call froze
            # them with the heap (they were alive then: the error was being raised).
            check.engine.settle_leaks = True
        try:
            check.engine.finish(confirm=functools.partial(_drop_fixture_values, item))
        except Exception as error:
            check.error = f"{type(error).__name__}: {error}"
            raise VramLeak(f"vramleak could not check this test: {type(error).__name__}: {error}", pytrace=False) from None
        runs = item.stash.get(RUNS, None)
        if runs is not None and runs.foreign:
            _judge_foreign_run(item, runs, check)
        return outcome
    finally:
        item.config.stash[ACTIVE] = None
        if check.engine is not None:
            check.engine.close()
        item.config.stash.setdefault(DRIFT_SPAN, [item.nodeid, item.nodeid])[1] = item.nodeid
        _look_for_drift(item.config, due=True)


DRIFT = pytest.StashKey[list[dict[str, Any]]]()
"""Older tensors found grown in place, or given gradients, between checks (see :meth:`Tracker.drift`)."""
DRIFT_SPAN = pytest.StashKey[list[str]]()
"""The first and the last checked test since the last comparison between checks."""


def _look_for_drift(config: pytest.Config, *, due: bool) -> None:
    """Where checks could not afford to compare every storage's size and every leaf's gradient,
    compare them now, between tests (``due``: as often as keeps the cost small; otherwise
    whenever a check deferred them), and report what changed, charged to no test."""
    tracker = config.stash.get(TRACKER, None)
    if tracker is None or tracker.active or not (tracker.drift_due() if due else tracker.deferred):
        return
    first, last = config.stash.get(DRIFT_SPAN, ["", ""])
    with contextlib.suppress(KeyError):
        del config.stash[DRIFT_SPAN]
    try:
        found = tracker.drift()
    except Exception as error:  # said in the summary, never a crashed session
        config.stash[OUTPUT_ERRORS].append(f"could not compare older tensors between checks: {type(error).__name__}: {error}")
        return
    if not found:
        return
    where = last if first == last else f"{first} to {last}"
    devices = sorted({ref.device for ref, _ in found})
    for device in devices:
        grown = [(ref, delta) for ref, delta in found if ref.device == device]
        finding: dict[str, Any] = {"where": where, "device": device, "bytes": sum(delta for _, delta in grown)}
        try:
            groups = describe({(ref.device, ref.pointer) for ref, _ in grown}, device)
        except Exception as error:  # the finding stands without its holders
            finding["held_by"] = [f"not named: vramleak could not search the heap: {type(error).__name__}: {error}"]
        else:
            finding["held_by"] = list(dict.fromkeys(chain for group in groups for chain in group.held_by))[:MAX_FIXTURE_CHAINS]
        config.stash.setdefault(DRIFT, []).append(finding)


def _drop_fixture_values(item: pytest.Item) -> None:
    """Drop the test's fixture values now, as pytest does right after the teardown phase.

    Function-scoped fixtures are finalised by then, but ``item.funcargs`` still refers to their
    values until pytest resets it; a list fixture the test appended tensors to would otherwise
    look leaked. Done only when a leak is suspected, so ordinary tests keep pytest's timing.
    """
    funcargs = getattr(item, "funcargs", None)
    if isinstance(funcargs, dict):
        funcargs.clear()


def _trace_folder(config: pytest.Config) -> Path:
    """Snapshots go next to the (first) report, or into ``.vramleak-traces`` under the root folder."""
    report = next(iter(config.stash[SETTINGS].report_paths), None)
    return Path(report).resolve().parent / "vramleak-traces" if report else config.rootpath / ".vramleak-traces"


def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config) -> tuple[str, str, Any] | None:
    outcome = getattr(report, "vramleak_outcome", None)
    if report.when == "teardown" and report.failed:  # a run another plugin ran: it fails as it tears down
        outcome = (getattr(report, "vramleak", None) or {}).get("outcome")
    elif report.when != "call" or not report.failed:
        return None
    if outcome == "leaked":
        return "failed", "L", ("LEAKED", {"red": True})
    if outcome == "over_budget":
        return "failed", "B", ("OVER BUDGET", {"red": True})
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


@dataclass
class FixtureMemory:
    """Storages a module-, class-, package- or session-scoped fixture created during its setup."""

    name: str
    scope: str
    where: str
    device: str
    storages: list[StorageRef]

    def alive(self) -> list[tuple[StorageKey, int]]:
        """The storages still alive, with their sizes."""
        return [((ref.device, ref.pointer), ref.nbytes) for ref in self.storages if ref() is not None]


FIXTURES = pytest.StashKey[list[FixtureMemory]]()
FIXTURE_DEFS = pytest.StashKey[dict[int, pytest.FixtureDef[Any]]]()
"""Fixtures wider than a test that were set up, so that what their values hold is named after them."""


def _named_roots(item: pytest.Item) -> list[NamedRoot]:
    """Values pytest keeps for many tests, named as the user wrote them: the test's parametrize
    values, the values of fixtures wider than a test, and what pytest keeps of a test until the
    session ends (its class instance, its record_property values, the warnings it recorded)."""
    named = []
    callspec = getattr(item, "callspec", None)
    for name, value in getattr(callspec, "params", {}).items():
        named.append(NamedRoot(f"parametrize value {name} of {item.name}", value, "parametrize"))
    instance = getattr(item, "instance", None)
    if instance is not None:
        named.append(NamedRoot(f"self (the {type(instance).__name__} instance pytest keeps until the session ends)", instance, "pytest"))
    if getattr(item, "user_properties", None):
        named.append(NamedRoot(f"record_property values of {item.name}", item.user_properties, "pytest"))
    # Warnings pytest catches while the test runs, then keeps for the session in its hook's history.
    catching = getattr(getattr(sys.modules.get("warnings"), "_showwarnmsg_impl", None), "__self__", None)
    recorded = getattr(getattr(item.config.hook, "pytest_warning_recorded", None), "_call_history", None)
    for warnings_kept in (catching, recorded):
        if type(warnings_kept) is list and warnings_kept:
            named.append(NamedRoot(PYTEST_WARNINGS, warnings_kept, "pytest"))
    for fixturedef in item.config.stash.get(FIXTURE_DEFS, {}).values():
        cached = fixturedef.cached_result
        if cached is not None and cached[0] is not None:
            named.append(NamedRoot(f"fixture '{fixturedef.argname}' ({fixturedef.scope} scope)", cached[0], "fixture"))
    return named
MAX_FIXTURE_CHAINS = 3


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest) -> Generator[None, Any, Any]:
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
        check.engine.process_groups.adopt()
        check.engine.children.adopt()
        if check.meter.name != "cpu":
            check.engine.adopt_bytes(check.meter.allocated_bytes() - allocated)
    tracker.observe(collect=False, watch=False)
    created = tracker.created(check.meter.name, since=before)
    tracker.adopt(created)
    if config.stash[SETTINGS].every_test:
        if created:
            where = fixturedef.baseid or "conftest"
            config.stash[FIXTURES].append(FixtureMemory(fixturedef.argname, fixturedef.scope, where, check.meter.name, created))
    return value


def _fixture_leftovers(config: pytest.Config) -> list[dict[str, Any]]:
    """Fixtures wider than a test whose storages are still alive once every fixture is torn down,
    with what holds them (a walk of the heap, paid only when some are left)."""
    leftovers: list[dict[str, Any]] = []
    memories = config.stash.get(FIXTURES, [])
    if not any(memory.alive() for memory in memories):
        return leftovers
    gc.collect()  # fixture values on reference cycles (a model and its modules' hooks) are garbage, not kept
    for memory in memories:
        alive = memory.alive()
        if not alive:
            continue
        leftover: dict[str, Any] = {"fixture": memory.name, "scope": memory.scope, "where": memory.where, "bytes": sum(size for _, size in alive)}
        try:
            groups = describe([key for key, _ in alive], memory.device)
        except Exception as error:  # the finding stands without its holders
            leftover["held_by"], leftover["diagnoses"] = [f"not named: vramleak could not search the heap: {type(error).__name__}: {error}"], []
        else:
            leftover["held_by"] = list(dict.fromkeys(chain for group in groups for chain in group.held_by))[:MAX_FIXTURE_CHAINS]
            leftover["diagnoses"] = list(dict.fromkeys(finding for group in groups for finding in group.diagnoses))
        leftovers.append(leftover)
    return leftovers


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


def _latest(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per test, the last reported: a test run again (a rerun plugin, a crashed xdist
    worker's test run elsewhere) is listed once."""
    return list({result["nodeid"]: result for result in results}.values())


def _pasteable(config: pytest.Config, nodeid: str) -> str:
    """A test id relative to where pytest was invoked, as pytest's own short summary prints it,
    so that it can be pasted back on the command line (ids are relative to the rootdir)."""
    invoked = config.invocation_params.dir
    if invoked == config.rootpath:
        return nodeid
    path, separator, rest = nodeid.partition("::")
    return os.path.relpath(config.rootpath / path, invoked) + separator + rest


def _idle_options(config: pytest.Config) -> list[str]:
    """The options given that act on checked tests only, in a run that ran tests and checked none."""
    given = [
        "--" + option.ini.replace("_", "-") if config.getoption(option.ini) is not None else f"ini option {option.ini}"
        for option in OPTIONS
        if option.ini in CHECK_ONLY and (config.getoption(option.ini) is not None or str(config.getini(option.ini)) != option.default)
    ]
    recorder = config.pluginmanager.get_plugin("vramleak-recorder")
    if not given or recorder is None or not recorder.ran or any(result["outcome"] != "unchecked" for result in config.stash.get(RESULTS, [])):
        return []
    return given


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    scheduler = config.stash.get(RELEASER, None)
    fixtures: list[dict[str, Any]] = config.stash.get(LEFTOVERS, [])
    between_checks: list[dict[str, Any]] = config.stash.get(DRIFT, [])
    lines = summary_lines(
        _latest(config.stash.get(RESULTS, [])),
        fixtures=fixtures,
        between_checks=between_checks,
        releases=(scheduler.releases, scheduler.released_bytes) if scheduler is not None else (0, 0),
        verbosity=config.get_verbosity(),
        shown_id=functools.partial(_pasteable, config),
    )
    if lines:
        terminalreporter.write_sep("=", "vramleak summary")
        for line in lines:
            terminalreporter.write_line(line)
    for error in config.stash.get(OUTPUT_ERRORS, []):
        terminalreporter.write_line(f"vramleak: {error}", red=True, bold=True)
    idle = _idle_options(config)
    if idle:
        terminalreporter.write_line(
            f"vramleak: no test was checked (no --vramleak, no test marked {MARKER} or using the vramleak fixture): "
            f"{', '.join(idle)} had nothing to act on",
            yellow=True,
        )
    not_written = config.stash.get(NOT_WRITTEN, [])
    if not_written:
        terminalreporter.write_line(f"vramleak: no test ran, so no report was written ({', '.join(not_written)} left as they were)")


LEFTOVERS = pytest.StashKey[list[dict[str, Any]]]()


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    tracker = config.stash.get(TRACKER, None)
    if tracker is not None:
        tracker.end()  # never leave the heap frozen behind a session
        if OUTPUT_ERRORS in config.stash:
            _look_for_drift(config, due=False)
    settings = config.stash.get(SETTINGS, None)
    if settings is None:
        return
    config.stash[LEFTOVERS] = _fixture_leftovers(config) + config.stash.get(WORKER_LEFTOVERS, [])
    workeroutput = getattr(config, "workeroutput", None)
    if workeroutput is not None:  # a pytest-xdist worker: the controller reports for it
        # Each worker sets up its own module- and session-scoped fixtures: say whose this is.
        worker = getattr(config, "workerinput", {}).get("workerid")
        workeroutput["vramleak_fixtures"] = [{**leftover, "worker": worker} for leftover in config.stash[LEFTOVERS]]
        workeroutput["vramleak_drift"] = [{**finding, "worker": worker} for finding in config.stash.get(DRIFT, [])]
        return
    results = _latest(config.stash[RESULTS])
    leftovers: list[dict[str, Any]] = config.stash[LEFTOVERS]
    drift: list[dict[str, Any]] = config.stash.get(DRIFT, [])
    outputs: list[tuple[str, Callable[[], None]]] = [("the Markdown summary", lambda: _write_markdown(config, results))]
    if settings.save and session.exitstatus == pytest.ExitCode.INTERRUPTED:
        config.stash[OUTPUT_ERRORS].append(f"the run was interrupted: the saved run {settings.save!r} was left as it was")
    elif settings.save:
        figures = {
            r["nodeid"]: {name: r[name] for name in ("device", "peak_bytes", "end_bytes", "leaked_bytes")}
            for r in results
            if r["outcome"] != "unchecked"
        }
        path = saved_run_path(config.rootpath, settings.save)
        outputs.append((f"the saved run to {path}", lambda: write_text_atomically(path, json.dumps({"version": 1, "tests": figures}, indent=2) + "\n")))
    for report in settings.report_paths:
        if is_html_path(report):
            outputs.append((f"the HTML report to {report}", functools.partial(_write_html, config, report, results, leftovers, drift)))
        else:
            about = {**_about(config), "host": socket.gethostname()}
            write_report = functools.partial(write_json, report, results, fixtures=leftovers, between_checks=drift, about=about)
            outputs.append((f"the JSON report to {report}", write_report))
    if settings.benchmark_json:
        benchmark = json.dumps(benchmark_entries(results), indent=2) + "\n"
        outputs.append((f"the benchmark figures to {settings.benchmark_json}", functools.partial(write_text_atomically, settings.benchmark_json, benchmark)))
    recorder = config.pluginmanager.get_plugin("vramleak-recorder")
    if recorder is not None and not recorder.ran:
        # --collect-only, -k matching nothing, a collection error: the last real run's files stay.
        files = [*settings.report_paths, settings.benchmark_json, settings.markdown]
        if settings.save:
            files.append(str(saved_run_path(config.rootpath, settings.save)))
        config.stash[NOT_WRITTEN] = [str(file) for file in files if file]
        return
    errors = config.stash[OUTPUT_ERRORS]
    for what, write in outputs:
        try:
            write()
        except Exception as error:  # the others are still written; the summary says what failed
            errors.append(f"could not write {what}: {type(error).__name__}: {error}")
    if errors and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.USAGE_ERROR


OUTPUT_ERRORS = pytest.StashKey[list[str]]()
NOT_WRITTEN = pytest.StashKey[list[str]]()
"""The files a run that ran no test left as they were."""


def _write_html(config: pytest.Config, path: str, results: list[dict[str, Any]], leftovers: list[dict[str, Any]], drift: list[dict[str, Any]]) -> None:
    write_text_atomically(path, render_html(results, fixtures=leftovers, between_checks=drift, about=_about(config)))


def _about(config: pytest.Config) -> dict[str, str]:
    """What the HTML report says of the run under its title."""
    from importlib.metadata import version

    about = {"generated": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    about["pytest-vramleak"] = version("pytest-vramleak")
    torch = sys.modules.get("torch")
    if torch is not None:
        about["torch"] = str(torch.__version__)
    about["python"] = sys.version.split()[0]
    about["settings"] = _header_settings(config)
    return about


def _write_markdown(config: pytest.Config, results: list[dict[str, Any]]) -> None:
    """The Markdown summary, to ``--vramleak-markdown`` or appended to ``$GITHUB_STEP_SUMMARY``."""
    path = config.stash[SETTINGS].markdown
    if not results:
        return
    if path:
        write_text_atomically(path, render_markdown(results))
    elif os.environ.get("GITHUB_STEP_SUMMARY"):
        with open(os.environ["GITHUB_STEP_SUMMARY"], "a") as stream:  # other steps append there too
            stream.write(render_markdown(results))


class VramLeakFixture:
    """Checks repeated steps for memory growth: ``for i in vramleak.steps(10): train_step()``.

    The first ``warmup`` steps are not measured (ini ``vramleak_warmup``, default 2); memory is
    measured after each later step, and the test fails when it keeps growing (see the README for
    the rule). A loop left early (``break``, ``return``, an exception the test catches) is judged
    on the steps measured so far, as the test tears down. ``vramleak.results`` holds every
    check's figures.
    """

    def __init__(self, watcher: StepWatcher | None) -> None:
        self._watcher = watcher
        """None where torch cannot be imported: the steps run, unchecked."""

    def __repr__(self) -> str:
        return f"<vramleak fixture: {len(self.results)} step check(s) so far>"

    @property
    def results(self) -> list[StepResult]:
        """The step checks run so far in this test."""
        return self._watcher.results if self._watcher is not None else []

    def steps(self, n: int, *, warmup: int | None = None) -> Iterator[int]:
        """Yield ``0 .. n-1``; after the last step, fail the test if memory kept growing."""
        try:
            n, checked = (self._watcher or StepWatcher()).check_arguments(n, warmup)
            warmup = checked if warmup is not None else None
        except ValueError as error:
            message = f"vramleak.{error}"
        else:
            return self._run(n, warmup) if self._watcher is not None else iter(range(n))
        pytest.fail(message, pytrace=False)

    def _run(self, n: int, warmup: int | None) -> Iterator[int]:
        assert self._watcher is not None
        yield from self._watcher.steps(n, warmup=warmup)
        result = self._watcher.results[-1]
        if result.grows:
            raise VramLeak(result.describe(), pytrace=False)

    def check(self, step: Callable[..., Any], *, steps: int = 10, warmup: int | None = None) -> StepResult:
        """Call ``step(i)`` (or ``step()``) ``steps`` times and fail the test if memory kept growing."""
        __tracebackhide__ = True  # a step that raises shows the user's frames, as pytest's own are hidden
        try:
            call = step_caller(step)
            for index in self.steps(steps, warmup=warmup):
                call(index)
        except StepNotRun as error:
            message = f"vramleak.{error}"
        else:
            if self._watcher is None:
                return StepResult("none", 0, [], None, reason="not checked: torch is not installed")
            return self._watcher.results[-1]
        pytest.fail(message, pytrace=False)


@pytest.fixture
def vramleak(request: pytest.FixtureRequest) -> VramLeakFixture:
    """Check repeated training or inference steps for memory that keeps growing.

    ``for i in vramleak.steps(n, warmup=2): ...`` or ``vramleak.check(step_fn, steps=n)``; the
    first ``warmup`` steps are not measured, and the test fails when memory grows across the rest.
    """
    settings = request.config.stash[SETTINGS]
    if request.config.stash.get(TORCH_MISSING, None) is not None:
        return VramLeakFixture(None)  # the steps run, unchecked, as the header says
    budget = request.node.stash.get(BUDGET, None)
    check = request.node.stash.get(CHECK, None)
    meter = check.meter if check is not None and check.meter is not None else _meter_for(request.node, budget.device if budget else None)
    if check is None:
        check = request.node.stash[CHECK] = Check(None, meter)
    def on_result(result: StepResult) -> None:
        check.steps.append(result)
        check.step_leaked = check.step_leaked or result.grows
        if result.grows and result.stopped_early:
            check.left_early = result

    watcher = StepWatcher(
        meter.name,
        warmup=settings.warmup,
        tolerance=settings.tolerance,
        meter=meter,
        tracker=request.config.stash[TRACKER],
        record_sites=settings.sites != "off",
        on_result=on_result,
        named_roots=functools.partial(_named_roots, request.node),
    )
    return VramLeakFixture(watcher)

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
import json
import os
import sys
import weakref
from pathlib import Path
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from .devices import (
    CudaMeter,
    DeviceUnavailable,
    Meter,
    clear_torch_caches,
    explain_reserved,
    is_out_of_memory,
    make_meter,
    measure_growth,
    pin_worker,
    resolve_device,
)
from .html_report import is_html_path, render_html
from .release import PercentError, ReleaseScheduler, parse_percent
from .report import TestResult, leaked_figure, render_markdown, write_json, write_text_atomically
from .sizes import SizeError, format_size, parse_size
from .census import StorageKey
from .snapshot import Snapshot, describe, diff, memory_contents, take_snapshot
from .history import AllocatorHistory
from .sites import SiteRecorder, Sites, SiteSource, release_resident_mode
from .steps import StepResult, StepWatcher
from .tracker import Tracker
from .verdict import Budget, BudgetVerdict, Increase, judge_budget, judge_increase, parse_increase

MARKER = "vram_budget"
EXEMPT_MARKER = "allow_vram_leak"
DEFAULT_WARMUP = 2
_DEVICE_SPECS = "auto|cpu|cuda|cuda:N|mps|xpu"

_HELP = {
    "vramleak": "check every test for leaked tensor memory, as if marked vram_budget()",
    "vramleak_device": f"device to measure: {_DEVICE_SPECS} (default auto: the current accelerator, else cpu)",
    "vramleak_report": "write a report of every checked test to this path: HTML when it ends in .html or .htm, else JSON (repeat for both)",
    "vramleak_warmup": f"unmeasured warm-up steps of the vramleak fixture (default {DEFAULT_WARMUP})",
    "vramleak_tolerance": "growth across measured steps that is not yet a leak, e.g. '64 KiB' (default 0)",
    "vramleak_sites": "record where leaked tensors were allocated: on or off (default on)",
    "vramleak_strict_cycles": "fail tests whose tensors lived on reference cycles until garbage collection",
    "vramleak_pin_workers": "give each pytest-xdist worker its own GPU, by worker number",
    "vramleak_trace": "record the CUDA allocator's history while checked tests run; save a snapshot per leaking test",
    "vramleak_save": "save each checked test's peak and end figures under this name (in .vramleak/ under the root folder)",
    "vramleak_compare": "compare each checked test's peak with the run saved under this name; fail growth past --vramleak-max-increase",
    "vramleak_max_increase": "growth over the compared run that fails a test only past both limits, e.g. '10%, 1 MiB' (default '10%, 64 KiB')",
    "vramleak_markdown": "write a Markdown summary for a CI job page to this path (default: append to $GITHUB_STEP_SUMMARY when set)",
    "vramleak_release_above": "between tests, empty the CUDA caching allocator when its reserved memory passes this share of a device, e.g. 80%",
}


class VramLeak(pytest.fail.Exception):  # type: ignore[name-defined,misc]
    """A test leaked or went over its peak budget."""

    __module__ = "builtins"  # shown as "VramLeak: ..." like pytest's own "Failed: ..."


@dataclass(frozen=True)
class Settings:
    """The effective options, CLI first, then ini."""

    every_test: bool
    device: str
    report_paths: tuple[str, ...]
    """Where to write reports: HTML for ``.html``/``.htm``, JSON otherwise."""
    warmup: int
    tolerance: int
    sites: bool = True
    release_above: float | None = None
    strict_cycles: bool = False
    trace: bool = False
    save: str | None = None
    compare: dict[str, dict[str, Any]] | None = None
    """The saved run's figures by test id, when comparing."""
    max_increase: Increase = Increase()


@dataclass
class Check:
    """One test's check in progress."""

    budget: Budget | None
    """None for a test checked only through the vramleak fixture."""
    meter: Meter | None = None
    tracker: Tracker | None = None
    sites: SiteRecorder | None = None
    history: AllocatorHistory | None = None
    others: list[tuple[CudaMeter, Snapshot]] = field(default_factory=list)
    """The process's other CUDA devices, with their allocated bytes at the baseline."""
    baseline: Snapshot | None = None
    peak_bytes: int | None = None
    unchecked_reason: str | None = None
    error: str | None = None
    steps: list[StepResult] = field(default_factory=list)
    step_leaked: bool = False
    cycle_bytes: int | None = None
    result: TestResult | None = None


SETTINGS = pytest.StashKey[Settings]()
RESULTS = pytest.StashKey[list[dict[str, Any]]]()
CHECK = pytest.StashKey[Check]()
BUDGET = pytest.StashKey[Budget | None]()
TRACKERS = pytest.StashKey[dict[str, Tracker]]()


def vram_budget(peak: Any = None, *, leak: Any = 0, device: str | None = None) -> Any:
    """Put a test under a leak budget and a peak-memory budget: ``@vram_budget("2 GiB", leak="1 MiB")``.

    The same as ``@pytest.mark.vram_budget(...)``; sizes are bytes or strings such as ``"512 MiB"``.
    Also usable bare, ``@vram_budget``, for the defaults (no peak limit, no leak allowed).
    """
    if callable(peak):
        return getattr(pytest.mark, MARKER)(peak)
    return getattr(pytest.mark, MARKER)(peak, leak=leak, device=device)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("vramleak", "tensor memory leak checks (pytest-vramleak)")
    group.addoption("--vramleak", action="store_true", default=None, help=_HELP["vramleak"])
    group.addoption("--vramleak-device", default=None, metavar="DEVICE", help=_HELP["vramleak_device"])
    group.addoption("--vramleak-report", action="append", default=None, metavar="PATH", help=_HELP["vramleak_report"])
    group.addoption("--vramleak-warmup", default=None, metavar="N", help=_HELP["vramleak_warmup"])
    group.addoption("--vramleak-tolerance", default=None, metavar="SIZE", help=_HELP["vramleak_tolerance"])
    group.addoption("--vramleak-sites", default=None, metavar="on|off", help=_HELP["vramleak_sites"])
    group.addoption("--vramleak-strict-cycles", action="store_true", default=None, help=_HELP["vramleak_strict_cycles"])
    group.addoption("--vramleak-pin-workers", action="store_true", default=None, help=_HELP["vramleak_pin_workers"])
    group.addoption("--vramleak-trace", action="store_true", default=None, help=_HELP["vramleak_trace"])
    group.addoption("--vramleak-markdown", default=None, metavar="PATH", help=_HELP["vramleak_markdown"])
    group.addoption("--vramleak-save", default=None, metavar="NAME", help=_HELP["vramleak_save"])
    group.addoption("--vramleak-compare", default=None, metavar="NAME", help=_HELP["vramleak_compare"])
    group.addoption("--vramleak-max-increase", default=None, metavar="LIMITS", help=_HELP["vramleak_max_increase"])
    group.addoption("--vramleak-release-above", default=None, metavar="PERCENT", help=_HELP["vramleak_release_above"])
    parser.addini("vramleak", _HELP["vramleak"], type="bool", default=False)
    parser.addini("vramleak_device", _HELP["vramleak_device"], default="auto")
    parser.addini("vramleak_report", _HELP["vramleak_report"], type="args", default=[])
    parser.addini("vramleak_warmup", _HELP["vramleak_warmup"], default=str(DEFAULT_WARMUP))
    parser.addini("vramleak_tolerance", _HELP["vramleak_tolerance"], default="0")
    parser.addini("vramleak_sites", _HELP["vramleak_sites"], default="on")
    parser.addini("vramleak_strict_cycles", _HELP["vramleak_strict_cycles"], type="bool", default=False)
    parser.addini("vramleak_pin_workers", _HELP["vramleak_pin_workers"], type="bool", default=False)
    parser.addini("vramleak_trace", _HELP["vramleak_trace"], type="bool", default=False)
    parser.addini("vramleak_markdown", _HELP["vramleak_markdown"], default="")
    parser.addini("vramleak_save", _HELP["vramleak_save"], default="")
    parser.addini("vramleak_compare", _HELP["vramleak_compare"], default="")
    parser.addini("vramleak_max_increase", _HELP["vramleak_max_increase"], default="10%, 64 KiB")
    parser.addini("vramleak_release_above", _HELP["vramleak_release_above"], default="")


def _option(config: pytest.Config, ini_name: str) -> tuple[Any, str]:
    """The value of a setting and where it came from, for error messages."""
    cli_name = "--" + ini_name.replace("_", "-")
    value = config.getoption(ini_name)
    if value is not None:
        return value, cli_name
    return config.getini(ini_name), f"ini option {ini_name}"


def _check_device_spec(spec: str) -> str:
    spec = spec.strip().lower()
    kind, _, index = spec.partition(":")
    if spec in ("auto", "cpu", "mps", "xpu", "cuda") or (kind in ("cuda", "xpu") and index.isdigit()):
        return spec
    raise ValueError(f"unknown device {spec!r}; expected {_DEVICE_SPECS}")


def read_settings(config: pytest.Config) -> Settings:
    """Read and validate every option; a bad value is a usage error naming its source."""
    every_test, _ = _option(config, "vramleak")
    device, source = _option(config, "vramleak_device")
    try:
        device = _check_device_spec(str(device))
    except ValueError as error:
        raise pytest.UsageError(f"{source}: {error}") from None
    report_paths, source = _option(config, "vramleak_report")
    for report in report_paths:
        problem = _unwritable(Path(report))
        if problem:
            raise pytest.UsageError(f"{source}: cannot write a report to {report}: {problem}")
    warmup_text, source = _option(config, "vramleak_warmup")
    try:
        warmup = int(str(warmup_text).strip())
        if warmup < 0:
            raise ValueError
    except ValueError:
        raise pytest.UsageError(f"{source}: expected a whole number of steps >= 0, got {warmup_text!r}") from None
    tolerance_text, source = _option(config, "vramleak_tolerance")
    try:
        tolerance = parse_size(str(tolerance_text))
    except SizeError as error:
        raise pytest.UsageError(f"{source}: {error}") from None
    sites_text, source = _option(config, "vramleak_sites")
    if str(sites_text).strip().lower() not in ("on", "off"):
        raise pytest.UsageError(f"{source}: expected on or off, got {sites_text!r}")
    sites = str(sites_text).strip().lower() == "on"
    release_text, source = _option(config, "vramleak_release_above")
    try:
        release_above = parse_percent(release_text) if str(release_text).strip() else None
    except PercentError as error:
        raise pytest.UsageError(f"{source}: {error}") from None
    strict_cycles, _ = _option(config, "vramleak_strict_cycles")
    trace, _ = _option(config, "vramleak_trace")
    save, _ = _option(config, "vramleak_save")
    compare_name, source = _option(config, "vramleak_compare")
    compare = None
    if compare_name:
        path = _saved_run_path(config, compare_name)
        try:
            compare = json.loads(path.read_text())["tests"]
        except (OSError, ValueError, KeyError) as error:
            raise pytest.UsageError(f"{source}: cannot read the saved run {compare_name!r} at {path}: {error}") from None
    increase_text, source = _option(config, "vramleak_max_increase")
    try:
        max_increase = parse_increase(increase_text)
    except (ValueError, SizeError) as error:
        raise pytest.UsageError(f"{source}: {error}") from None
    return Settings(
        bool(every_test),
        device,
        tuple(str(path) for path in report_paths if str(path).strip()),
        warmup,
        tolerance,
        sites,
        release_above,
        bool(strict_cycles),
        bool(trace),
        save or None,
        compare,
        max_increase,
    )


def _unwritable(path: Path) -> str | None:
    """Why a report could never be written at ``path`` (a folder there, a file where a folder must be), if so."""
    if path.is_dir():
        return "it is a folder"
    for parent in path.absolute().parents:
        if parent.exists():
            return None if parent.is_dir() else f"{parent} is a file, not a folder"
    return None


def _saved_run_path(config: pytest.Config, name: str) -> Path:
    return config.rootpath / ".vramleak" / f"{name}.json"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(peak=None, *, leak=0, device=None): fail the test if it leaves more than `leak` bytes "
        "of tensor memory allocated after teardown, or holds more than `peak` bytes above its baseline "
        "during the call. Sizes are bytes or strings like '512 MiB'. device: auto|cpu|cuda|cuda:N|mps|xpu.",
    )
    config.addinivalue_line("markers", f"{EXEMPT_MARKER}: exempt this test from the leak check of --vramleak.")
    config.stash[SETTINGS] = read_settings(config)
    config.stash[RESULTS] = []
    config.stash[OUTPUT_ERRORS] = []
    config.stash[TRACKERS] = {}
    config.stash[FIXTURES] = []
    config.pluginmanager.register(_Recorder(config.stash[RESULTS]), "vramleak-recorder")
    config.pluginmanager.register(_XdistController(config), "vramleak-xdist")
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and _option(config, "vramleak_pin_workers")[0]:
        torch = _import_torch()
        if torch is not None:
            pin_worker(str(workerinput.get("workerid", "")), torch, os.environ)
    fraction = config.stash[SETTINGS].release_above
    if fraction is not None:
        config.pluginmanager.register(_Releaser(config, fraction), "vramleak-releaser")


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
    if _import_torch() is None:
        return "vramleak: torch is not installed; checked tests will be skipped"
    return "vramleak: " + _header_settings(config)


def _header_settings(config: pytest.Config) -> str:
    """The effective device and settings, e.g. ``device cpu, checking every test (--vramleak), step warm-up 2``."""
    settings = config.stash[SETTINGS]
    scope = "every test (--vramleak)" if settings.every_test else f"tests marked {MARKER}"
    torch = _import_torch()
    try:
        device = resolve_device(settings.device, torch) if torch is not None else "none (torch is not installed)"
    except (DeviceUnavailable, ValueError) as error:
        device = f"{settings.device} ({error})"
    report = f", report {', '.join(settings.report_paths)}" if settings.report_paths else ""
    return f"device {device}, checking {scope}, step warm-up {settings.warmup}{report}"


def _parse_marker(item: pytest.Item, mark: pytest.Mark) -> Budget:
    where = f"{item.nodeid}: @pytest.mark.{MARKER}"
    if len(mark.args) > 1:
        raise pytest.UsageError(f"{where} takes one positional argument (peak), got {len(mark.args)}: {mark.args!r}")
    unknown = sorted(set(mark.kwargs) - {"peak", "leak", "device"})
    if unknown:
        raise pytest.UsageError(f"{where}: unknown keyword {unknown[0]!r}; use peak, leak or device")
    if mark.args and "peak" in mark.kwargs:
        raise pytest.UsageError(f"{where}: peak given both by position and by keyword")
    values = {"peak": mark.args[0] if mark.args else mark.kwargs.get("peak"), "leak": mark.kwargs.get("leak", 0)}
    sizes: dict[str, int | None] = {}
    for name, value in values.items():
        try:
            sizes[name] = None if value is None and name == "peak" else parse_size(value)
        except SizeError as error:
            raise pytest.UsageError(f"{where}({name}={value!r}): {error}") from None
    device = mark.kwargs.get("device")
    if device is not None:
        try:
            device = _check_device_spec(device) if isinstance(device, str) else _check_device_spec(repr(device))
        except ValueError as error:
            raise pytest.UsageError(f"{where}(device={device!r}): {error}") from None
    leak = sizes["leak"]
    assert leak is not None  # parse_size never returns None
    return Budget(peak=sizes["peak"], leak=leak, device=device)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    every_test = config.stash[SETTINGS].every_test
    for item in items:
        mark = item.get_closest_marker(MARKER)
        if item.get_closest_marker(EXEMPT_MARKER) is not None:
            item.stash[BUDGET] = None
        elif mark is not None:
            item.stash[BUDGET] = _parse_marker(item, mark)
        elif every_test:
            item.stash[BUDGET] = Budget()


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


def _result(item: pytest.Item, check: Check, outcome: str) -> TestResult:
    budget = check.budget or Budget(leak=None)  # type: ignore[arg-type]
    return TestResult(
        nodeid=item.nodeid,
        device=check.meter.name if check.meter else None,
        outcome=outcome,
        baseline_bytes=check.baseline.allocated_bytes if check.baseline else None,
        peak_bytes=check.peak_bytes,
        budget={"peak": budget.peak, "leak": budget.leak},
    )


def _tracker(config: pytest.Config, device: str) -> Tracker:
    trackers = config.stash[TRACKERS]
    if device not in trackers:
        trackers[device] = Tracker(device)
    return trackers[device]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    budget = item.stash.get(BUDGET, None)
    if budget is None and "vramleak" not in getattr(item, "fixturenames", ()):
        for tracker in item.config.stash[TRACKERS].values():
            tracker.stale = True  # this test runs untracked; the index must be rebuilt after it
        return
    check = Check(budget)
    item.stash[CHECK] = check
    check.meter = _meter_for(item, budget.device if budget else None)
    check.tracker = _tracker(item.config, check.meter.name)
    # pytest keeps the last failed test's traceback, and its frames' tensors, in sys.last_* until
    # the next test's call starts. Drop them now and collect: the failed test's frames sit in
    # reference cycles that would otherwise be frozen, and kept in memory, through this test.
    dropped = [sys.__dict__.pop(name, None) for name in ("last_type", "last_value", "last_traceback", "last_exc")]
    if any(value is not None for value in dropped):
        dropped.clear()
        gc.collect()
    try:
        check.tracker.begin()
    except Exception as error:
        check.error = f"{type(error).__name__}: {error}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    check = item.stash.get(CHECK, None)
    if check is None or check.meter is None or check.error:
        return (yield)
    meter = check.meter
    watch_peak = False
    try:
        if check.budget is not None:
            check.baseline = take_snapshot(meter=meter, tracker=check.tracker)
            if isinstance(meter, CudaMeter):
                check.others = _other_devices(meter, check.tracker)
            settings = item.config.stash[SETTINGS]
            watch_peak = check.budget.peak is not None or meter.name != "cpu" or bool(settings.save or settings.compare is not None)
            if watch_peak:
                meter.start_peak()
        if item.config.stash[SETTINGS].sites:
            check.sites = SiteRecorder().__enter__()
        if item.config.stash[SETTINGS].trace and isinstance(meter, CudaMeter) and check.budget is not None:
            check.history = AllocatorHistory(meter.backend.memory, meter.index)
            check.history.start()
    except Exception as error:  # the plugin's own failure: report it on this test, run the test anyway
        check.error = f"{type(error).__name__}: {error}"
        return (yield)
    try:
        return (yield)
    finally:
        if check.sites is not None:
            check.sites.__exit__(None, None, None)
        if check.baseline is not None:
            try:
                check.cycle_bytes = _cycle_bytes(check)
            except Exception as error:
                check.error = f"{type(error).__name__}: {error}"
        if watch_peak:
            try:
                check.peak_bytes = meter.stop_peak()
            except Exception as error:
                check.error = f"{type(error).__name__}: {error}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    check = item.stash.get(CHECK, None)
    if check is None:
        return report
    if report.when == "call" and call.excinfo is not None and check.meter is not None and is_out_of_memory(call.excinfo.value):
        try:
            with check.tracker.unfrozen() if check.tracker is not None else contextlib.nullcontext():
                report.sections.append(("vramleak: what filled the memory", memory_contents(check.meter, call.excinfo.value)))
        except Exception as error:  # never let the forensics replace the test's own failure
            report.sections.append(("vramleak: what filled the memory", f"could not be read: {type(error).__name__}: {error}"))
    if report.when in ("setup", "call") and check.unchecked_reason is None:
        if check.step_leaked:
            check.unchecked_reason = "memory grew across the steps of the vramleak fixture"
        elif report.failed:
            check.unchecked_reason = f"the test failed in {report.when}"
        elif report.skipped:
            check.unchecked_reason = "the test was skipped" if not hasattr(report, "wasxfail") else "the test xfailed"
    if report.when == "teardown":
        if check.step_leaked:
            outcome = "leaked"
        elif check.steps and check.unchecked_reason is None and not report.failed:
            outcome = "passed"  # checked through the fixture alone
        else:
            outcome = "unchecked"
        result = check.result or _result(item, check, outcome)
        if result.outcome == "unchecked" and result.reason is None:
            result.reason = check.error or check.unchecked_reason or ("teardown failed" if report.failed else None)
        if check.steps:
            last = check.steps[-1]
            result.steps = list(last.steps)
            result.warmup_steps = list(last.warmup_steps)
            if last.leak is not None and not result.tensors:
                result.tensors = [group.to_json() for group in last.leak.groups]
            result.growth_bytes = last.verdict.growth_bytes
            result.device = result.device or last.device
        report.vramleak = result.to_json()  # type: ignore[attr-defined]
        # JUnit XML writes a test's teardown properties: CI dashboards read the figures there.
        report.user_properties.append(("vramleak_outcome", result.outcome))
        for name in ("leaked_bytes", "peak_bytes", "growth_bytes"):
            value = getattr(result, name)
            if value is not None:
                report.user_properties.append((f"vramleak_{name}", value))
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, Any, Any]:
    check = item.stash.get(CHECK, None)
    if check is None or check.meter is None:
        return (yield)
    try:
        outcome = yield
        if check.error:
            check.result = _result(item, check, "unchecked")
            check.result.reason = f"vramleak internal error: {check.error}"
            raise VramLeak(f"vramleak could not check this test: {check.error}", pytrace=False)
        if check.unchecked_reason or check.baseline is None or check.budget is None:
            return outcome
        try:
            message = _judge(item, check)
        except Exception as error:
            check.result = _result(item, check, "unchecked")
            check.result.reason = f"vramleak internal error: {type(error).__name__}: {error}"
            raise VramLeak(f"vramleak could not check this test: {type(error).__name__}: {error}", pytrace=False) from None
        if message:
            raise VramLeak(message, pytrace=False)
        return outcome
    finally:
        if check.tracker is not None:
            check.tracker.end()
        if check.sites is not None:
            check.sites.clear()  # the record of sites holds nothing once the check ends
        if check.history is not None:
            check.history.stop()


def _drop_fixture_values(item: pytest.Item) -> None:
    """Drop the test's fixture values now, as pytest does right after the teardown phase.

    Function-scoped fixtures are finalised by then, but ``item.funcargs`` still refers to their
    values until pytest resets it; a list fixture the test appended tensors to would otherwise
    look leaked. Done only when a leak is suspected, so ordinary tests keep pytest's timing.
    """
    funcargs = getattr(item, "funcargs", None)
    if isinstance(funcargs, dict):
        funcargs.clear()


def _cycle_bytes(check: Check) -> int:
    """Bytes of storages the test body created that only the cycle collector frees.

    Measured as the body returns: what is alive then and gone after a collection lived on
    reference cycles. Freed late, which on a GPU raises the peak, but not leaked.
    """
    meter, tracker, baseline = check.meter, check.tracker, check.baseline
    assert meter is not None and tracker is not None and baseline is not None
    pending = take_snapshot(meter=meter, tracker=tracker, settle=False)
    new = pending.new_since(baseline)
    if not new:  # nothing the body made is alive, in a cycle or otherwise: no second view
        return 0
    collected = take_snapshot(meter=meter, tracker=tracker)
    return sum(pending.storages[key] for key in new if not pending.holds_same(key, collected))


def _judge(item: pytest.Item, check: Check) -> str | None:
    """Measure after teardown; the failure text when the budget is broken, else None.

    The common case (nothing left behind) costs two tracker views, each proportional to what the
    test allocated and to the number of live tensors, not to the size of the heap; only a test
    over its budget pays for the holder search.
    """
    meter, baseline, budget, tracker = check.meter, check.baseline, check.budget, check.tracker
    assert meter is not None and baseline is not None and budget is not None and tracker is not None
    end = take_snapshot(meter=meter, tracker=tracker)
    leaked = end.leaked_since(baseline)
    if leaked > budget.leak:
        # Measure again after clearing what PyTorch caches for itself, as its own check does:
        # finalizers run by the first collection can release more memory too. pytest drops a
        # test's fixture values (item.funcargs) only after its teardown, so a function-scoped
        # fixture's value still holds what the test put in it: measure without them too.
        clear_torch_caches(_import_torch())
        _drop_fixture_values(item)
        end = take_snapshot(meter=meter, tracker=tracker)
        leaked = end.leaked_since(baseline)
    notes = []
    if isinstance(meter, CudaMeter):
        growth = measure_growth(meter, baseline.allocated_bytes, baseline.details.get("driver_used_bytes"), budget.leak)
        leaked = growth.allocated
        notes = [growth.note(budget.leak), explain_reserved(end.details, end.allocated_bytes)]
        if growth.driver is not None:
            end.details["driver_growth_bytes"] = growth.driver
    verdict = judge_budget(budget, meter.name, leaked, check.peak_bytes)
    other_leaks = []
    for other, other_baseline in check.others:
        other_growth = measure_growth(other, other_baseline.allocated_bytes, None, budget.leak)
        end.details[f"{other.name}_leaked_bytes"] = other_growth.allocated
        if other_growth.allocated > budget.leak:
            other_leaks.append((other, other_baseline))
            message = f"leaked {format_size(other_growth.allocated)} on {other.name}, allowed {format_size(budget.leak)}"
            verdict = BudgetVerdict("leaked", "; ".join(m for m in (verdict.message, message) if m))
    saved = (item.config.stash[SETTINGS].compare or {}).get(item.nodeid)
    if saved and saved.get("peak_bytes") is not None and check.peak_bytes is not None and saved.get("device") == meter.name:
        grew = judge_increase(saved["peak_bytes"], check.peak_bytes, item.config.stash[SETTINGS].max_increase, meter.name)
        if grew:
            outcome = verdict.outcome if verdict.outcome == "leaked" else "over_budget"
            verdict = BudgetVerdict(outcome, "; ".join(m for m in (verdict.message, grew) if m))
    if item.config.stash[SETTINGS].strict_cycles and (check.cycle_bytes or 0) > budget.leak:
        cycles = (
            f"left {format_size(check.cycle_bytes or 0)} on {meter.name} to the cycle collector, allowed "
            f"{format_size(budget.leak)} (--vramleak-strict-cycles): break the reference cycle, e.g. with weakref"
        )
        verdict = BudgetVerdict("leaked", "; ".join(m for m in (verdict.message, cycles) if m))
    result = _result(item, check, verdict.outcome)
    result.end_bytes = end.allocated_bytes
    result.leaked_bytes = leaked
    result.details = dict(end.details)
    result.cycle_bytes = check.cycle_bytes
    check.result = result
    if verdict.outcome == "passed":
        return None
    lines = [verdict.message, _figures(result), *(note for note in notes if note)]
    if verdict.outcome == "leaked":
        tracker.end()  # naming holders needs the whole heap
        sources: list[SiteSource] = [source for source in (check.sites,) if source is not None]
        if check.history is not None:
            path = check.history.save(_trace_folder(item.config), item.nodeid)
            result.trace = str(path)
            lines.append(f"allocator history saved to {path} (open it in https://pytorch.org/memory_viz)")
            sources.append(check.history.sites())
        leak = diff(baseline, end, meter=meter, sites=Sites(sources))
        result.tensors = [group.to_json() for group in leak.groups]
        lines += ["leaked tensors:", leak.render()]
        for other, other_baseline in other_leaks:
            other_leak = diff(other_baseline, take_snapshot(meter=other, tracker=tracker), meter=other, sites=Sites(sources))
            result.tensors += [group.to_json() for group in other_leak.groups]
            lines += [f"leaked tensors on {other.name}:", other_leak.render()]
    return "\n".join(lines)


def _other_devices(meter: CudaMeter, tracker: Tracker | None) -> list[tuple[CudaMeter, Snapshot]]:
    """Every other CUDA device of the process, warmed up and measured, for a check on ``meter``.

    The tracker's index holds the tensors of every device, so each device's storages are known
    by identity too, and a leak there is told apart from what was alive before.
    """
    others = []
    for index in range(meter.backend.device_count()):
        if index != meter.index:
            other = CudaMeter(f"cuda:{index}", meter.backend, meter.clear_workspaces, meter.warm_up)
            others.append((other, take_snapshot(meter=other, tracker=tracker)))
    return others


def _trace_folder(config: pytest.Config) -> Path:
    """Snapshots go next to the (first) report, or into ``.vramleak-traces`` under the root folder."""
    report = next(iter(config.stash[SETTINGS].report_paths), None)
    return Path(report).resolve().parent / "vramleak-traces" if report else config.rootpath / ".vramleak-traces"


def _figures(result: TestResult) -> str:
    def size(value: int | None) -> str:
        return "not measured" if value is None else format_size(value)

    text = f"baseline {size(result.baseline_bytes)}, after teardown {size(result.end_bytes)}, peak above baseline {size(result.peak_bytes)}"
    if "reserved_bytes" in result.details:
        text += f", reserved by the caching allocator {format_size(result.details['reserved_bytes'])}"
    return text


def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config) -> tuple[str, str, Any] | None:
    result = getattr(report, "vramleak", None)
    if report.when != "teardown" or not report.failed or not result:
        return None
    if result["outcome"] == "leaked":
        return "failed", "L", ("LEAKED", {"red": True})
    if result["outcome"] == "over_budget":
        return "failed", "B", ("OVER BUDGET", {"red": True})
    return None


WORKER_LEFTOVERS = pytest.StashKey[list[dict[str, Any]]]()


class _XdistController:
    """Gathers what each pytest-xdist worker found about fixtures, as its node goes down."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        found = getattr(node, "workeroutput", {}).get("vramleak_fixtures", [])
        self.config.stash.setdefault(WORKER_LEFTOVERS, []).extend(found)


class _Recorder:
    """Collects each test's result from its teardown report, in the process that writes reports.

    Under pytest-xdist the reports arrive from the workers with the result attached, so the
    controller sees every worker's tests.
    """

    def __init__(self, results: list[dict[str, Any]]) -> None:
        self.results = results

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
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
    storages: list[tuple[weakref.ref[Any], int, StorageKey]]

    def alive(self) -> list[tuple[StorageKey, int]]:
        """The storages still alive, with their sizes."""
        return [(key, size) for ref, size, key in self.storages if ref() is not None]


FIXTURES = pytest.StashKey[list[FixtureMemory]]()
MAX_FIXTURE_CHAINS = 3


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest) -> Generator[None, Any, Any]:
    config = request.config
    settings = config.stash[SETTINGS]
    tracker = next((t for t in config.stash[TRACKERS].values() if t.active), None)
    if not settings.every_test or fixturedef.scope == "function" or tracker is None:
        return (yield)
    torch = _import_torch()
    meter = make_meter(tracker.device, torch)
    before = take_snapshot(meter=meter, tracker=tracker, settle=False)
    value = yield
    after = take_snapshot(meter=meter, tracker=tracker, settle=False)
    created = [(after.identities[key], after.storages[key], key) for key in after.new_since(before) if key in after.identities]
    if created:
        where = fixturedef.baseid or "conftest"
        config.stash[FIXTURES].append(FixtureMemory(fixturedef.argname, fixturedef.scope, where, meter.name, created))
    return value


def _fixture_leftovers(config: pytest.Config) -> list[dict[str, Any]]:
    """Fixtures wider than a test whose storages are still alive once every fixture is torn down,
    with what holds them (a walk of the heap, paid only when some are left)."""
    leftovers = []
    for memory in config.stash.get(FIXTURES, []):
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


def _offenders(results: list[dict[str, Any]], verbosity: int) -> list[str]:
    """The tests that leaked most, and with ``-v`` the highest peaks: five of each, all with ``-vv``."""
    shown = None if verbosity > 1 else 5
    lines = []
    leaks = sorted((r for r in results if r["outcome"] == "leaked" and leaked_figure(r)), key=lambda r: -leaked_figure(r))
    if leaks:
        lines.append("largest leaks:")
        lines += [
            f"  {format_size(leaked_figure(r)):>10}  {r['nodeid']} ({r['device']}"
            + (", grew across steps)" if not r.get("leaked_bytes") else ")")
            for r in leaks[:shown]
        ]
    peaks = sorted((r for r in results if r.get("peak_bytes")), key=lambda r: -r["peak_bytes"])
    if peaks and verbosity > 0:
        lines.append("highest peaks above baseline:")
        lines += [f"  {format_size(r['peak_bytes']):>10}  {r['nodeid']} ({r['device']})" for r in peaks[:shown]]
    return lines


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    lines = _offenders(config.stash.get(RESULTS, []), config.get_verbosity())
    scheduler = config.stash.get(RELEASER, None)
    if scheduler is not None and scheduler.releases:
        lines.append(
            f"released the CUDA caching allocator's cache {scheduler.releases} times between tests, "
            f"{format_size(scheduler.released_bytes)} in all (--vramleak-release-above)"
        )
    for leftover in config.stash.get(LEFTOVERS, []):
        lines.append(
            f"fixture {leftover['fixture']!r} ({leftover['scope']} scope, {leftover['where']}"
            + (f", worker {leftover['worker']}" if leftover.get("worker") else "")
            + ") still holds "
            f"{format_size(leftover['bytes'])} it allocated, after its teardown"
        )
        lines += [f"    held by {chain}" for chain in leftover.get("held_by", [])]
        lines += [f"    diagnosis: {finding}" for finding in leftover.get("diagnoses", [])]
    cycles = sorted((r for r in config.stash.get(RESULTS, []) if r.get("cycle_bytes")), key=lambda r: -r["cycle_bytes"])
    for result in cycles[:5]:
        lines.append(
            f"{result['nodeid']}: {format_size(result['cycle_bytes'])} lived in reference cycles until garbage "
            "collection (not a leak; on a GPU it raises the peak until collected)"
        )
    if len(cycles) > 5:
        lines.append(f"... and {len(cycles) - 5} more tests left tensors to the cycle collector")
    if lines:
        terminalreporter.write_sep("=", "vramleak summary")
        for line in lines:
            terminalreporter.write_line(line)
    for error in config.stash.get(OUTPUT_ERRORS, []):
        terminalreporter.write_line(f"vramleak: {error}", red=True, bold=True)


LEFTOVERS = pytest.StashKey[list[dict[str, Any]]]()


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    for tracker in config.stash.get(TRACKERS, {}).values():
        tracker.end()  # never leave the heap frozen behind a session
    release_resident_mode()
    settings = config.stash.get(SETTINGS, None)
    if settings is None:
        return
    config.stash[LEFTOVERS] = _fixture_leftovers(config) + config.stash.get(WORKER_LEFTOVERS, [])
    workeroutput = getattr(config, "workeroutput", None)
    if workeroutput is not None:  # a pytest-xdist worker: the controller reports for it
        # Each worker sets up its own module- and session-scoped fixtures: say whose this is.
        worker = getattr(config, "workerinput", {}).get("workerid")
        workeroutput["vramleak_fixtures"] = [{**leftover, "worker": worker} for leftover in config.stash[LEFTOVERS]]
        return
    # One entry per test, the last reported: a test run again (a rerun plugin, a crashed xdist
    # worker's test re-run elsewhere) is listed once.
    results: list[dict[str, Any]] = list({r["nodeid"]: r for r in config.stash[RESULTS]}.values())
    leftovers: list[dict[str, Any]] = config.stash[LEFTOVERS]
    outputs: list[tuple[str, Callable[[], None]]] = [("the Markdown summary", lambda: _write_markdown(config, results))]
    if settings.save:
        figures = {
            r["nodeid"]: {name: r[name] for name in ("device", "peak_bytes", "end_bytes", "leaked_bytes")}
            for r in results
            if r["outcome"] != "unchecked"
        }
        path = _saved_run_path(config, settings.save)
        outputs.append((f"the saved run to {path}", lambda: write_text_atomically(path, json.dumps({"version": 1, "tests": figures}, indent=2) + "\n")))
    for report in settings.report_paths:
        if is_html_path(report):
            outputs.append((f"the HTML report to {report}", functools.partial(_write_html, config, report, results, leftovers)))
        else:
            outputs.append((f"the JSON report to {report}", functools.partial(write_json, report, results, fixtures=leftovers)))
    errors = config.stash[OUTPUT_ERRORS]
    for what, write in outputs:
        try:
            write()
        except Exception as error:  # the others are still written; the summary says what failed
            errors.append(f"could not write {what}: {type(error).__name__}: {error}")
    if errors and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.USAGE_ERROR


OUTPUT_ERRORS = pytest.StashKey[list[str]]()


def _write_html(config: pytest.Config, path: str, results: list[dict[str, Any]], leftovers: list[dict[str, Any]]) -> None:
    write_text_atomically(path, render_html(results, fixtures=leftovers, about=_about(config)))


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
    path, _ = _option(config, "vramleak_markdown")
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
    the rule). ``vramleak.results`` holds every check's figures.
    """

    def __init__(self, watcher: StepWatcher, on_result: Callable[[StepResult], None]) -> None:
        self._watcher = watcher
        self._on_result = on_result

    @property
    def results(self) -> list[StepResult]:
        """The step checks run so far in this test."""
        return self._watcher.results

    def steps(self, n: int, *, warmup: int | None = None) -> Iterator[int]:
        """Yield ``0 .. n-1``; after the last step, fail the test if memory kept growing."""
        try:
            self._watcher.check_arguments(n, warmup)
        except ValueError as error:
            pytest.fail(f"vramleak.{error}", pytrace=False)
        return self._run(n, warmup)

    def _run(self, n: int, warmup: int | None) -> Iterator[int]:
        yield from self._watcher.steps(n, warmup=warmup)
        self._finish(self._watcher.results[-1])

    def check(self, step: Callable[[int], Any], *, steps: int = 10, warmup: int | None = None) -> StepResult:
        """Call ``step(i)`` ``steps`` times and fail the test if memory kept growing."""
        for index in self.steps(steps, warmup=warmup):
            step(index)
        return self._watcher.results[-1]

    def _finish(self, result: StepResult) -> None:
        self._on_result(result)
        if result.grows:
            lines = [result.verdict.message, "after each measured step, above the warm-up baseline: " + ", ".join(format_size(s) for s in result.steps)]
            if result.leak is not None:
                lines += ["tensors created after warm-up that outlived their step:", result.leak.render()]
            raise VramLeak("\n".join(lines), pytrace=False)


@pytest.fixture
def vramleak(request: pytest.FixtureRequest) -> VramLeakFixture:
    """Check repeated training or inference steps for memory that keeps growing.

    ``for i in vramleak.steps(n, warmup=2): ...`` or ``vramleak.check(step_fn, steps=n)``; the
    first ``warmup`` steps are not measured, and the test fails when memory grows across the rest.
    """
    settings = request.config.stash[SETTINGS]
    budget = request.node.stash.get(BUDGET, None)
    check = request.node.stash.get(CHECK, None)
    meter = check.meter if check is not None and check.meter is not None else _meter_for(request.node, budget.device if budget else None)
    if check is None:
        check = request.node.stash[CHECK] = Check(None, meter)
    tracker = check.tracker
    watcher = StepWatcher(
        meter.name, warmup=settings.warmup, tolerance=settings.tolerance, meter=meter, tracker=tracker, sites=lambda: check.sites
    )

    def on_result(result: StepResult) -> None:
        check.steps.append(result)
        check.step_leaked = check.step_leaked or result.grows

    return VramLeakFixture(watcher, on_result)

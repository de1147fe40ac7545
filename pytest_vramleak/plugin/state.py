"""What the plugin's hooks and the runs of a checked test share: the failure a leak raises, a
checked test and its run's check in progress, and the two keys under which pytest's stash keeps
the session's owner and a checked test."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

from ..meters.devices import DeviceUnavailable, Meter, make_meter, resolve_device
from .outcomes import PytestOutcomes

if TYPE_CHECKING:  # the engine is imported as the first test is checked (see plugin.session)
    from ..check import LeakCheck
    from ..judging.verdict import Budget
    from ..meters.release import ReleaseScheduler
    from ..steps import StepResult
    from ..tracking.census import StorageKey
    from ..tracking.tracker import StorageRef, Tracker
    from .options import Settings
    from .runs import TestRuns

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
    tracks_steps: bool = False
    """The tracker began at set-up for the step loops of a test checked only through the fixture,
    and ends as its teardown does."""
    call_failed: bool = False
    """The test's call failed on its own: checked once, on what remains once its traceback is let go."""
    failure: BaseException | None = None
    """The call's exception, while the test's runs are judged (dropped once they are): what only
    its traceback's frames hold is the failure's, not a leak."""


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


@dataclass(eq=False)  # compared and hashed by identity, as pytest keeps its plugins
class SessionState:
    """What one pytest session's checks share: the state that
    :class:`~pytest_vramleak.plugin.session.VramleakSession`, whose methods are the hooks, owns."""

    config: pytest.Config | None = None
    settings: Settings | None = None
    torch_missing: str | None = None
    """Why torch cannot be imported here (None where it can): marked tests then run unchecked."""
    tracker: Tracker | None = None
    """What checks defer is compared between tests (:func:`~pytest_vramleak.plugin.leftovers.look_for_drift`)."""
    results: list[dict[str, Any]] = field(default_factory=list)
    """Each checked test's record, as its teardown report carries it (from every xdist worker)."""
    ran: bool = False
    """Whether any test ran (set up at least): a run that ran none writes no report."""
    active: Check | None = None
    """The check of the test being set up, run or torn down."""
    thread_starters: dict[int, str] = field(default_factory=dict)
    """The checked test that started each thread still running after it, by the thread's ident."""
    mode_enterers: dict[int, str] = field(default_factory=dict)
    """The checked test that entered each mode still on torch's stacks after it, by the mode's id."""
    garbage_saver: str | None = None
    """The checked test that turned gc.DEBUG_SAVEALL on and left it on (None: it is off, or it was
    turned on before any check, or outside one)."""
    pytorchs_own: dict[str, tuple[str, list[int]]] = field(default_factory=dict)
    """Per parametrized test function: the case whose runs showed that what it keeps is
    PyTorch's own, and the sizes of the storages its first run kept."""
    fixtures: list[FixtureMemory] = field(default_factory=list)
    """What fixtures wider than a test made while a checked test set up."""
    fixture_defs: dict[int, pytest.FixtureDef[Any]] = field(default_factory=dict)
    """Fixtures wider than a test that were set up, so that what their values hold is named after them."""
    drift: list[dict[str, Any]] = field(default_factory=list)
    """Older tensors found grown in place, or given gradients, between checks (see :meth:`Tracker.drift`)."""
    drift_span: list[str] | None = None
    """The first and the last checked test since the last comparison between checks."""
    worker_leftovers: list[dict[str, Any]] = field(default_factory=list)
    """What each pytest-xdist worker found about fixtures, as its node went down."""
    leftovers: list[dict[str, Any]] = field(default_factory=list)
    releaser: ReleaseScheduler | None = None
    output_errors: list[str] = field(default_factory=list)
    not_written: list[str] = field(default_factory=list)
    """The files a run that ran no test left as they were."""
    not_made: list[str] = field(default_factory=list)
    """The files asked for that a run that ran no test did not make, and no earlier run had."""
    written: list[str] = field(default_factory=list)
    """The files the run wrote, as the summary's last line names them."""
    interrupted: bool = False
    """The run was interrupted (Ctrl-C): the files it wrote say so."""
    outcomes: PytestOutcomes = field(default_factory=PytestOutcomes)
    """pytest's outcome of each test, written into its record as its teardown is logged."""

    def start_tracking(self) -> Tracker:
        """The session's tracker, made (and the tracking layer imported) as the first test is
        checked: a run that checks nothing does not load it."""
        if self.tracker is None:
            from ..tracking.tracker import Tracker

            self.tracker = Tracker(defer=True)
        return self.tracker


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
    allowed: bool = False
    """Marked ``allow_vram_leak``: not checked as a whole, and its step checks that grow do not fail it."""
    runs: TestRuns | None = None
    """Its runs, while they happen (see :mod:`~pytest_vramleak.plugin.runs`)."""
    current: Check | None = None
    """The check of its current (or last) run."""
    timeout: Any = None
    """pytest-timeout's settings for its timer, where that timer spans the test's protocol (see
    :mod:`~pytest_vramleak.plugin.timeouts`)."""


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


def checked(item: pytest.Item) -> bool:
    test = test_of(item)
    if test is None or test.skipped or session_of(item.config).torch_missing is not None:
        return False
    return test.budget is not None or "vramleak" in getattr(item, "fixturenames", ())


SESSION = pytest.StashKey[SessionState]()
"""The session's state, for the code pytest calls without its owner: the fixture, the marker's
reader, a checked test's runs."""


def session_of(config: pytest.Config) -> SessionState:
    """The session's state, configured."""
    return config.stash[SESSION]


def pasteable(config: pytest.Config, nodeid: str) -> str:
    """A test id relative to where pytest was invoked, as pytest's own short summary prints it,
    so that it can be pasted back on the command line (ids are relative to the rootdir)."""
    invoked = config.invocation_params.dir
    if invoked == config.rootpath:
        return nodeid
    path, separator, rest = nodeid.partition("::")
    return os.path.relpath(config.rootpath / path, invoked) + separator + rest


TORCH_IMPORT_ERROR: list[str] = []


def import_torch() -> Any | None:
    """torch, or None where it is not installed (the reason is kept for skip messages)."""
    try:
        import torch
    except ImportError as error:
        if not TORCH_IMPORT_ERROR:
            TORCH_IMPORT_ERROR.append(str(error))
        return None
    return torch


def why_unavailable(spec: str) -> str | None:
    """Why a check on device ``spec`` cannot run here, if so."""
    torch = import_torch()
    if torch is None:
        return f"vramleak: torch is not installed ({TORCH_IMPORT_ERROR[0]})"
    try:
        resolve_device(spec, torch)
    except DeviceUnavailable as error:
        return f"vramleak: {error}"
    return None


def meter_for(item: pytest.Item, device_spec: str | None) -> Meter:
    """The meter for a test, or a skip naming what is missing."""
    torch = import_torch()
    if torch is None:
        pytest.skip(f"vramleak: torch is not installed ({TORCH_IMPORT_ERROR[0]})")
    settings = session_of(item.config).settings
    assert settings is not None
    spec = device_spec or settings.device
    try:
        return make_meter(resolve_device(spec, torch), torch)
    except DeviceUnavailable as error:
        pytest.skip(f"vramleak: {error}")


def check_device_option(config: pytest.Config, spec: str) -> None:
    """A device asked for on the command line or in the ini file that is not there stops the run
    at start: a GPU job on a runner without a GPU must not pass having checked nothing."""
    torch = import_torch()
    if torch is None:
        return
    try:
        resolve_device(spec, torch)
    except DeviceUnavailable as error:
        _, source = option_and_source(config, "vramleak_device")
        seen = ", ".join(
            ["cpu"]
            + [
                f"{kind} ({backend.device_count()} device(s))"
                for kind in ("cuda", "xpu")
                for backend in [getattr(torch, kind, None)]
                if backend is not None and backend.is_available()
            ]
        )
        raise pytest.UsageError(f"{source}={spec}: {error}; torch {torch.__version__} sees: {seen}") from None


def drop_fixture_values(item: pytest.Item) -> None:
    """Drop the test's fixture values now, as pytest does right after the teardown phase.

    Function-scoped fixtures are finalised by then, but ``item.funcargs`` still refers to their
    values until pytest resets it; a list fixture the test appended tensors to would otherwise
    look leaked. Done only when a leak is suspected, so ordinary tests keep pytest's timing.
    """
    funcargs = getattr(item, "funcargs", None)
    if isinstance(funcargs, dict):
        funcargs.clear()


def option_and_source(config: pytest.Config, ini_name: str) -> tuple[Any, str]:
    """The value of a setting and where it came from, for error messages."""
    value = config.getoption(ini_name)
    if value is not None:
        return value, "--" + ini_name.replace("_", "-")
    return config.getini(ini_name), f"ini option {ini_name}"


def skipped_by_mark(item: pytest.Item) -> bool:
    """Whether pytest will skip the test by its marks as its setup starts, read without evaluating
    anything: a ``skip`` mark, or a ``skipif`` whose condition is ``True`` (a condition pytest
    must evaluate, a string, is left to pytest: the check then begins as for any test)."""
    if item.get_closest_marker("skip") is not None:
        return True
    for mark in item.iter_markers("skipif"):
        conditions = mark.args if mark.args else (mark.kwargs.get("condition"),)
        if any(condition is True for condition in conditions):
            return True
    return False

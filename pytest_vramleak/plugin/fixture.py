"""The ``vramleak`` fixture: step checks inside a test, failing it when memory keeps growing."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ..steps import StepNotRun, StepResult, StepWatcher, step_caller
from .runs import named_roots
from .state import EXEMPT_MARKER, TEST, Check, CheckedTest, VramLeak, meter_for, session_of


class VramLeakFixture:
    """Checks repeated steps for memory growth: ``for i in vramleak.steps(10): train_step()``.

    The first ``warmup`` steps are not measured (ini ``vramleak_warmup``, default 2); memory is
    measured after each later step, and the test fails when it keeps growing (see
    docs/reference.md for the rule). A loop left early (``break``, ``return``, an exception the test catches) is judged
    on the steps measured so far, as the test tears down. ``vramleak.results`` holds every
    check's figures.
    """

    def __init__(self, watcher: StepWatcher | None, *, allowed: bool = False) -> None:
        self._watcher = watcher
        """None where torch cannot be imported: the steps run, unchecked."""
        self._allowed = allowed
        """The test is marked ``allow_vram_leak``: a loop that grows is recorded, and does not fail it."""

    def __repr__(self) -> str:
        return f"<vramleak fixture: {len(self.results)} step check(s) so far>"

    @property
    def results(self) -> list[StepResult]:
        """The step checks run so far in this test."""
        return self._watcher.results if self._watcher is not None else []

    def steps(
        self, n: int, *, warmup: int | None = None, max_steps: int | None = None, step: Callable[..., Any] | None = None
    ) -> Iterator[int]:
        """Yield ``0 .. n-1``; after the last step, fail the test if memory kept growing. Where
        the ``n`` steps leave it undecided, up to ``max_steps`` steps run in all until it is decided."""
        try:
            n, checked, max_steps = (self._watcher or StepWatcher()).check_arguments(n, warmup, max_steps)
            warmup = checked if warmup is not None else None
        except ValueError as error:
            message = f"vramleak.{error}"
        else:
            return self._run(n, warmup, max_steps, step) if self._watcher is not None else iter(range(n))
        pytest.fail(message, pytrace=False)

    def _run(self, n: int, warmup: int | None, max_steps: int, step: Callable[..., Any] | None) -> Iterator[int]:
        assert self._watcher is not None
        yield from self._watcher.steps(n, warmup=warmup, max_steps=max_steps, step=step)
        result = self._watcher.results[-1]
        if result.grows and not self._allowed:
            raise VramLeak(result.describe(), pytrace=False)

    def check(
        self, step: Callable[..., Any], *, steps: int = 10, warmup: int | None = None, max_steps: int | None = None
    ) -> StepResult:
        """Call ``step(i)`` (or ``step()``) ``steps`` times (up to ``max_steps`` where that leaves
        the verdict undecided) and fail the test if memory kept growing."""
        __tracebackhide__ = True  # a step that raises shows the user's frames, as pytest's own are hidden
        try:
            call = step_caller(step)
            for index in self.steps(steps, warmup=warmup, max_steps=max_steps, step=step):
                call(index)
        except StepNotRun as error:
            message = f"vramleak.{error}"
        else:
            if self._watcher is None:
                return StepResult("none", 0, [], None, reason="not checked: torch is not installed")
            return self._watcher.results[-1]
        pytest.fail(message, pytrace=False)


def make_fixture(request: pytest.FixtureRequest) -> VramLeakFixture:
    """The value of the ``vramleak`` fixture (declared in :mod:`pytest_vramleak.plugin`) for the
    test ``request`` sets up."""
    session = session_of(request.config)
    settings = session.settings
    assert settings is not None
    if session.torch_missing is not None:
        return VramLeakFixture(None)  # the steps run, unchecked, as the header says
    test = request.node.stash.setdefault(TEST, CheckedTest())  # (a test asking for it by name was not planned)
    budget, check = test.budget, test.current
    meter = (
        check.meter
        if check is not None and check.meter is not None
        else meter_for(request.node, budget.device if budget else None)
    )
    if check is None:
        check = test.current = Check(None, meter)
    allowed = test.allowed = test.allowed or request.node.get_closest_marker(EXEMPT_MARKER) is not None

    def on_result(result: StepResult) -> None:
        check.steps.append(result)
        if allowed:
            return  # (recorded: the test's record says it grew, and that the marker allowed it)
        check.step_leaked = check.step_leaked or result.grows
        if result.grows and result.stopped_early:
            check.left_early = result

    watcher = StepWatcher(
        meter.name,
        warmup=settings.warmup,
        tolerance=settings.tolerance,
        meter=meter,
        tracker=session.start_tracking(),
        record_sites=settings.sites != "off",
        on_result=on_result,
        named_roots=functools.partial(named_roots, request.node),
    )
    return VramLeakFixture(watcher, allowed=allowed)

"""The rules that judge a test's runs once naming has set aside what is not the test's, and the
rules that join its step checks to its verdict: plain functions of figures (pytest_vramleak.judging)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pytest_vramleak.judging.outcome import step_verdict, verdict_with_steps
from pytest_vramleak.judging.repeats import (
    Repetitions,
    Rule,
    Run,
    decide,
    kept_once_already,
    last_growing_run,
    run_made,
    set_aside_per_run,
    settled_credit,
)

K = 1024
CLOCKS = [10, 20, 30, 40]
"""Four runs, begun at these tracker clocks."""


@pytest.mark.parametrize(("born", "run"), [(9, None), (10, 0), (19, 0), (20, 1), (39, 2), (40, 3), (99, 3)])
def test_a_storage_belongs_to_the_last_run_begun_before_it(born: int, run: int | None) -> None:
    assert run_made(CLOCKS, born) == run


@pytest.mark.parametrize(
    ("born", "first_run_too", "adjust"),
    [
        (15, True, [K, 0, 0, 0]),  # PyTorch's, made by the first run: set aside from it
        (15, False, [0, 0, 0, 0]),  # pytest's, of a test run once: kept once, counted
        (25, False, [0, K, 0, 0]),  # pytest's, of a later run: set aside from that run
        (45, True, [0, 0, 0, K]),
        (5, True, [0, 0, 0, 0]),  # made before the runs: no run's
    ],
)
def test_what_is_set_aside_is_taken_off_the_run_that_made_it(born: int, first_run_too: bool, adjust: list[int]) -> None:
    assert set_aside_per_run(CLOCKS, [(born, K)], first_run_too=first_run_too) == adjust


def test_set_aside_storages_of_one_run_add_up() -> None:
    assert set_aside_per_run(CLOCKS, [(21, K), (22, 2 * K), (31, K)], first_run_too=True) == [0, 3 * K, K, 0]


@pytest.mark.parametrize(
    ("born", "credit"),
    [
        (15, [0, K, 0, 0]),  # garbage of the first run, replaced by the second: freed by it
        (35, [0, 0, 0, K]),
        (45, [0, 0, 0, 0]),  # garbage of the last run: no run after it replaced it
        (5, [0, 0, 0, 0]),  # made before the runs
    ],
)
def test_garbage_on_cycles_is_credited_to_the_run_after_the_one_that_made_it(born: int, credit: list[int]) -> None:
    assert settled_credit(CLOCKS, [(born, K)]) == credit


def _runs(*left: int, nodes: tuple[int, ...] = ()) -> list[Run]:
    return [Run(bytes_, "leaked", nodes[index] if nodes else 0) for index, bytes_ in enumerate(left)]


@pytest.mark.parametrize(
    ("runs", "stop"),
    [
        (_runs(K, 0, 0), True),  # the runs after the second added nothing
        (_runs(K, K, 0), True),  # (the second may still finish what the first began)
        (_runs(K, 0), False),  # too few runs
        (_runs(K, K, 0, 1), False),  # a byte is growth
        (_runs(K, 0, 0, nodes=(5, 5, 6)), False),  # so is a kept autograd node
        (_runs(K, 0, -K), True),  # freeing is not adding
    ],
)
def test_confirming_runs_stop_once_the_runs_after_the_second_add_nothing(runs: list[Run], stop: bool) -> None:
    assert kept_once_already(runs) is stop


@pytest.mark.parametrize(
    ("series", "warmup", "run"),
    [
        ([K, 2 * K, 3 * K, 4 * K], 1, 3),
        ([K, 2 * K, 3 * K, 3 * K], 1, 2),  # the last run left nothing more: the one before it
        ([K, K, K, K], 1, None),
        ([K, 2 * K], 0, 1),
        ([K, K], 0, 0),  # with no warm-up, the first run counts from nothing
    ],
)
def test_the_run_shown_is_the_last_that_left_more(series: list[int], warmup: int, run: int | None) -> None:
    assert last_growing_run(series, warmup) == run


class _FirstRun:
    def __init__(self, message: str) -> None:
        self.outcome = "leaked"
        self.message = message
        self.memory_leaked = True
        self.other_leaks = False
        self.over_budget = False
        self.left_behind: list[str] = []


def _growing(mode: str) -> Repetitions:
    repetitions = Repetitions(planned=4, warmup=1, mode=mode)
    repetitions.runs = _runs(4 * K, 4 * K, 4 * K, 4 * K)
    return repetitions


@pytest.mark.parametrize(
    ("fail_on", "mode", "first_message", "opens"),
    [
        ("significant", "confirm", "leaked 4 KiB on cpu, allowed 0 B", "memory grew"),
        ("any", "repeat", "leaked 4 KiB on cpu, allowed 0 B", "memory grew"),
        # a strict rule judges the first run of re-runs that confirm: its verdict opens the failure
        ("any", "confirm", "leaked 4 KiB on cpu, allowed 0 B", "leaked 4 KiB"),
        # ... where it has one
        ("any", "confirm", "", "memory grew"),
    ],
)
def test_the_failure_of_growing_runs_opens_with_the_growth_or_the_first_run(
    fail_on: str, mode: str, first_message: str, opens: str
) -> None:
    decision = decide(_growing(mode), _FirstRun(first_message), Rule(0, 0, fail_on), device="cpu")  # type: ignore[arg-type]
    assert decision.outcome == "leaked" and decision.pattern == "grows"
    assert decision.message.startswith(opens)
    assert decision.opens_with_growth is (opens == "memory grew")


@pytest.mark.parametrize(
    ("fail_on", "mode", "first_message", "left_behind", "told"),
    [
        # a strict rule's planned repeats that grow open with the growth: what the runs showed
        # ends with the rule the first run broke alone
        ("any", "repeat", "leaked 4 KiB on cpu, allowed 0 B", False, True),
        # ... unless the failure says it already (the first run left a process behind)
        ("any", "repeat", "leaked 4 KiB on cpu, allowed 0 B", True, False),
        # ... or it broke none
        ("any", "repeat", "", False, False),
        # a rule that is not strict does not judge the first run alone
        ("significant", "repeat", "leaked 4 KiB on cpu, allowed 0 B", False, False),
        # re-runs that confirm open with the first run's verdict
        ("any", "confirm", "leaked 4 KiB on cpu, allowed 0 B", False, False),
    ],
)
def test_what_growing_runs_showed_ends_with_the_first_runs_verdict_under_a_strict_rule(
    fail_on: str, mode: str, first_message: str, left_behind: bool, told: bool
) -> None:
    first = _FirstRun(first_message)
    first.left_behind = ["left 1 child process(es) running"] if left_behind else []
    decision = decide(_growing(mode), first, Rule(0, 0, fail_on), device="cpu")  # type: ignore[arg-type]
    assert decision.outcome == "leaked" and decision.pattern == "grows"
    assert decision.about.endswith(f"\nfirst run: {first_message}") is told
    assert decision.about.count("first run: ") == told


@dataclass
class _Step:
    grows: bool = False
    undecided: str | None = None
    verdict: object | None = "measured"


UNMEASURED = _Step(verdict=None)


@pytest.mark.parametrize(
    ("steps", "verdict"),
    [
        ([], None),
        ([UNMEASURED], None),
        ([_Step()], "passed"),
        ([_Step(), _Step(undecided="noise")], "undecided"),
        ([_Step(undecided="noise"), _Step(grows=True)], "leaked"),
    ],
)
def test_the_step_checks_verdict(steps: list[_Step], verdict: str | None) -> None:
    assert step_verdict(steps) == verdict


@pytest.mark.parametrize(
    ("check", "steps", "budget_checked", "unchecked", "verdict"),
    [
        ("passed", [_Step(grows=True)], True, False, "leaked"),  # a step that grew fails the test
        ("over_budget", [_Step(grows=True)], True, False, "leaked"),
        ("unchecked", [_Step()], False, False, "passed"),  # checked through the fixture alone
        ("unchecked", [_Step()], True, False, "unchecked"),  # its budget's check could not be made
        ("unchecked", [_Step()], False, True, "unchecked"),  # it failed, was skipped...
        ("unchecked", [_Step(undecided="noise")], False, False, "unchecked"),
        ("unchecked", [UNMEASURED], False, False, "unchecked"),
        ("leaked", [_Step()], True, False, "leaked"),
        ("passed", [], True, False, "passed"),
    ],
)
def test_a_tests_verdict_with_its_step_checks(
    check: str, steps: list[_Step], budget_checked: bool, unchecked: bool, verdict: str
) -> None:
    assert verdict_with_steps(check, steps, budget_checked=budget_checked, unchecked=unchecked) == verdict  # type: ignore[arg-type]

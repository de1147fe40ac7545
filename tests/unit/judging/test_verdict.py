from __future__ import annotations

import pytest

from pytest_vramleak import Budget, judge_budget, judge_growth
from pytest_vramleak.judging.verdict import Increase, judge_increase, parse_increase

MIB = 1024**2


@pytest.mark.parametrize(
    ("leaked", "outcome"),
    [(MIB - 1, "passed"), (MIB, "passed"), (MIB + 1, "leaked")],
)
def test_leak_budget_at_its_limit(leaked: int, outcome: str) -> None:
    assert judge_budget(Budget(leak=MIB), "cpu", leaked, None).outcome == outcome


@pytest.mark.parametrize(
    ("peak", "outcome"),
    [(MIB - 1, "passed"), (MIB, "passed"), (MIB + 1, "over_budget"), (None, "passed")],
)
def test_peak_budget_at_its_limit(peak: int | None, outcome: str) -> None:
    assert judge_budget(Budget(peak=MIB), "cpu", 0, peak).outcome == outcome


def test_leak_message_names_amount_device_and_budget() -> None:
    verdict = judge_budget(Budget(leak=64 * 1024), "cpu", 4 * MIB, None)
    assert verdict.message == "leaked 4.0 MiB on cpu, allowed 64.0 KiB"


def test_leak_and_peak_together_report_both() -> None:
    verdict = judge_budget(Budget(peak=MIB), "cuda:0", 2 * MIB, 3 * MIB)
    assert verdict.outcome == "leaked"
    assert (
        verdict.message
        == "leaked 2.0 MiB on cuda:0, allowed 0 B; peaked at 3.0 MiB above baseline on cuda:0, allowed 1.0 MiB"
    )


K = 1000


@pytest.mark.parametrize(
    ("name", "steps"),
    [
        ("steady", [K * i for i in range(1, 9)]),
        ("every other step", [0, K, K, 2 * K, 2 * K, 3 * K, 3 * K, 4 * K]),
        ("every third step", [0, 0, K, K, K, 2 * K, 2 * K, 2 * K, 3 * K]),
        ("two measured steps", [0, K]),
        ("odd count", [K, 2 * K, 3 * K, 4 * K, 5 * K]),
    ],
)
def test_growth_is_flagged(name: str, steps: list[int]) -> None:
    assert judge_growth(steps, tolerance=0).grows, name


@pytest.mark.parametrize(
    ("name", "steps"),
    [
        ("flat", [0] * 8),
        ("flat after lazy state in warm-up", [0, 0, 0, 0, 0, 0]),
        ("bounded buffer fills, then plateaus", [K, 2 * K, 3 * K, 3 * K, 3 * K, 3 * K, 3 * K, 3 * K]),
        ("gradient accumulation: up, up, up, freed", [K, 2 * K, 3 * K, 0, K, 2 * K, 3 * K, 0]),
        ("alternating temporaries", [K, 0, K, 0, K, 0, K, 0]),
        ("one spike at the end", [0, 0, 0, 0, 0, 0, 0, 5 * K]),
        ("memory released", [5 * K, 4 * K, 3 * K, 2 * K, K, 0]),
        # batches padded to their longest sequence: figures vary below the baseline
        ("varying below the baseline", [-144, -1126, 0, -720]),
        ("back up to the baseline", [-2 * K, -K, 0, 0]),
    ],
)
def test_non_growth_is_not_flagged(name: str, steps: list[int]) -> None:
    assert not judge_growth(steps, tolerance=0).grows, name


@pytest.mark.parametrize(("tolerance", "grows"), [(4 * K - 1, True), (4 * K, False), (4 * K + 1, False)])
def test_growth_tolerance_at_its_limit(tolerance: int, grows: bool) -> None:
    # the band rises by 4 K between the halves
    assert judge_growth([K * i for i in range(1, 9)], tolerance).grows is grows


def test_growth_under_a_sawtooth_ending_in_a_trough_reports_what_it_kept() -> None:
    steps = [4, 8, -11036, 16, 20, 24, -11020, 32, 36, 40, -11004, 48, 52, 56, -10988]
    verdict = judge_growth(steps, tolerance=0)
    assert verdict.grows
    assert verdict.message == "memory grew 4 B per step over 15 measured steps (60 B in total) on cpu, tolerance 0 B"


def test_growth_figures() -> None:
    verdict = judge_growth([1024 * i for i in range(1, 9)], 0)
    assert verdict.growth_bytes == 8 * 1024
    assert verdict.per_step_bytes == 1024
    assert (
        verdict.message == "memory grew 1.0 KiB per step over 8 measured steps (8.0 KiB in total) on cpu, tolerance 0 B"
    )


@pytest.mark.parametrize(
    ("name", "steps", "per_step"),
    [
        ("starts in the later half", [0] * 49 + [1 << 30, 2 << 30, 3 << 30], 1 << 30),
        ("starts late, 2.5 KiB a step", [0, 0, 0, 0, 0, 2560, 5120, 7680], 2560),
        ("every third step", [0, 0, 4096, 4096, 4096, 8192, 8192, 8192, 12288], 4096 / 3),
        ("under a sawtooth", [1016, 2032, 3048, 8, 1024, 2040, 3056, 16], 2),
    ],
)
def test_growth_is_flagged_with_its_real_rate(name: str, steps: list[int], per_step: float) -> None:
    verdict = judge_growth(steps, tolerance=0)
    assert verdict.grows, name
    assert verdict.per_step_bytes == pytest.approx(per_step, rel=0.01), name


@pytest.mark.parametrize(
    ("name", "steps", "settled_at"),
    [
        ("a buffer full at the 6th step", [4864, 9728, 14592, 19456, 24320, 29184, 29184, 29184], 6),
        (
            "optimizer state at the first real step, under accumulation",
            [0, 11064, 22112, 22112, 22112, 11064, 22112, 22112],
            3,
        ),
        ("a cache filled in the first steps", [K, 2 * K, 3 * K, 3 * K, 3 * K, 3 * K, 3 * K, 3 * K], 3),
    ],
)
def test_memory_that_rises_and_stays_flat_is_settled(name: str, steps: list[int], settled_at: int) -> None:
    verdict = judge_growth(steps, tolerance=0)
    assert not verdict.grows, name
    assert verdict.settled_at == settled_at, name
    assert verdict.kept_bytes > 0


@pytest.mark.parametrize("steps", [[0] * 8, [K, 0] * 4, [5 * K, 4 * K, 3 * K, 2 * K, K, 0], [0] * 7 + [5 * K]])
def test_memory_that_never_stays_up_is_not_settled(steps: list[int]) -> None:
    verdict = judge_growth(steps, tolerance=0)
    assert (verdict.grows, verdict.settled_at, verdict.kept_bytes) == (False, None, 0)


def test_growth_needs_two_steps() -> None:
    with pytest.raises(ValueError, match="at least 2 measured steps"):
        judge_growth([K], 0)


@pytest.mark.parametrize(
    ("text", "fraction", "size"),
    [("10%", 0.10, 0), ("1 MiB", 0.0, 1024**2), ("10%, 64 KiB", 0.10, 65536), ("64kb,2.5%", 0.025, 64000)],
)
def test_parse_increase(text: str, fraction: float, size: int) -> None:
    assert parse_increase(text) == Increase(fraction, size)


@pytest.mark.parametrize(
    ("old", "new", "fails"),
    [
        (10 * MIB, 11 * MIB, False),  # +10%: at the percentage limit
        (10 * MIB, 11 * MIB + 1, True),
        (100 * 1024, 150 * 1024, False),  # +50%, but only 50 KiB: under the byte limit
        (100 * 1024, 200 * 1024, True),
        (0, 64 * 1024, False),
        (0, 64 * 1024 + 1, True),
    ],
)
def test_increase_fails_only_past_both_limits(old: int, new: int, fails: bool) -> None:
    assert bool(judge_increase(old, new, Increase(0.10, 64 * 1024), "cpu")) is fails


class _FirstRun:
    """The first run's figures as :func:`~pytest_vramleak.judging.repeats.memory_fails` reads them."""

    def __init__(self, *, memory_leaked: bool = True, other_leaks: bool = False) -> None:
        self.outcome = "leaked" if memory_leaked or other_leaks else "passed"
        self.message = ""
        self.memory_leaked = memory_leaked
        self.other_leaks = other_leaks
        self.over_budget = False
        self.left_behind: list[str] = []


FLOOR = 1024


@pytest.mark.parametrize(
    "fail_on, grows, kept, first_kept, memory_leaked, other_leaks, fails",
    [
        # any: the first run as a test run once, past the budget (100 B); growth; another leak
        ("any", False, 0, 101, True, False, True),
        ("any", False, 0, 100, True, False, False),
        ("any", False, 0, 101, False, False, False),
        ("any", False, 0, 0, True, True, True),
        ("any", True, 0, 0, False, False, True),
        # growth: only growth, or another leak
        ("growth", False, 10 * FLOOR, 10 * FLOOR, True, False, False),
        ("growth", True, 0, 0, False, False, True),
        ("growth", False, 0, 0, False, True, True),
        # significant: growth, or kept over the budget and at least the floor
        ("significant", False, FLOOR - 1, FLOOR - 1, True, False, False),
        ("significant", False, FLOOR, FLOOR, True, False, True),
        ("significant", False, FLOOR + 1, 0, True, False, True),
        ("significant", True, 0, 0, False, False, True),
        ("significant", False, 0, 0, False, True, True),
    ],
)
def test_memory_fails_by_the_rules_table(
    fail_on: str, grows: bool, kept: int, first_kept: int, memory_leaked: bool, other_leaks: bool, fails: bool
) -> None:
    from pytest_vramleak.judging.repeats import Rule, memory_fails

    rule = Rule(100, 0, fail_on, FLOOR)  # type: ignore[arg-type]
    first = _FirstRun(memory_leaked=memory_leaked, other_leaks=other_leaks)
    assert memory_fails(rule, first, grows=grows, kept=kept, first_kept=first_kept) is fails


def test_significant_needs_both_the_budget_and_the_floor() -> None:
    from pytest_vramleak.judging.repeats import Rule, memory_fails

    rule = Rule(2 * FLOOR, 0, "significant", FLOOR)
    assert not memory_fails(rule, _FirstRun(), grows=False, kept=2 * FLOOR, first_kept=2 * FLOOR)
    assert memory_fails(rule, _FirstRun(), grows=False, kept=2 * FLOOR + 1, first_kept=0)

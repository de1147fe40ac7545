"""Bad input is a usage error naming its source, never a crash: sizes too large for any budget, and
two budgets on one test."""

from __future__ import annotations

import textwrap

import pytest

from pytest_vramleak import SizeError, parse_size
from pytest_vramleak.sizes import MAX_SIZE

FOUR_HUNDRED_DIGITS = "9" * 400
SHOWN_400 = "'" + "9" * 31 + "... (400 characters)"
"""How an error message quotes a 400-digit size: its beginning and its length."""


# -- sizes -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (MAX_SIZE - 1, MAX_SIZE - 1),
        (MAX_SIZE, MAX_SIZE),
        (str(MAX_SIZE - 1), MAX_SIZE - 1),
        (str(MAX_SIZE), MAX_SIZE),
        (f"{MAX_SIZE}.99 B", MAX_SIZE),  # fractions round down
        ("8388607 TiB", 8388607 * 1024**4),
        ("8388607.999999999999999999999999999999 TiB", MAX_SIZE),  # just under 8388608 TiB, which is 2**63
        ("9223372036854775806", 9223372036854775806),  # 2**53 and more: a float would have rounded these
        ("9007199254740993", 9007199254740993),
        ("1.5GB", 1_500_000_000),
        ("0.1 KiB", 102),
        ("2.675 kB", 2675),
        ("0." + "0" * 5000 + "1 TiB", 0),
        ("0" * 5000 + "42", 42),
    ],
)
def test_sizes_are_read_exactly_up_to_the_limit(value: object, expected: int) -> None:
    assert parse_size(value) == expected


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (MAX_SIZE + 1, "9223372036854775808"),
        (str(MAX_SIZE + 1), "'9223372036854775808'"),
        ("8388608 TiB", "'8388608 TiB'"),
        (FOUR_HUNDRED_DIGITS, SHOWN_400),
        (FOUR_HUNDRED_DIGITS + ".5 MiB", "'" + "9" * 31 + "... (406 characters)"),
        ("1" + "0" * 5000, "'1" + "0" * 30 + "... (5001 characters)"),
        pytest.param(10**5000, "an int of 16610 bits", id="int 10**5000"),  # Python will not print an int of 5001 digits
    ],
)
def test_a_size_past_the_limit_is_refused_with_a_short_message(value: object, shown: str) -> None:
    with pytest.raises(SizeError) as raised:
        parse_size(value)
    assert str(raised.value) == f"too large: {shown}, more than the largest size a budget can hold, 9223372036854775807 bytes (8 EiB - 1)"


TOO_LARGE = f"too large: {SHOWN_400}, more than the largest size a budget can hold*"


@pytest.mark.parametrize(
    ("args", "ini", "message"),
    [
        ([f"--vramleak-leak={FOUR_HUNDRED_DIGITS}"], "", f"--vramleak-leak: {TOO_LARGE}"),
        ([], f"vramleak_leak = {FOUR_HUNDRED_DIGITS}", f"ini option vramleak_leak: {TOO_LARGE}"),
        ([f"--vramleak-tolerance={FOUR_HUNDRED_DIGITS}"], "", f"--vramleak-tolerance: {TOO_LARGE}"),
        ([], f"vramleak_tolerance = {FOUR_HUNDRED_DIGITS}", f"ini option vramleak_tolerance: {TOO_LARGE}"),
        ([f"--vramleak-max-increase=10%, {FOUR_HUNDRED_DIGITS}"], "", f"--vramleak-max-increase: {TOO_LARGE}"),
        ([f"--vramleak-leak={MAX_SIZE + 1}"], "", "--vramleak-leak: too large: '9223372036854775808', *"),
    ],
)
def test_an_option_size_too_large_is_a_usage_error(pytester: pytest.Pytester, args: list[str], ini: str, message: str) -> None:
    if ini:
        pytester.makeini(f"[pytest]\n{ini}\n")
    pytester.makepyfile(test_it="def test_it():\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message}"])
    result.stdout.no_fnmatch_line("*INTERNALERROR*")


def test_the_largest_size_is_a_budget_that_works(pytester: pytest.Pytester, run_checked) -> None:
    pytester.makepyfile(test_it="import pytest, torch\nKEPT = []\ndef test_it():\n    KEPT.append(torch.ones(256))\n")
    result, report = run_checked("--vramleak", f"--vramleak-leak={MAX_SIZE}", f"--vramleak-tolerance={MAX_SIZE}")
    result.assert_outcomes(passed=1)
    assert report["test_it"]["budget"]["leak"] == MAX_SIZE


@pytest.mark.parametrize("keyword", ["leak", "peak", "reserved", "pinned"])
@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (repr(FOUR_HUNDRED_DIGITS), SHOWN_400),
        ("10**400", "an int of 1329 bits"),
        (repr(f"{MAX_SIZE + 1} B"), f"'{MAX_SIZE + 1} B'"),
    ],
    ids=["400 digits", "int 10**400", "limit plus one"],
)
def test_a_marker_size_too_large_is_a_usage_error_naming_the_test(pytester: pytest.Pytester, keyword: str, value: str, shown: str) -> None:
    pytester.makepyfile(test_it=f"import pytest\n@pytest.mark.vram_budget({keyword}={value})\ndef test_it():\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: test_it.py::test_it: @pytest.mark.vram_budget({keyword}=*): too large: {shown.replace('[', '[[]')}, *"])
    result.stdout.no_fnmatch_line("*INTERNALERROR*")


def test_a_marker_at_the_limit_is_accepted(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_it=f"import pytest\n@pytest.mark.vram_budget({MAX_SIZE}, leak='{MAX_SIZE}')\ndef test_it():\n    pass\n")
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)


# -- two budgets on one test ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "message"),
    [
        pytest.param(
            """
            @pytest.mark.vram_budget(leak="1 MiB")
            @pytest.mark.vram_budget
            def test_it():
                pass
            """,
            "test_it.py::test_it: @pytest.mark.vram_budget: 2 budgets on the test (its decorators and pytest.param marks): keep one; *",
            id="two decorators",
        ),
        pytest.param(
            """
            @pytest.mark.vram_budget
            @pytest.mark.parametrize("n", [1, pytest.param(2, marks=pytest.mark.vram_budget(leak="1 MiB"))])
            def test_it(n):
                pass
            """,
            "test_it.py::test_it[[]2]: @pytest.mark.vram_budget: 2 budgets on the test (its decorators and pytest.param marks): keep one; *",
            id="decorator and param",
        ),
        pytest.param(
            """
            @pytest.mark.vram_budget
            class TestBase:
                pass

            @pytest.mark.vram_budget(leak="1 MiB")
            class TestIt(TestBase):
                def test_it(self):
                    pass
            """,
            "test_it.py::TestIt::test_it: @pytest.mark.vram_budget: 2 budgets on class test_it.py::TestIt (its decorators and its base classes'): keep one; *",
            id="class and base class",
        ),
        pytest.param(
            """
            pytestmark = [pytest.mark.vram_budget, pytest.mark.vram_budget(leak="1 MiB")]

            def test_it():
                pass
            """,
            "test_it.py::test_it: @pytest.mark.vram_budget: 2 budgets on test_it.py (its pytestmark): keep one; *",
            id="module",
        ),
    ],
)
def test_two_budgets_on_one_node_are_a_usage_error(pytester: pytest.Pytester, source: str, message: str) -> None:
    pytester.makepyfile(test_it="import pytest\n" + textwrap.dedent(source))
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message}"])


@pytest.mark.parametrize(
    ("outer", "inner", "outcome"),
    [
        ('leak="1 MiB"', "leak=0", "leaked"),  # the method's budget is closer than its class's
        ("leak=0", 'leak="1 MiB"', "passed"),
    ],
)
def test_a_budget_on_a_method_overrides_its_class_and_module(pytester: pytest.Pytester, run_checked, outer: str, inner: str, outcome: str) -> None:
    pytester.makepyfile(
        test_it=f"""
import pytest, torch

KEPT = []
pytestmark = pytest.mark.vram_budget({outer})

@pytest.mark.vram_budget({outer})
class TestIt:
    @pytest.mark.vram_budget({inner})
    def test_method(self):
        KEPT.append(torch.ones(256))

    def test_inherits_the_class_budget(self):
        KEPT.append(torch.ones(256))

def test_inherits_the_module_budget():
    KEPT.append(torch.ones(256))
"""
    )
    result, report = run_checked()
    outer_outcome = "passed" if "MiB" in outer else "leaked"
    assert {name: entry["outcome"] for name, entry in report.items()} == {
        "test_method": outcome,
        "test_inherits_the_class_budget": outer_outcome,
        "test_inherits_the_module_budget": outer_outcome,
    }
    result.stderr.no_fnmatch_line("*budgets on*")

"""Bad input is a usage error naming its source, never a crash: sizes too large for any budget, a saved
run or a report that does not follow its format (``pytest_vramleak/reporting/schemas``), and two budgets on
one test."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import textwrap
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from pytest_vramleak import SizeError, parse_size
from pytest_vramleak.judging.sizes import MAX_SIZE
from pytest_vramleak.reporting.schemas import first_problem, load

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
        pytest.param(
            10**5000, "an int of 16610 bits", id="int 10**5000"
        ),  # Python will not print an int of 5001 digits
    ],
)
def test_a_size_past_the_limit_is_refused_with_a_short_message(value: object, shown: str) -> None:
    with pytest.raises(SizeError) as raised:
        parse_size(value)
    assert (
        str(raised.value)
        == f"too large: {shown}, more than the largest size a budget can hold, 9223372036854775807 bytes (8 EiB - 1)"
    )


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
def test_an_option_size_too_large_is_a_usage_error(
    pytester: pytest.Pytester, args: list[str], ini: str, message: str
) -> None:
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
def test_a_marker_size_too_large_is_a_usage_error_naming_the_test(
    pytester: pytest.Pytester, keyword: str, value: str, shown: str
) -> None:
    pytester.makepyfile(
        test_it=f"import pytest\n@pytest.mark.vram_budget({keyword}={value})\ndef test_it():\n    pass\n"
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            f"ERROR: test_it.py::test_it: @pytest.mark.vram_budget({keyword}=*): too large: {shown.replace('[', '[[]')}, *"
        ]
    )
    result.stdout.no_fnmatch_line("*INTERNALERROR*")


def test_a_marker_at_the_limit_is_accepted(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it=f"import pytest\n@pytest.mark.vram_budget({MAX_SIZE}, leak='{MAX_SIZE}')\ndef test_it():\n    pass\n"
    )
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)


# -- saved runs (--vramleak-compare) -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("saved", "message"),
    [
        ("[1, 2]", "the saved run 'main' at {path} is not a saved run: $ is a list, expected an object"),
        (
            '{"version": 1, "tests": [1, 2]}',
            "the saved run 'main' at {path} is not a saved run: $.tests is a list, expected an object",
        ),
        (
            '{"version": 1, "tests": {"id": 5}}',
            "the saved run 'main' at {path} is not a saved run: $.tests.id is the number 5, expected an object",
        ),
        (
            '{"version": 1, "tests": {"test_it.py::test_it": {"device": "cpu", "peak_bytes": "4 MiB"}}}',
            "the saved run 'main' at {path} is not a saved run: "
            '$.tests["test_it.py::test_it"].peak_bytes is the string "4 MiB", expected a whole number or null',
        ),
        ('{"tests": {}}', "the saved run 'main' at {path} is not a saved run: $ has no 'version'"),
        (
            '{"version": 99, "tests": {}}',
            "the saved run 'main' at {path} has format version 99; this pytest-vramleak reads version 1: save the run again",
        ),
        (
            "{",
            "cannot read the saved run 'main' at {path}: not JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
        ),
    ],
    ids=["list", "tests a list", "entry a number", "peak a string", "no version", "version 99", "not json"],
)
def test_a_saved_run_that_does_not_follow_its_format_is_a_usage_error_at_start(
    pytester: pytest.Pytester, saved: str, message: str
) -> None:
    path = pytester.path / ".vramleak" / "main.json"
    path.parent.mkdir()
    path.write_text(saved)
    pytester.makepyfile(test_it="import pytest\n@pytest.mark.vram_budget\ndef test_it():\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider", "--vramleak-compare=main")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert result.stderr.lines[0] == "ERROR: --vramleak-compare: " + message.format(path=path)
    result.stdout.no_fnmatch_line("*vramleak could not check this test*")


def test_a_saved_run_written_by_the_plugin_follows_its_format(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="import pytest, torch\n@pytest.mark.vram_budget\ndef test_it():\n    torch.ones(1024).sum()\n"
    )
    pytester.runpytest("-p", "no:cacheprovider", "--vramleak-save=main").assert_outcomes(passed=1)
    saved = json.loads((pytester.path / ".vramleak" / "main.json").read_text())
    assert first_problem(saved, "saved-run") is None
    assert saved["tests"]["test_it.py::test_it"]["peak_bytes"] > 0
    pytester.runpytest("-p", "no:cacheprovider", "--vramleak-compare=main").assert_outcomes(passed=1)


# -- reports (python -m pytest_vramleak merge) -------------------------------------------------------

EVERYTHING = """
import pytest
import torch
import pytest_vramleak

KEPT = []
# More leaves and storages than a check compares one by one: older tensors are compared between tests.
PARAMS = torch.nn.ParameterList(torch.nn.Parameter(torch.zeros(1)) for _ in range(2500))
BUFFERS = [torch.zeros(1) for _ in range(2500)]


@pytest.fixture(scope="module")
def table():
    KEPT.append(torch.ones(1024))
    return KEPT[-1]


@pytest.mark.vram_budget
def test_leaks(table):
    KEPT.append(torch.ones(256))


def test_steps_grow(vramleak):
    for step in vramleak.steps(6):
        KEPT.append(torch.ones(64))


def test_steps_settle(vramleak):
    for step in vramleak.steps(8, warmup=1):
        if step < 3:
            KEPT.append(torch.ones(64))


@pytest.mark.vram_budget(repeat=4)
def test_repeated():
    KEPT.append(torch.ones(32))


@pytest.mark.vram_budget("1 KiB")
def test_over_its_peak():
    scratch = torch.ones(4096) * 2
    del scratch


@pytest.mark.vram_budget
def test_grows_an_older_tensor():
    BUFFERS[0].resize_(4096)


@pytest.mark.vram_budget
def test_cycle():
    holder = [torch.ones(64)]
    holder.append(holder)


@pytest.mark.vram_budget
def test_ranks():
    with pytest_vramleak.watch_rank(1):  # as a rank process would; here in the test's own process
        KEPT.append(torch.ones(256))


@pytest.fixture
def broken():
    raise RuntimeError("set-up fails")


@pytest.mark.vram_budget
def test_fails_in_set_up(broken):
    pass
"""


def run_merge(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest_vramleak", "merge", *args],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def everything_run(tmp_path: Path) -> Path:
    """A report of a real run with every part of the format: leaks, step checks, repeated runs, a
    peak breakdown, an unchecked test, ranks, a fixture and older tensors between checks, under
    pytest-xdist (fixtures and findings name their worker; one worker is enough), and the same
    report merged."""
    (tmp_path / "test_everything.py").write_text(EVERYTHING)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
            "-n",
            "1",
            "--vramleak",
            "--vramleak-report=r.json",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, done.stdout + done.stderr
    merged = run_merge(tmp_path, "r.json", "--json", "merged.json")
    assert merged.returncode == 0, merged.stderr
    return tmp_path


def test_the_report_schema_is_valid_json_schema_and_ships_in_the_package() -> None:
    from jsonschema import Draft202012Validator

    for name in ("report", "report-v1", "saved-run"):
        text = (
            resources.files("pytest_vramleak")
            .joinpath("reporting", "schemas", f"{name}.schema.json")
            .read_text(encoding="utf-8")
        )
        Draft202012Validator.check_schema(json.loads(text))
        assert load(name) == json.loads(text)


# A field of a real report made wrong, and the problem the schema names: (test, field, value, problem).
BROKEN_FIELDS = [
    ("test_leaks", ("nodeid",), "DELETE", "$.tests[{i}] has no 'nodeid'"),
    (
        "test_leaks",
        ("verdict",),
        "fine",
        '$.tests[{i}].verdict is the string "fine", expected one of "passed", "leaked", "over_budget", "unchecked"',
    ),
    ("test_leaks", ("outcome",), 1, "$.tests[{i}].outcome is the number 1, expected a string or null"),
    ("test_leaks", ("verdict",), "DELETE", "$.tests[{i}] has no 'verdict'"),
    (
        "test_leaks",
        ("leaked_bytes",),
        "1 KiB",
        '$.tests[{i}].leaked_bytes is the string "1 KiB", expected a whole number or null',
    ),
    (
        "test_leaks",
        ("tensors", 0, "held_by"),
        "KEPT",
        '$.tests[{i}].tensors[0].held_by is the string "KEPT", expected a list',
    ),
    (
        "test_leaks",
        ("tensors", 0, "held_by_paths", 0, 0),
        ["KEPT"],
        "$.tests[{i}].tensors[0].held_by_paths[0][0]: ['KEPT'] is too short",
    ),
    ("test_leaks", ("budget", "leak"), [], "$.tests[{i}].budget.leak is a list, expected a whole number or null"),
    ("test_steps_grow", ("steps", 0), 1.5, "$.tests[{i}].steps[0] is the number 1.5, expected a whole number"),
    ("test_ranks", ("ranks", 0, "pid"), None, "$.tests[{i}].ranks[0].pid is null, expected a whole number"),
    (
        "test_over_its_peak",
        ("peak_breakdown", "categories"),
        [],
        "$.tests[{i}].peak_breakdown.categories is a list, expected an object",
    ),
    (
        "test_repeated",
        ("pattern",),
        "leaks",
        '$.tests[{i}].pattern is the string "leaks", expected one of "grows", "kept_once", "settled", null',
    ),
    ("test_cycle", ("notes",), "none", '$.tests[{i}].notes is the string "none", expected a list'),
]


def test_a_real_report_with_every_part_follows_the_schema(everything_run: Path) -> None:
    report = json.loads((everything_run / "r.json").read_text())
    tests = {entry["nodeid"].rsplit("::", 1)[1]: entry for entry in report["tests"]}
    # The run made every part of the format, so the schema is checked against each.
    assert tests["test_leaks"]["tensors"][0]["held_by_paths"]
    assert tests["test_steps_grow"]["steps"] and tests["test_steps_grow"]["warmup_steps"]
    assert tests["test_steps_settle"]["settled_after_step"] is not None
    assert tests["test_repeated"]["pattern"] == "grows" and tests["test_repeated"]["repetitions"]
    assert tests["test_over_its_peak"]["peak_breakdown"]["timeline"]["times_us"]
    assert tests["test_fails_in_set_up"]["verdict"] == "unchecked"
    assert tests["test_cycle"]["cycle_bytes"] > 0
    assert [(rank["rank"], rank["outcome"]) for rank in tests["test_ranks"]["ranks"]] == [(1, "leaked")]
    assert [(f["fixture"], f["worker"] in ("gw0", "gw1")) for f in report["fixtures"]] == [("table", True)]
    # (the span of tests between two comparisons, which run as time allows, covers the one that grew it)
    assert "test_everything.py::test_grows_an_older_tensor" in report["between_checks"][0]["where"]
    assert first_problem(report, "report") is None
    merged = json.loads((everything_run / "merged.json").read_text())
    assert merged["tests"][0]["shard"] == "r"
    assert first_problem(merged, "report") is None
    # Each field made wrong is named, down to where it is.
    named = {}
    for test, path, value, problem in BROKEN_FIELDS:
        i = next(i for i, entry in enumerate(report["tests"]) if entry["nodeid"].endswith("::" + test))
        broken = copy.deepcopy(report)
        where = broken["tests"][i]
        for key in path[:-1]:
            where = where[key]
        if value == "DELETE":
            del where[path[-1]]
        else:
            where[path[-1]] = value
        named[problem.format(i=i)] = first_problem(broken, "report")
    assert named == {problem: problem for problem in named}


@pytest.mark.parametrize(
    ("report", "problem"),
    [
        ({"version": 1, "tests": [1, 2]}, "$.tests[0] is the number 1, expected an object"),
        (
            {"version": 1, "tests": ["test_it.py::test_it"]},
            '$.tests[0] is the string "test_it.py::test_it", expected an object',
        ),
        ({"version": 1, "tests": [{"outcome": "passed"}]}, "$.tests[0] has no 'nodeid'"),
        (
            {"version": 1, "tests": [{"nodeid": 5, "outcome": "passed"}]},
            "$.tests[0].nodeid is the number 5, expected a string",
        ),
        ({"version": 1, "tests": [], "fixtures": {"model": 1}}, "$.fixtures is an object, expected a list"),
        ({"version": 1, "tests": [], "fixtures": [{"fixture": "model"}]}, "$.fixtures[0] has no 'scope'"),
        ({"version": 1, "tests": [], "between_checks": [None]}, "$.between_checks[0] is null, expected an object"),
        ({"version": 1, "tests": [], "about": {"host": 7}}, "$.about.host is the number 7, expected a string"),
    ],
)
def test_a_report_that_breaks_the_format_is_refused_by_merge_in_one_line(
    tmp_path: Path, report: dict[str, Any], problem: str
) -> None:
    (tmp_path / "good.json").write_text(
        json.dumps({"version": 1, "tests": [{"nodeid": "test_a.py::test_a", "outcome": "passed"}]})
    )
    (tmp_path / "bad.json").write_text(json.dumps(report))
    done = run_merge(tmp_path, "good.json", "bad.json", "--json", "all.json", "--html", "all.html")
    assert done.returncode == 2
    assert done.stderr == f"pytest-vramleak merge: bad.json: not a pytest-vramleak JSON report: {problem}\n"
    assert not (tmp_path / "all.json").exists() and not (tmp_path / "all.html").exists()


@pytest.mark.parametrize("version", [1, 2])
def test_a_report_with_only_the_required_fields_merges_into_both_outputs(tmp_path: Path, version: int) -> None:
    """What the schema lets through, the merge can render: only ``nodeid``, ``outcome`` and
    ``verdict`` are needed (in version 1, ``nodeid`` and ``outcome``, which was the verdict)."""
    pytests = {"passed": "passed", "leaked": "failed", "over_budget": "failed", "unchecked": "skipped"}
    report = {
        "version": version,
        "tests": [
            {"nodeid": f"test_a.py::test_{verdict}", "outcome": verdict}
            if version == 1
            else {"nodeid": f"test_a.py::test_{verdict}", "outcome": pytests[verdict], "verdict": verdict}
            for verdict in ("passed", "leaked", "over_budget", "unchecked")
        ],
        "fixtures": [{"fixture": "model", "scope": "module", "where": "test_a.py", "bytes": 4096}],
        "between_checks": [{"where": "test_a.py::test_leaked", "device": "cpu", "bytes": 64}],
    }
    (tmp_path / "few.json").write_text(json.dumps(report))
    done = run_merge(tmp_path, "few.json", "--json", "all.json", "--html", "all.html")
    assert done.returncode == 0, done.stderr
    assert "test_a.py::test_over_budget" in (tmp_path / "all.html").read_text()
    merged = json.loads((tmp_path / "all.json").read_text())
    assert first_problem(merged, "report") is None
    assert [(t["outcome"], t["verdict"]) for t in merged["tests"]] == [
        (None if version == 1 else pytests[verdict], verdict)
        for verdict in ("leaked", "over_budget", "passed", "unchecked")
    ]
    if version == 1:  # pytest's outcome was not recorded in version 1: the merge says so
        assert "few.json is a version 1 report: its tests' 'outcome' was the leak verdict" in done.stderr


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
def test_a_budget_on_a_method_overrides_its_class_and_module(
    pytester: pytest.Pytester, run_checked, outer: str, inner: str, outcome: str
) -> None:
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
    assert {name: entry["verdict"] for name, entry in report.items()} == {
        "test_method": outcome,
        "test_inherits_the_class_budget": outer_outcome,
        "test_inherits_the_module_budget": outer_outcome,
    }
    result.stderr.no_fnmatch_line("*budgets on*")

"""Repeated runs of a checked test: ``repeat=N``, ``--vramleak-repeat``, ``--vramleak-confirm`` and
``--vramleak-fail-on=growth`` tell memory that grows from memory kept once."""

from __future__ import annotations

import json

import pytest

SUITE = """
import pytest
import torch

KEPT = []
TABLE = {}
CACHE = []
CALLS = {"third": 0}


class Metric:
    def __init__(self):
        self._computed = None

    def compute(self):
        if self._computed is None:
            self._computed = torch.arange(256.0)
        return self._computed


@pytest.fixture(scope="module")
def model():
    return torch.nn.Linear(32, 32)


def test_appends_every_call():
    KEPT.append(torch.ones(256))


def test_first_backward_on_shared_model(model):
    model(torch.ones(2, 32)).sum().backward()


@pytest.mark.parametrize("metric", [Metric()])
def test_metric_caches_its_result(metric):
    assert metric.compute().sum() > 0


def test_lookup_table_built_lazily():
    if "table" not in TABLE:
        TABLE["table"] = torch.arange(1000.0)
    assert TABLE["table"][3] == 3


def test_cache_fills_for_three_calls():
    if len(CACHE) < 3:
        CACHE.append(torch.ones(512))


def test_leaks_every_third_call():
    CALLS["third"] += 1
    if CALLS["third"] % 3 == 0:
        KEPT.append(torch.ones(128))


def test_clean(model):
    model(torch.ones(2, 32)).sum().backward()
    model.zero_grad(set_to_none=True)
"""

PATTERNS = {
    "test_appends_every_call": ("grows", "leaked"),
    "test_first_backward_on_shared_model": ("kept_once", "leaked"),
    "test_metric_caches_its_result[metric0]": ("kept_once", "leaked"),
    "test_lookup_table_built_lazily": ("kept_once", "leaked"),
    "test_cache_fills_for_three_calls": ("settled", "leaked"),
    "test_leaks_every_third_call": ("grows", "leaked"),
    "test_clean": (None, "passed"),
}


def classes(report: dict[str, dict]) -> dict[str, tuple[str | None, str]]:
    return {name: (entry["pattern"], entry["verdict"]) for name, entry in report.items()}


def test_repeated_runs_classify_what_each_test_left(pytester: pytest.Pytester, run_checked) -> None:
    pytester.makepyfile(test_it=SUITE)
    # --vramleak-fail-on=any: the first run's leak fails, whatever the pattern
    result, report = run_checked("--vramleak", "--vramleak-repeat=10", "--vramleak-fail-on=any", "-p", "no:randomly")
    assert classes(report) == PATTERNS
    result.assert_outcomes(passed=1, failed=6)
    assert report["test_appends_every_call"]["repetitions"] == [1024 * k for k in range(1, 11)]
    assert report["test_appends_every_call"]["repetition_warmup"] == 2
    assert report["test_leaks_every_third_call"]["repetitions"] == [0, 0, 512, 512, 512, 1024, 1024, 1024, 1536, 1536]
    result.stdout.fnmatch_lines(
        [
            "*_ test_appends_every_call _*",
            "memory grew 1.0 KiB per run of the test over 8 measured runs on cpu, tolerance 0 B",
            "ran 10 times (2 warm-up)*",
            "pattern: grows: *",
            "tensors left by run 10 of 10, the last measured run that left any:",
            "float32?256? on cpu: 1 tensor, 1.0 KiB",
            "    held by test_it.KEPT?9?",  # the 10th run's: the list's 10th entry
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "*_ test_lookup_table_built_lazily _*",
            "leaked 3.9 KiB on cpu, allowed 0 B",
            "*",
            "*",
            "*",
            "*",
            "pattern: kept_once: the first run left 3.9 KiB, and the next 9 runs left nothing more*",
        ]
    )
    result.stdout.fnmatch_lines(
        ["*pattern: settled: memory rose until measured run 1 and then held flat (2.0 KiB kept)*"]
    )
    result.stdout.fnmatch_lines(["largest leaks:", "*test_it.py::test_lookup_table_built_lazily (cpu, kept once)*"])
    # A module-scoped model's gradients made by the first backward are kept, not the model itself.
    result.stdout.no_fnmatch_line("*fixture 'model'*still holds*")


def test_fail_on_growth_passes_memory_kept_once_and_lists_it(pytester: pytest.Pytester, run_checked) -> None:
    pytester.makepyfile(test_it=SUITE)
    result, report = run_checked("--vramleak", "--vramleak-repeat=10", "--vramleak-fail-on=growth", "-p", "no:randomly")
    expected = {
        name: (pattern, "leaked" if pattern == "grows" else "passed") for name, (pattern, _) in PATTERNS.items()
    }
    assert classes(report) == expected
    result.assert_outcomes(passed=5, failed=2)
    result.stdout.fnmatch_lines(
        [
            "memory kept once, not growing (passed: --vramleak-fail-on=growth):",
            "*3.9 KiB  test_it.py::test_lookup_table_built_lazily (cpu, kept once)",
            "*held by test_it.TABLE?'table'?",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "*test_it.py::test_first_backward_on_shared_model (cpu, kept once)",
            "*held by fixture 'model' (module scope).weight.grad",
        ]
    )


def test_confirm_reruns_only_tests_over_their_budget(pytester: pytest.Pytester, run_checked) -> None:
    pytester.makepyfile(test_it=SUITE)
    result, report = run_checked("--vramleak", "--vramleak-confirm=3", "--vramleak-fail-on=growth", "-p", "no:randomly")
    result.assert_outcomes(passed=6, failed=1)
    assert report["test_clean"]["repetitions"] is None  # ran once: nothing to confirm
    assert report["test_appends_every_call"]["pattern"] == "grows"
    assert report["test_appends_every_call"]["repetitions"] == [1024, 2048, 3072, 4096]
    assert report["test_appends_every_call"]["repetition_warmup"] == 1
    for name in (
        "test_first_backward_on_shared_model",
        "test_metric_caches_its_result[metric0]",
        "test_lookup_table_built_lazily",
    ):
        assert (report[name]["pattern"], report[name]["verdict"]) == ("kept_once", "passed")
    # The cache filled during the first two re-runs and held through the third.
    assert (
        report["test_cache_fills_for_three_calls"]["pattern"],
        report["test_cache_fills_for_three_calls"]["verdict"],
    ) == ("settled", "passed")
    assert report["test_leaks_every_third_call"]["repetitions"] is None  # its first call left nothing


def test_a_marker_repeat_wins_over_the_option(pytester: pytest.Pytester, run_checked) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest
        import torch

        KEPT = []

        @pytest.mark.vram_budget(repeat=4)
        def test_marked():
            KEPT.append(torch.ones(16))

        @pytest.mark.vram_budget
        def test_unmarked():
            KEPT.append(torch.ones(16))
        """
    )
    result, report = run_checked("--vramleak-repeat=6")
    assert len(report["test_marked"]["repetitions"]) == 4
    assert len(report["test_unmarked"]["repetitions"]) == 6
    result.assert_outcomes(failed=2)


def test_wider_fixtures_are_set_up_once_function_fixtures_every_run(pytester: pytest.Pytester, run_checked) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest
        import torch

        SETUPS = {"module": 0, "function": 0, "calls": 0}

        @pytest.fixture(scope="module")
        def shared():
            SETUPS["module"] += 1
            return torch.ones(4)

        @pytest.fixture
        def fresh():
            SETUPS["function"] += 1
            yield torch.ones(4)

        class TestGroup:
            def test_uses_both(self, shared, fresh):
                SETUPS["calls"] += 1

        def test_after():
            assert SETUPS == {"module": 1, "function": 5, "calls": 5}
        """
    )
    result, report = run_checked("--vramleak", "--vramleak-repeat=5", "-p", "no:randomly")
    result.assert_outcomes(passed=2)
    assert report["TestGroup::test_uses_both".rsplit("::", 1)[-1]]["pattern"] is None


def test_a_failing_run_keeps_its_failure_and_stops(pytester: pytest.Pytester, run_checked) -> None:
    pytester.makepyfile(
        test_it="""
        import torch

        CALLS = []

        def test_fails_on_third_call():
            CALLS.append(1)
            assert len(CALLS) < 3, f"call {len(CALLS)}"

        def test_after():
            assert len(CALLS) == 3
        """
    )
    result, report = run_checked("--vramleak", "--vramleak-repeat=6", "-p", "no:randomly")
    # A run after the first failing is not the test's failure: the first run's verdict stands.
    result.assert_outcomes(passed=2)
    result.stdout.no_fnmatch_line("E *AssertionError: call 3*")  # no traceback of a run again
    entry = report["test_fails_on_third_call"]
    assert entry["verdict"] == "passed"
    assert any(
        note.startswith("the runs after the first were not used: run 3 of 6 failed in call (AssertionError: call 3")
        for note in entry["notes"]
    )
    assert entry["repetitions"] == [0, 0]


def test_a_run_again_that_fails_in_its_teardown_leaves_the_test_reported_once(
    pytester: pytest.Pytester, run_checked
) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest, torch
        CACHE, CALLS = [], []

        @pytest.fixture
        def flaky_teardown():
            yield
            CALLS.append(1)
            if len(CALLS) == 2:
                raise RuntimeError("teardown failed on the second run")

        def test_leaks(flaky_teardown):
            CACHE.append(torch.ones(300_000))

        def test_after():
            pass
        """
    )
    junit = pytester.path / "junit.xml"
    result, report = run_checked("--vramleak", "-p", "no:randomly", f"--junitxml={junit}")
    # The teardown of a run the plugin made is not the test's: one failure, the leak's, which says
    # why the runs after the first were not used.
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.no_fnmatch_line("*RuntimeError: teardown failed on the second run")
    result.stdout.fnmatch_lines(
        ["the runs after the first were not used: run 2 of 4 failed in teardown (RuntimeError: teardown failed*"]
    )
    assert junit.read_text().count("<testcase ") == 2
    assert report["test_leaks"]["verdict"] == "leaked"


def test_a_wider_fixtures_teardown_after_the_runs_fails_the_test_as_in_pytest(
    pytester: pytest.Pytester, run_checked
) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest, torch
        CACHE = []

        @pytest.fixture(scope="module")
        def resource():
            yield
            raise RuntimeError("the module's teardown failed")

        def test_leaks(resource):
            CACHE.append(torch.ones(300_000))
        """
    )
    result, report = run_checked("--vramleak", "-p", "no:randomly")
    # torn down once, after the runs: pytest's error of a teardown, beside the leak's failure
    result.assert_outcomes(failed=1, errors=1)
    result.stdout.fnmatch_lines(["LEAKED test_it.py::test_leaks - VramLeak: memory grew *"])
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_leaks*",
            "teardown of fixtures after the test: RuntimeError: the module's teardown failed",
        ]
    )
    # (pytest 8.1's short summary gives a teardown error written as text no message of its own)
    result.stdout.fnmatch_lines(["ERROR test_it.py::test_leaks*"])


def test_skips_xfails_and_unittest_tests_behave_as_without_repeats(pytester: pytest.Pytester, run_checked) -> None:
    pytester.makepyfile(
        test_it="""
        import unittest
        import pytest
        import torch

        KEPT = []
        RUNS = {"xfail": 0, "unit": 0}

        def test_skipped():
            pytest.skip("not here")

        @pytest.mark.xfail(reason="known")
        def test_xfails():
            RUNS["xfail"] += 1
            assert False

        class Case(unittest.TestCase):
            def test_unit_leaks(self):
                RUNS["unit"] += 1
                KEPT.append(torch.ones(64))

        def test_counts():
            assert RUNS == {"xfail": 1, "unit": 4}
        """
    )
    result, report = run_checked("--vramleak", "--vramleak-repeat=4", "-p", "no:randomly")
    result.assert_outcomes(passed=1, skipped=1, xfailed=1, failed=1)
    assert report["test_unit_leaks"]["pattern"] == "grows"
    assert report["test_skipped"]["verdict"] == "unchecked"


def test_every_test_appears_once_in_the_reports(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest
        import torch

        KEPT = []

        @pytest.mark.parametrize("n", [1, 2])
        def test_param(n):
            KEPT.append(torch.ones(n))
        """
    )
    result = pytester.runpytest(
        "-p",
        "no:cacheprovider",
        "--vramleak",
        "--vramleak-repeat=4",
        "--junitxml=junit.xml",
        "--vramleak-report=r.json",
    )
    result.assert_outcomes(failed=2)
    junit = (pytester.path / "junit.xml").read_text()
    assert junit.count("<testcase ") == 2
    nodeids = [test["nodeid"] for test in json.loads((pytester.path / "r.json").read_text())["tests"]]
    assert sorted(nodeids) == ["test_it.py::test_param[1]", "test_it.py::test_param[2]"]


@pytest.mark.parametrize("args", [["--vramleak"], ["--vramleak", "--vramleak-repeat=4"]])
def test_a_run_again_adds_no_warnings_to_pytests_summary(pytester: pytest.Pytester, args: list[str]) -> None:
    pytester.makepyfile(
        test_it="""
        import warnings
        import torch

        KEPT = []

        def old_api():
            warnings.warn("old_api is deprecated", DeprecationWarning)

        def test_leaks_and_warns():
            old_api()
            KEPT.append(torch.ones(1000))

        RUNS = []

        def test_warns_only_when_run_again():
            if RUNS:
                warnings.warn("run twice", UserWarning)
            RUNS.append(torch.ones(1000))
        """
    )
    pytester.makeini("[pytest]\nfilterwarnings = default\n")  # (not this suite's filters)
    plain = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:randomly")
    plain.assert_outcomes(passed=2, warnings=1)
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:randomly", *args)
    result.assert_outcomes(failed=2, warnings=1)  # the first run's DeprecationWarning, once
    result.stdout.no_fnmatch_line("*run twice*")
    # the filters still apply to a run again: one that makes the warning an error fails it
    erring = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:randomly", *args, "-W", "error::UserWarning")
    erring.assert_outcomes(failed=1, passed=1, warnings=1)
    erring.stdout.fnmatch_lines(["*run 2 of * failed*UserWarning: run twice*"])


def test_repeated_runs_give_the_same_classes_under_xdist(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_it=SUITE)
    found = {}
    for name, extra in (("plain", []), ("parallel", ["-n", "2"])):
        pytester.runpytest_subprocess(
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
            "--vramleak",
            "--vramleak-repeat=10",
            f"--vramleak-report={name}.json",
            *extra,
        )
        tests = json.loads((pytester.path / f"{name}.json").read_text())["tests"]
        found[name] = {t["nodeid"]: (t["pattern"], t["verdict"], t["repetitions"]) for t in tests}
    assert found["parallel"] == found["plain"]
    assert len(found["plain"]) == len(PATTERNS)


def test_the_html_report_charts_memory_after_each_run(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import torch

        KEPT = []

        def test_grows():
            KEPT.append(torch.ones(64))
        """
    )
    pytester.runpytest("-p", "no:cacheprovider", "--vramleak", "--vramleak-repeat=5", "--vramleak-report=r.html")
    page = (pytester.path / "r.html").read_text()
    assert 'aria-label="memory after each run of test_it.py::test_grows"' in page
    assert "2 warm-up runs shaded, 3 measured; pattern: grows" in page
    assert '<span class="pattern">grows</span>' in page


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--vramleak-repeat=3"],
            "--vramleak-repeat: 3 runs leave 1 measured after 2 warm-up runs; at least 2 are needed*",
        ),
        (["--vramleak-repeat=0"], "--vramleak-repeat: expected a whole number of runs >= 1, got '0'"),
        (["--vramleak-confirm=1"], "--vramleak-confirm: at least 2 re-runs are needed*"),
        (["--vramleak-confirm=x"], "--vramleak-confirm: expected a whole number of re-runs >= 0, got 'x'"),
        (["--vramleak-fail-on=leaks"], "--vramleak-fail-on: expected significant, growth or any, got 'leaks'"),
        (
            ["--vramleak-fail-on=growth", "--vramleak-confirm=0"],
            "--vramleak-fail-on=growth tells growth from memory kept once by running a leaking test again*",
        ),
    ],
)
def test_bad_repeat_options_are_usage_errors(pytester: pytest.Pytester, args: list[str], message: str) -> None:
    pytester.makepyfile(test_it="def test_it(): pass")
    result = pytester.runpytest("-p", "no:cacheprovider", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{message}"])


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("'ten'", "expected a whole number of runs >= 1, got 'ten'"),
        ("3", "3 runs leave 1 measured after 2 warm-up runs*"),
    ],
)
def test_a_bad_marker_repeat_is_a_usage_error(pytester: pytest.Pytester, value: str, message: str) -> None:
    pytester.makepyfile(
        test_it=f"""
        import pytest

        @pytest.mark.vram_budget(repeat={value})
        def test_it():
            pass
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*test_it.py::test_it: @pytest.mark.vram_budget(repeat=...): {message}"])


def test_memory_replaced_on_every_run_is_kept_once_not_growth(
    pytester: pytest.Pytester, run_checked, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Run again however long its run takes on a busy machine (a slow case is judged by what its
    # parametrize values keep, without running again: the next test).
    monkeypatch.setattr("pytest_vramleak.plugin.runs.SLOW_RUN_SECONDS", float("inf"))
    pytester.makepyfile(
        test_it="""
        import pytest
        import torch

        class Holder:
            value = None

        @pytest.mark.parametrize("metric", [Holder()])
        def test_replaces_what_it_keeps(metric):
            metric.value = torch.ones(2)  # each run replaces the one tensor held
        """
    )
    result, report = run_checked("--vramleak", "--vramleak-confirm=3", "--vramleak-fail-on=growth")
    result.assert_outcomes(passed=1)
    entry = report["test_replaces_what_it_keeps[metric0]"]
    assert (entry["pattern"], entry["repetitions"]) == ("kept_once", [8, 8, 8])


def test_a_slow_case_kept_only_in_its_parameters_is_kept_once_in_the_report(
    pytester: pytest.Pytester, run_checked, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("pytest_vramleak.plugin.runs.SLOW_RUN_SECONDS", 0.0)
    pytester.makepyfile(
        test_it="""
        import pytest
        import torch

        class Holder:
            value = None

        @pytest.mark.parametrize("metric", [Holder()])
        def test_replaces_what_it_keeps(metric):
            metric.value = torch.ones(2)
        """
    )
    result, report = run_checked("--vramleak", "--vramleak-confirm=3", "--vramleak-fail-on=growth")
    result.assert_outcomes(passed=1)
    entry = report["test_replaces_what_it_keeps[metric0]"]
    assert (entry["pattern"], entry["repetitions"]) == ("kept_once", None)
    assert any(note.startswith("kept only in its parametrize values (metric)") for note in entry["notes"])


def test_the_reported_durations_cover_every_run(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import time

        def test_takes_a_while():
            time.sleep(0.05)
        """
    )
    pytester.runpytest("-p", "no:cacheprovider", "--vramleak", "--vramleak-repeat=4", "--junitxml=junit.xml")
    junit = (pytester.path / "junit.xml").read_text()
    seconds = float(junit.split('time="')[2].split('"')[0])  # the testcase's, after the testsuite's
    assert seconds >= 4 * 0.05

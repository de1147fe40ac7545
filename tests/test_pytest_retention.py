"""What pytest itself keeps of a test: log records it drops right after teardown are not the
test's leak; what it keeps for the session (the class instance, record_property values, recorded
warnings) is named as pytest's, with the fix, and is kept once, not growth, when the test runs again."""

from __future__ import annotations

import pytest

from .conftest import read_report


def test_log_records_pytest_drops_after_teardown_are_no_leak(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import logging
        import pytest, torch

        @pytest.mark.vram_budget
        def test_logs_a_tensor():
            logging.getLogger("x").warning("%s", torch.ones(256))

        @pytest.mark.vram_budget
        def test_caplog_keeps_it(caplog):
            logging.getLogger("x").error("%s", torch.ones(256))
            assert caplog.records
        """
    )
    # In a process of its own: inline, the outer test's own log capture would keep the records.
    path = pytester.path / "r.json"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly", f"--vramleak-report={path}")
    result.assert_outcomes(passed=2)
    report = read_report(path)
    assert {name: entry["verdict"] for name, entry in report.items()} == {
        "test_logs_a_tensor": "passed",
        "test_caplog_keeps_it": "passed",
    }
    assert report["test_logs_a_tensor"]["repetitions"] is None  # nothing kept: not run again
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "no:randomly", f"--vramleak-report={path}", "--vramleak-repeat=4"
    )
    result.assert_outcomes(passed=2)
    assert read_report(path)["test_logs_a_tensor"]["repetitions"] == [0, 0, 0, 0]


KEPT_BY_PYTEST = """
import warnings
import pytest, torch

class TensorWarning(UserWarning):
    pass

class TestKeeps:
    def test_sets_self(self):
        self.t = torch.ones(256)

def test_records_a_property(record_property):
    record_property("activations", torch.ones(256))

def test_warns_with_a_tensor():
    warnings.warn(TensorWarning("odd batch", torch.ones(256)))
"""


def test_what_pytest_keeps_for_the_session_is_named_as_pytests(pytester: pytest.Pytester, run_checked) -> None:
    pytester.makepyfile(test_it=KEPT_BY_PYTEST)
    # -W default: the warning is recorded by pytest, as in a suite without -W error
    result, report = run_checked("-p", "no:randomly", "-W", "default", "--vramleak", "--vramleak-fail-on=any")
    result.assert_outcomes(failed=2, passed=1)
    result.stdout.fnmatch_lines(
        [
            "*held by self (the TestKeeps instance pytest keeps until the session ends).t",
            "*diagnosis: pytest keeps each test's class instance until the session ends*(self.t): set it to None in teardown_method*",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "*held by record_property values of test_records_a_property[[]*][[]1]",
            "*diagnosis: pytest keeps every record_property value*",
        ]
    )
    # a warning pytest keeps for its summary is pytest's, as its log records are: set aside, said so
    assert report["test_warns_with_a_tensor"]["verdict"] == "passed"
    assert report["test_warns_with_a_tensor"]["notes"] == [
        "1.0 KiB held only by the warnings pytest recorded, which it keeps with their arguments for the warnings "
        "summary (warn with a string, f'{t.shape}', to let the tensor go): not counted"
    ]
    result.stdout.no_fnmatch_line("*local 'item'*")
    result.stdout.no_fnmatch_line("*<lambda>*")


def test_what_pytest_keeps_once_per_run_is_kept_once_not_growth(pytester: pytest.Pytester, run_checked) -> None:
    pytester.makepyfile(test_it=KEPT_BY_PYTEST)
    result, report = run_checked("-p", "no:randomly", "-W", "default", "--vramleak")
    result.assert_outcomes(passed=3)
    for name in ("test_sets_self", "test_records_a_property", "test_warns_with_a_tensor"):
        assert (report[name]["verdict"], report[name]["pattern"]) == ("passed", "kept_once"), name


FAILING = """
import pytest, torch
CACHE = []

@pytest.mark.vram_budget
def test_fails_holding_a_batch():
    batch = torch.ones(300_000)
    assert batch.sum() == 0

@pytest.mark.vram_budget
def test_fails_holding_activations_with_their_graph():
    activations = [torch.ones(256, 256, requires_grad=True) * 2 for _ in range(4)]
    assert activations[0].sum() == 0

@pytest.mark.vram_budget
def test_fails_and_leaks():
    CACHE.append(torch.ones(300_000))
    assert False, "the body failed"
"""


@pytest.mark.parametrize("rerunfailures", ["-p no:rerunfailures", "-p rerunfailures"])
def test_what_only_a_failures_traceback_holds_is_not_a_leak_whoever_keeps_it(
    pytester: pytest.Pytester, rerunfailures: str
) -> None:
    # pytest-rerunfailures keeps each failure's traceback on its test item, for the session: the
    # failing test's frames and their locals stay alive. That is the failure's, not a leak.
    if "no:" not in rerunfailures:
        pytest.importorskip("pytest_rerunfailures")
    pytester.makepyfile(test_it=FAILING)
    path = pytester.path / "r.json"
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "no:randomly", *rerunfailures.split(), f"--vramleak-report={path}"
    )
    result.assert_outcomes(failed=3)
    report = read_report(path)
    assert report["test_fails_holding_a_batch"]["verdict"] == "passed"
    # the graph behind what the failure's frames hold is theirs too: its saved leaves and its nodes
    assert report["test_fails_holding_activations_with_their_graph"]["verdict"] == "passed"
    assert report["test_fails_and_leaks"]["verdict"] == "leaked"  # its own leak is shown beside its failure
    output = result.stdout.str()
    assert output.count("vramleak: the test also leaked") == 1
    assert "held by test_it.CACHE[0]" in output


def test_a_warning_pytest_keeps_with_a_big_tensor_is_pytests_not_the_tests(
    pytester: pytest.Pytester, run_checked
) -> None:
    pytester.makepyfile(
        test_it="""
        import warnings
        import pytest, torch
        KEPT = []

        @pytest.mark.vram_budget
        def test_warns_with_a_batch():
            warnings.warn(UserWarning("odd batch", torch.ones(300_000)))

        def test_warns_and_keeps():
            batch = torch.ones(300_000)
            KEPT.append(batch)
            warnings.warn(UserWarning("odd batch", batch))
        """
    )
    result, report = run_checked("-p", "no:randomly", "-W", "default", "--vramleak")
    # held by the warning alone: pytest's; held by the test's own list too: the test's
    assert report["test_warns_with_a_batch"]["verdict"] == "passed"
    assert report["test_warns_and_keeps"]["verdict"] == "leaked"
    result.stdout.fnmatch_lines(["*held by test_it.KEPT[[]*[]]"])

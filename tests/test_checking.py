"""Checking a test end to end: its baseline, its fixtures, its own failure, the leak and peak
budgets, the default budget of --vramleak, and what a failure names."""

from __future__ import annotations

import pytest


def test_baseline_excludes_fixtures_that_outlive_or_free_at_teardown(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest, torch

        @pytest.fixture(scope="module")
        def model():
            return torch.nn.Linear(512, 512)

        @pytest.fixture
        def workspace():
            buffers = [torch.ones(1024, 256)]
            yield buffers
            buffers.clear()

        @pytest.mark.vram_budget
        def test_uses_module_model(model):
            assert model(torch.ones(1, 512)).shape == (1, 512)

        @pytest.mark.vram_budget
        def test_fills_function_fixture(workspace):
            workspace.append(torch.ones(1024, 256))  # freed by the fixture's teardown
        """
    )
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=2)


def test_what_a_test_puts_in_a_function_fixture_is_not_its_leak(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest, torch

        @pytest.fixture
        def buffer():
            return []

        @pytest.mark.vram_budget
        def test_fills_fixture(buffer):
            buffer.append(torch.ones(1024, 256))
        """
    )
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_a_failing_test_keeps_its_own_failure(pytester: pytest.Pytester, run_checked) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest, torch
        CACHE = []

        @pytest.mark.vram_budget
        def test_it():
            CACHE.append(torch.ones(1024))
            assert 1 == 2
        """
    )
    result, report = run_checked("-rA")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "E       assert 1 == 2",
            "*- vramleak: the test also leaked -*",
            "leaked 4.0 KiB on cpu, allowed 0 B",
            "*held by test_it.CACHE?0?",
            "FAILED test_it.py::test_it - assert 1 == 2",
        ]
    )
    result.stdout.no_fnmatch_line("*VramLeak*")
    assert report["test_it"]["verdict"] == "leaked"
    assert report["test_it"]["leaked_bytes"] == 4096


def test_every_test_option_and_exemption(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest, torch
        CACHE = []

        def test_leaks():
            CACHE.append(torch.ones(1024))

        @pytest.mark.allow_vram_leak
        def test_exempt():
            CACHE.append(torch.ones(1024))

        def test_clean():
            torch.ones(1024).sum()
        """
    )
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=3)
    result = pytester.runpytest("-p", "no:cacheprovider", "--vramleak")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["LEAKED test_it.py::test_leaks - VramLeak: memory grew 4.0 KiB per run of the*"])
    pytester.makeini("[pytest]\nvramleak = true\n")
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=2, failed=1)


def test_allow_vram_leak_allows_the_step_checks_of_its_test_too(pytester: pytest.Pytester, run_checked) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest, torch
        HISTORY = []

        @pytest.mark.allow_vram_leak
        def test_allowed(vramleak):
            for _ in vramleak.steps(8):
                HISTORY.append(torch.ones(1024))

        @pytest.mark.allow_vram_leak
        def test_allowed_and_left_early(vramleak):
            for step in vramleak.steps(8):
                HISTORY.append(torch.ones(1024))
                if step == 5:
                    break

        def test_not_allowed(vramleak):
            for _ in vramleak.steps(8):
                HISTORY.append(torch.ones(1024))
        """
    )
    result, report = run_checked("--vramleak", "-p", "no:randomly")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["FAILED test_it.py::test_not_allowed - VramLeak: memory grew 4.0 KiB per step*"])
    for name in ("test_allowed", "test_allowed_and_left_early"):
        entry = report[name]
        # the record says the step check grew, and that the marker allowed it
        assert (entry["verdict"], entry["step_verdict"]) == ("unchecked", "leaked"), entry
        assert entry["reason"].startswith("allowed by @pytest.mark.allow_vram_leak: memory grew 4.0 KiB per step"), (
            entry
        )
    assert report["test_not_allowed"]["verdict"] == "leaked"


def test_leak_budget_and_peak_budget(pytester: pytest.Pytester, run_checked) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest, torch
        from pytest_vramleak import vram_budget
        CACHE = []

        @vram_budget(leak="8 KiB")
        def test_within_leak_budget():
            CACHE.append(torch.ones(1024))

        @vram_budget("1 MiB")
        def test_over_peak():
            scratch = torch.ones(1024, 1024)
            del scratch

        @pytest.mark.vram_budget(peak="8 MiB")
        def test_within_peak():
            scratch = torch.ones(1024, 1024)
            del scratch
        """
    )
    result, report = run_checked()
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        [
            "peaked at 4.0 MiB above baseline on cpu, allowed 1.0 MiB",
            "OVER BUDGET test_it.py::test_over_peak - VramLeak: peaked at 4.0 MiB*",
        ]
    )
    assert report["test_within_leak_budget"]["verdict"] == "passed"
    assert report["test_within_leak_budget"]["leaked_bytes"] == 4096
    assert report["test_over_peak"]["verdict"] == "over_budget"
    assert report["test_over_peak"]["peak_bytes"] == 4 * 1024**2
    assert report["test_within_peak"]["verdict"] == "passed"


def test_a_default_leak_budget_for_tests_checked_by_vramleak(pytester: pytest.Pytester, run_checked) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest, torch
        CACHE = {}

        def test_caches_a_result():
            CACHE["mean"] = torch.ones(4)  # 16 B kept, as a metric caches compute()

        def test_leaks():
            CACHE["features"] = torch.ones(1024)

        @pytest.mark.vram_budget  # its own marker: no leak allowed
        def test_marked():
            CACHE["marked"] = torch.ones(4)
        """
    )
    # Every leak past the budget fails (--vramleak-fail-on=any): the budget decides alone.
    result, report = run_checked("-p", "no:randomly", "--vramleak", "--vramleak-leak=64 B", "--vramleak-fail-on=any")
    assert {name: entry["verdict"] for name, entry in report.items()} == {
        "test_caches_a_result": "passed",
        "test_leaks": "leaked",
        "test_marked": "leaked",
    }
    assert report["test_caches_a_result"]["budget"] == {"peak": None, "leak": 64}
    pytester.makeini("[pytest]\nvramleak = true\nvramleak_leak = 8 KiB\nvramleak_fail_on = any\n")
    result, report = run_checked("-p", "no:randomly")
    assert report["test_leaks"]["verdict"] == "passed"
    # By default a test without a marker fails for memory kept once only from the floor on.
    pytester.makeini("[pytest]\nvramleak = true\n")
    result, report = run_checked("-p", "no:randomly", "--vramleak-leak=64 B")
    assert (report["test_leaks"]["verdict"], report["test_leaks"]["pattern"]) == ("passed", "kept_once")


def test_the_headline_agrees_with_the_tensors_listed(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest, torch
        TABLE = {"old": torch.ones(64)}

        @pytest.mark.vram_budget
        def test_replaces_and_adds():
            TABLE["old"] = torch.ones(64)  # 256 B made, 256 B of older memory freed
            TABLE["new"] = torch.ones(4)  # 16 B more
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(
        [
            "leaked 16 B on cpu, allowed 0 B (272 B made and still alive, 256 B of older memory freed)",
            "*",
            "leaked tensors:",
            "float32[[]64] on cpu: 1 tensor, 256 B",
            "*",
            "float32[[]4] on cpu: 1 tensor, 16 B",
        ]
    )


def test_a_tensor_subclass_is_named(pytester: pytest.Pytester, run_checked) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest, torch

        class Quantity(torch.Tensor):
            pass

        KEPT = []

        @pytest.mark.vram_budget
        def test_it():
            KEPT.append(torch.ones(8).as_subclass(Quantity))
            KEPT.append(torch.nn.Parameter(torch.ones(4)))
        """
    )
    result, report = run_checked()
    result.stdout.fnmatch_lines(
        ["float32[[]8] Quantity on cpu: 1 tensor, 32 B", "*", "float32[[]4] Parameter on cpu: 1 tensor, 16 B"]
    )
    assert sorted(group["class"] for group in report["test_it"]["tensors"]) == ["Parameter", "Quantity"]


def test_a_named_leak_is_freed_as_soon_as_the_user_drops_it(pytester: pytest.Pytester) -> None:
    # Naming holders must leave no reference to the tensors behind, not even in cyclic garbage.
    pytester.makepyfile(
        test_it="""
        import weakref
        import torch

        class Holder:
            value = None

        def test_leaks():
            Holder.value = torch.ones(2)

        def test_drops_it():
            ref = weakref.ref(Holder.value)
            Holder.value = None
            assert ref() is None
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:randomly", "--vramleak", "--vramleak-fail-on=any")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["LEAKED test_it.py::test_leaks - *"])

"""CUDA budgets beyond allocated bytes, through the fake device: memory reserved by the caching
allocator, reserved-but-unallocated memory that grows across steps (fragmentation), and pinned
host memory."""

from __future__ import annotations

import pytest

MIB = 1024 * 1024


def test_a_reserved_budget_fails_a_test_that_reserves_more(
    pytester: pytest.Pytester, fake_cuda_plugin, run_checked
) -> None:
    fake_cuda_plugin()
    pytester.makepyfile(
        test_it="""
        import pytest
        from vramleak_fake_cuda import CUDA

        @pytest.mark.vram_budget(reserved="16 MiB")
        def test_reserves_a_big_segment():
            CUDA.reserve(0, 64 * 1024 * 1024)

        @pytest.mark.vram_budget(reserved="16 MiB")
        def test_reserves_a_small_one():
            CUDA.reserve(0, 4 * 1024 * 1024)
        """
    )
    result, report = run_checked("-p", "no:randomly")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "memory reserved by the caching allocator peaked at 64.0 MiB above its level at the start on cuda:0, allowed 16.0 MiB"
        ]
    )
    assert report["test_reserves_a_big_segment"]["verdict"] == "over_budget"
    assert report["test_reserves_a_big_segment"]["details"]["reserved_peak_bytes"] == 64 * MIB
    assert report["test_reserves_a_small_one"]["verdict"] == "passed"


def test_reserved_memory_that_grows_while_allocated_memory_does_not_is_fragmentation(
    pytester: pytest.Pytester, fake_cuda_plugin
) -> None:
    fake_cuda_plugin()
    pytester.makepyfile(
        test_it="""
        from vramleak_fake_cuda import CUDA

        def test_fragmenting(vramleak):
            for step in vramleak.steps(8):
                CUDA.allocate(0, 1024 * 1024)
                CUDA.free(0, 1024 * 1024)
                CUDA.reserve(0, 2 * 1024 * 1024)  # a new segment each step, the old ones too split to reuse

        def test_steady_cache(vramleak):
            for step in vramleak.steps(8):
                CUDA.allocate(0, 1024 * 1024)
                CUDA.free(0, 1024 * 1024)
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "memory reserved but not allocated grew 2.0 MiB per step over 6 measured steps (12.0 MiB in total) on cuda:0, while allocated memory did not*",
        ]
    )
    result.stdout.fnmatch_lines(["*expandable_segments:True*"])


def test_pinned_host_memory_is_counted_and_budgeted(pytester: pytest.Pytester, fake_cuda_plugin, run_checked) -> None:
    cuda = fake_cuda_plugin()
    pytester.makepyfile(
        test_it="""
        import pytest
        from vramleak_fake_cuda import CUDA

        @pytest.mark.vram_budget
        def test_keeps_a_pinned_buffer():
            CUDA.pin(8 * 1024 * 1024)

        @pytest.mark.vram_budget
        def test_frees_its_pinned_buffer():
            CUDA.pin(8 * 1024 * 1024)
            CUDA.pin(-8 * 1024 * 1024)

        @pytest.mark.vram_budget(pinned="1 MiB")
        def test_pins_too_much_at_once():
            CUDA.pin(8 * 1024 * 1024)
            CUDA.pin(-8 * 1024 * 1024)
        """
    )
    result, report = run_checked("-p", "no:randomly")
    assert {name: entry["verdict"] for name, entry in report.items()} == {
        "test_keeps_a_pinned_buffer": "leaked",
        "test_frees_its_pinned_buffer": "passed",
        "test_pins_too_much_at_once": "over_budget",
    }
    result.stdout.fnmatch_lines(["leaked 8.0 MiB of pinned host memory (torch.cuda.host_memory_stats), allowed 0 B*"])
    result.stdout.fnmatch_lines(
        ["pinned host memory peaked at 8.0 MiB above its level at the start on cuda:0, allowed 1.0 MiB"]
    )
    assert report["test_keeps_a_pinned_buffer"]["details"]["pinned_host_leaked_bytes"] == 8 * MIB
    assert cuda.pinned[0] == 8 * MIB


def test_reserved_and_pinned_budgets_are_not_checked_on_cpu(pytester: pytest.Pytester, run_checked) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest

        @pytest.mark.vram_budget(reserved="1 MiB", pinned="1 MiB")
        def test_on_cpu():
            pass
        """
    )
    result, report = run_checked()
    result.assert_outcomes(passed=1)
    assert report["test_on_cpu"]["verdict"] == "passed"


def test_a_bad_reserved_budget_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest

        @pytest.mark.vram_budget(reserved="lots")
        def test_it():
            pass
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*@pytest.mark.vram_budget(reserved='lots'): *"])

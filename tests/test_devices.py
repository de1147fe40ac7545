from __future__ import annotations

import pytest

from .fakes import MIB


def test_plugin_checks_a_cuda_device_through_the_fake(pytester: pytest.Pytester, fake_cuda_plugin) -> None:
    cuda = fake_cuda_plugin()
    cuda.allocate(0, 8 * MIB)
    cuda.free(0, 8 * MIB)  # cached, so the leak below comes from the allocator's cache
    pytester.makepyfile(
        test_it="""
        import pytest
        from vramleak_fake_cuda import CUDA

        @pytest.mark.vram_budget
        def test_leaks():
            CUDA.allocate(0, 4 * 1024 * 1024)

        @pytest.mark.vram_budget
        def test_loads_kernels():
            CUDA.driver_extra[0] = 64 * 1024 * 1024
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "leaked 4.0 MiB on cuda:0, allowed 0 B",
            "first run: before set-up 0 B, after teardown 4.0 MiB (the test kept 4.0 MiB), peak during the call 4.0 MiB, reserved by the caching allocator 8.0 MiB",
            "driver-level usage grew 0 B: the allocator served the leaked tensors from memory it had cached*",
            "4.0 MiB reserved but not allocated: blocks the caching allocator keeps for reuse*",
            "leaked tensors:",
            "no live tensor accounts for it*",
        ]
    )


def test_plugin_measures_every_cuda_device(pytester: pytest.Pytester, fake_cuda_plugin) -> None:
    fake_cuda_plugin(devices=2)
    pytester.makepyfile(
        test_it="""
        import pytest
        from vramleak_fake_cuda import CUDA

        @pytest.mark.vram_budget
        def test_leaks_on_the_second_gpu():
            CUDA.allocate(1, 2 * 1024 * 1024)

        @pytest.mark.vram_budget
        def test_clean():
            pass
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["leaked 2.0 MiB on cuda:1, allowed 0 B"])


def test_an_accelerator_check_without_growth_reads_no_tensor(
    pytester: pytest.Pytester, fake_cuda_plugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The allocator's counters are the cheap signal: a tensor is read only to name a leak."""
    from pytest_vramleak.tracking.index import Index

    reads: list[str] = []
    original = Index.read_tensor
    monkeypatch.setattr(Index, "read_tensor", lambda self, *args: reads.append("read") or original(self, *args))
    fake_cuda_plugin()
    pytester.makepyfile(
        test_it="""
        import pytest, torch
        from vramleak_fake_cuda import CUDA
        TABLE = [torch.ones(8) for _ in range(100)]

        @pytest.mark.vram_budget
        @pytest.mark.parametrize("n", range(3))
        def test_allocates_and_frees(n):
            scratch = torch.ones(1024)  # the test makes tensors and drops them
            CUDA.allocate(0, 4096)
            CUDA.free(0, 4096)

        @pytest.mark.vram_budget
        def test_leaks():
            CUDA.allocate(0, 4096)
        """
    )
    pytester.runpytest("-p", "no:cacheprovider", "-p", "no:randomly", "-k", "allocates").assert_outcomes(passed=3)
    assert reads == []
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:randomly", "-k", "leaks")
    result.assert_outcomes(failed=1)
    assert reads  # naming the leak reads the tensors

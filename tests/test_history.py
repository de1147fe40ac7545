"""The CUDA allocator history, driven through a fake ``torch.cuda.memory``."""

from __future__ import annotations

import pytest


def test_trace_saves_a_snapshot_for_a_leaking_cuda_test(pytester: pytest.Pytester, fake_cuda_plugin) -> None:
    cuda = fake_cuda_plugin()
    pytester.makepyfile(
        test_it="""
        import pytest
        from vramleak_fake_cuda import CUDA

        @pytest.mark.vram_budget
        def test_leaks():
            CUDA.allocate(0, 1024)

        @pytest.mark.vram_budget
        def test_clean():
            pass
        """
    )
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "-p", "no:randomly", "--vramleak-trace", "--vramleak-report=out/r.json"
    )
    result.assert_outcomes(passed=1, failed=1)
    snapshot = pytester.path / "out" / "vramleak-traces" / "test_it.py_test_leaks.pickle"
    result.stdout.fnmatch_lines([f"allocator history saved to {snapshot} (open it in https://pytorch.org/memory_viz)"])
    assert snapshot.exists()
    assert [p.name for p in snapshot.parent.iterdir()] == [snapshot.name]  # none for the clean test
    assert cuda.memory.calls == ["all", None, "all", None]

from __future__ import annotations

import pytest

from pytest_vramleak.meters.release import ReleaseScheduler

from .fakes import GIB, FakeCuda


@pytest.mark.parametrize(
    ("args", "ini", "message"),
    [
        (
            ["--vramleak-release-above=most"],
            "",
            "ERROR: --vramleak-release-above: expected a percentage such as '80%', got 'most'",
        ),
        (
            [],
            "vramleak_release_above = 150%",
            "ERROR: ini option vramleak_release_above: expected a percentage above 0% and at most 100%, got '150%'",
        ),
    ],
)
def test_bad_release_threshold_is_a_usage_error(
    pytester: pytest.Pytester, args: list[str], ini: str, message: str
) -> None:
    pytester.makeini(f"[pytest]\n{ini}\n")
    pytester.makepyfile(test_it="def test_it():\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_scheduler_runs_between_tests_and_reports(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    cuda = FakeCuda(total=10 * GIB)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    import pytest_vramleak.plugin.session as plugin

    monkeypatch.setattr(plugin, "ReleaseScheduler", lambda backend, fraction: ReleaseScheduler(cuda, fraction))
    import sys
    import types

    shared = types.ModuleType("vramleak_fake_cuda")
    shared.CUDA = cuda  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vramleak_fake_cuda", shared)
    pytester.makepyfile(
        test_it="""
        from vramleak_fake_cuda import CUDA

        def test_big():
            CUDA.allocate(0, 9 * 1024**3)
            CUDA.free(0, 9 * 1024**3)

        def test_small():
            pass
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:randomly", "--vramleak-release-above=80%")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        ["*= vramleak summary =*", "released the CUDA caching allocator's cache 1 times between tests, 9.0 GiB in all*"]
    )

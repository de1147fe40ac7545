from __future__ import annotations

import pytest

from pytest_vramleak.meters.release import PercentError, ReleaseScheduler, parse_percent

from .fakes import FakeCuda

GIB = 1024**3


@pytest.mark.parametrize(("text", "fraction"), [("80%", 0.8), ("80", 0.8), (" 12.5 % ", 0.125), ("100%", 1.0)])
def test_parse_percent(text: str, fraction: float) -> None:
    assert parse_percent(text) == fraction


@pytest.mark.parametrize("text", ["0%", "-5%", "101%", "most", ""])
def test_parse_percent_rejects(text: str) -> None:
    with pytest.raises(PercentError):
        parse_percent(text)


def test_releases_only_over_the_threshold_and_counts() -> None:
    cuda = FakeCuda(devices=2, total=10 * GIB)
    scheduler = ReleaseScheduler(cuda, 0.8)
    cuda.allocate(1, 7 * GIB)
    cuda.free(1, 7 * GIB)  # 7 GiB cached on device 1: under 80%
    assert scheduler.between_tests() == 0
    cuda.allocate(1, 9 * GIB)
    cuda.free(1, 6 * GIB)  # 9 GiB reserved, 3 GiB still allocated
    assert scheduler.between_tests() == 6 * GIB
    assert cuda.reserved[1] == 3 * GIB
    assert (scheduler.releases, scheduler.released_bytes) == (1, 6 * GIB)


def test_never_touches_an_uninitialised_cuda() -> None:
    cuda = FakeCuda(initialized=False)
    cuda.reserved[0] = cuda.total
    assert ReleaseScheduler(cuda, 0.5).between_tests() == 0


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

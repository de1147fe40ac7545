"""Releasing the CUDA caching allocator's cache between tests: the threshold, and when a release happens."""

from __future__ import annotations

import pytest

from pytest_vramleak.meters.release import PercentError, ReleaseScheduler, parse_percent

from ...fakes import GIB, FakeCuda


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

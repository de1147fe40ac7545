"""Report files are replaced in one step: an interrupted write leaves the old report whole, and no debris."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from pytest_vramleak import report
from pytest_vramleak.report import write_text_atomically


class Interrupted(BaseException):
    pass


def test_an_interrupted_write_leaves_the_old_report_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "r.html"
    target.write_text("the old report\n")
    real_fdopen = os.fdopen

    class HalfWriter(io.TextIOWrapper):
        def write(self, text: str) -> int:
            super().write(text[: len(text) // 2])
            self.flush()
            raise Interrupted  # as if Ctrl-C arrived mid-write

    def fdopen(handle: int, mode: str = "r", *args: object, **kwargs: object) -> io.TextIOWrapper:
        return HalfWriter(real_fdopen(handle, "wb"))

    monkeypatch.setattr(report.os, "fdopen", fdopen)
    with pytest.raises(Interrupted):
        write_text_atomically(target, "<!DOCTYPE html>" + "x" * 100_000)
    assert target.read_text() == "the old report\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html"]


def test_a_finished_write_replaces_the_report_and_is_as_readable_as_other_files(tmp_path: Path) -> None:
    target = tmp_path / "out" / "r.json"
    old_mask = os.umask(0o022)
    try:
        write_text_atomically(target, "{}\n")
    finally:
        os.umask(old_mask)
    assert target.read_text() == "{}\n"
    assert target.stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in target.parent.iterdir()) == ["r.json"]

"""Report files are replaced in one step: an interrupted write leaves the old report whole, and no debris."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from pytest_vramleak.reporting import report
from pytest_vramleak.reporting.report import write_text_atomically


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


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("folder", "it is a folder"),
        ("afile/r.json", "*afile is a file, not a folder"),
        ("afile/deeper/r.html", "*afile is a file, not a folder"),
    ],
)
def test_a_report_path_that_can_never_be_written_is_a_usage_error(
    pytester: pytest.Pytester, path: str, problem: str
) -> None:
    (pytester.path / "folder").mkdir()
    (pytester.path / "afile").write_text("")
    pytester.makepyfile(test_it="def test_it():\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider", f"--vramleak-report={path}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: --vramleak-report: cannot write a report to {path}: {problem}"])


def test_a_report_that_cannot_be_written_at_the_end_is_said_and_fails_the_run(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import pathlib, shutil, pytest

        @pytest.mark.vram_budget
        def test_replaces_the_report_folder_with_a_file():
            shutil.rmtree("out", ignore_errors=True)
            pathlib.Path("out").write_text("not a folder any more")
        """
    )
    (pytester.path / "out").mkdir()
    result = pytester.runpytest("-p", "no:cacheprovider", "--vramleak-report=out/r.html", "--vramleak-report=r.json")
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stdout.fnmatch_lines(["vramleak: could not write the HTML report to out/r.html: *Error: *"])
    assert (pytester.path / "r.json").exists()  # the other report is still written
    result.stdout.no_fnmatch_line("*INTERNALERROR*")


def test_a_run_that_runs_no_test_does_not_call_a_missing_file_an_earlier_runs(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_it="def test_it():\n    pass\n")
    (pytester.path / "r.html").write_text("the last real run's r.html\n")
    result = pytester.runpytest("--vramleak-report=r.json", "--vramleak-report=r.html", "-k", "nothing")
    result.stdout.fnmatch_lines(
        [
            "vramleak: no test ran, so no file was written: r.html is from an earlier run, left as it was; r.json was not made"
        ]
    )
    assert not (pytester.path / "r.json").exists()


@pytest.mark.parametrize(
    "args",
    [("--collect-only",), ("-k", "matches_no_test"), ("test_broken.py",)],
    ids=["collect-only", "nothing-selected", "collection-error"],
)
def test_a_run_that_runs_no_test_leaves_every_report_as_it_was(
    pytester: pytest.Pytester, args: tuple[str, ...]
) -> None:
    pytester.makepyfile(test_it="def test_it():\n    pass\n", test_broken="import no_such_module_here\n")
    pytester.makeini("[pytest]\nvramleak_save = last\n")
    files = {name: f"the last real run's {name}\n" for name in ("r.json", "r.html", "bench.json", "summary.md")}
    for name, text in files.items():
        (pytester.path / name).write_text(text)
    saved = pytester.path / ".vramleak" / "last.json"
    saved.parent.mkdir()
    saved.write_text("the last saved run\n")
    outputs = [
        "--vramleak-report=r.json",
        "--vramleak-report=r.html",
        "--vramleak-benchmark-json=bench.json",
        "--vramleak-markdown=summary.md",
    ]
    result = pytester.runpytest("--vramleak", *outputs, *args)
    result.stdout.fnmatch_lines(
        [
            "vramleak: no test ran, so no file was written: r.json, r.html, bench.json, summary.md, .vramleak/last.json "
            "are from an earlier run, left as they were"
        ]
    )
    result.stdout.no_fnmatch_line("vramleak: wrote*")
    assert {name: (pytester.path / name).read_text() for name in files} == files
    assert saved.read_text() == "the last saved run\n"
    # a run that runs a test writes them, and its summary's last line names each, with -q too
    result = pytester.runpytest("--vramleak", *outputs, "-q", "test_it.py")
    result.assert_outcomes(passed=1)
    lines = result.stdout.lines
    wrote = "vramleak: wrote summary.md, .vramleak/last.json, r.json, r.html, bench.json"
    assert lines[lines.index(wrote) - 1] == "1 checked test: 1 passed; none leaked or went over budget"
    assert lines[lines.index(wrote) + 1].startswith("1 passed")  # pytest's own line comes next
    assert (pytester.path / "r.json").read_text().startswith("{")
    assert saved.read_text().startswith("{")


def test_a_run_that_checks_no_test_replaces_the_files_it_was_asked_for(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_it="def test_it():\n    pass\n")
    for name in ("r.json", "summary.md"):
        (pytester.path / name).write_text(f"the last real run's {name}\n")
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "-q", "--vramleak-report=r.json", "--vramleak-markdown=summary.md"
    )
    result.assert_outcomes(passed=1)
    assert result.stdout.lines[-2:-1] == ["vramleak: wrote summary.md, r.json"]
    assert (pytester.path / "summary.md").read_text() == "## vramleak: 0 checked tests\n"
    assert json.loads((pytester.path / "r.json").read_text())["tests"] == []

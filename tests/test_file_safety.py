"""The plugin never replaces what is not a regular file: a symbolic link stays a link and its target
gets the new content, a FIFO, a device or a folder is refused at start, and a file replaced keeps
its permission bits. (Devices are never used here: a FIFO stands for every file that is not regular.)"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from pytest_vramleak.reporting.report import OutputPathError, output_problem, replacing, write_text_atomically

SUITE = """
import pytest, torch

KEPT = []

@pytest.mark.vram_budget
def test_leaks():
    KEPT.append(torch.ones(256))
"""


def _ignores_permissions() -> bool:
    """Whether this process may write a read-only file (root, unless its capabilities were dropped)."""
    with tempfile.TemporaryDirectory() as folder:
        probe = Path(folder) / "probe"
        probe.touch(mode=0o444)
        return os.access(probe, os.W_OK)


ignores_permissions = _ignores_permissions()

# Each file the plugin writes at the end of a run: the option that names it, the path it is
# written to, and how its new content begins.
OUTPUTS = [
    pytest.param("--vramleak-report=out.json", "out.json", '{\n  "version": 2', id="json report"),
    pytest.param("--vramleak-report=out.html", "out.html", "<!DOCTYPE html>", id="html report"),
    pytest.param(
        "--vramleak-markdown=out.md", "out.md", "## vramleak: 1 checked test: 1 failed; 1 leaked", id="markdown"
    ),
    pytest.param("--vramleak-benchmark-json=out.json", "out.json", "[\n  {", id="benchmark json"),
    pytest.param("--vramleak-save=base", ".vramleak/base.json", '{\n  "version": 1', id="saved run"),
]


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    pytester.makepyfile(test_it=SUITE)
    return pytester.runpytest("-p", "no:cacheprovider", *args)


@pytest.mark.parametrize(("option", "path", "begins"), OUTPUTS)
def test_a_symlink_named_as_an_output_stays_a_link_and_its_target_gets_the_new_content(
    pytester: pytest.Pytester, option: str, path: str, begins: str
) -> None:
    link = pytester.path / path
    link.parent.mkdir(exist_ok=True)
    target = pytester.path / "elsewhere" / "kept.txt"
    target.parent.mkdir()
    target.write_text("the old content\n")
    link.symlink_to(target)
    result = run(pytester, option)
    result.assert_outcomes(failed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text().startswith(begins)
    assert sorted(p.name for p in target.parent.iterdir()) == ["kept.txt"]  # no temporary file left beside it


@pytest.mark.parametrize(("option", "path", "begins"), OUTPUTS)
def test_a_dangling_symlink_named_as_an_output_gets_its_file_made_where_it_points(
    pytester: pytest.Pytester, option: str, path: str, begins: str
) -> None:
    link = pytester.path / path
    link.parent.mkdir(exist_ok=True)
    target = pytester.path / "not" / "there" / "yet.txt"
    link.symlink_to(target)
    result = run(pytester, option)
    result.assert_outcomes(failed=1)
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text().startswith(begins)


@pytest.mark.parametrize(("option", "path", "begins"), OUTPUTS)
def test_a_fifo_named_as_an_output_is_refused_at_start_and_stays_a_fifo(
    pytester: pytest.Pytester, option: str, path: str, begins: str
) -> None:
    fifo = pytester.path / path
    fifo.parent.mkdir(exist_ok=True)
    os.mkfifo(fifo)
    result = run(pytester, option)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    name = option.split("=")[0]
    result.stderr.fnmatch_lines([f"ERROR: {name}: cannot * to *{path}: it is a FIFO, not a regular file"])
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    result.stdout.no_fnmatch_line("*passed*")  # refused before any test ran


@pytest.mark.parametrize(("option", "path", "begins"), OUTPUTS)
def test_a_folder_named_as_an_output_is_refused_at_start(
    pytester: pytest.Pytester, option: str, path: str, begins: str
) -> None:
    (pytester.path / path).mkdir(parents=True)
    result = run(pytester, option)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {option.split('=')[0]}: cannot * to *{path}: it is a folder"])
    assert (pytester.path / path).is_dir()


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        pytest.param(
            lambda path: (os.mkfifo(path.parent / "fifo"), path.symlink_to(path.parent / "fifo")),
            "it links to */fifo, which is a FIFO, not a regular file",
            id="link to a fifo",
        ),
        pytest.param(
            lambda path: ((path.parent / "dir").mkdir(), path.symlink_to(path.parent / "dir")),
            "it links to */dir, which is a folder",
            id="link to a folder",
        ),
        pytest.param(
            lambda path: ((path.parent / "b").symlink_to(path), path.symlink_to(path.parent / "b")),
            "it is a loop of symbolic links",
            id="link loop",
        ),
        pytest.param(lambda path: None, "it ends with a slash, so it names a folder", id="trailing slash"),
    ],
)
def test_what_a_link_leads_to_is_checked_at_start(pytester: pytest.Pytester, make, problem: str) -> None:
    make(pytester.path / "r.json")
    name = "r.json/" if "slash" in problem else "r.json"
    result = run(pytester, f"--vramleak-report={name}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: --vramleak-report: cannot write a report to {name}: {problem}"])


def test_an_output_that_becomes_a_fifo_during_the_run_is_left_alone_and_said(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import os, pytest, torch

        @pytest.mark.vram_budget
        def test_makes_a_fifo_where_the_report_goes():
            os.unlink("r.json")
            os.mkfifo("r.json")
        """
    )
    (pytester.path / "r.json").write_text("{}")
    result = pytester.runpytest("-p", "no:cacheprovider", "--vramleak-report=r.json", "--vramleak-report=r.html")
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stdout.fnmatch_lines(
        [
            "vramleak: could not write the JSON report to r.json: OutputPathError: r.json: it is a FIFO, not a regular file"
        ]
    )
    assert stat.S_ISFIFO((pytester.path / "r.json").lstat().st_mode)
    assert (pytester.path / "r.html").read_text().startswith("<!DOCTYPE html>")  # the other output is still written


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o444])
def test_a_replaced_report_keeps_its_permission_bits(pytester: pytest.Pytester, mode: int) -> None:
    report = pytester.path / "r.json"
    report.write_text("{}")
    report.chmod(mode)
    if mode == 0o444 and not ignores_permissions:
        pytest.skip("only root may replace a read-only report (see test_a_read_only_report_is_refused_at_start)")
    run(pytester, "--vramleak-report=r.json").assert_outcomes(failed=1)
    assert json.loads(report.read_text())["version"] == 2
    assert stat.S_IMODE(report.stat().st_mode) == mode


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="only root may give a file to another user")
def test_a_report_replaced_by_root_keeps_its_owner(tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    report.write_text("{}")
    os.chown(report, 4321, 4321)
    report.chmod(0o666)
    write_text_atomically(report, "[]\n")
    assert report.read_text() == "[]\n"
    assert (report.stat().st_uid, report.stat().st_gid, stat.S_IMODE(report.stat().st_mode)) == (4321, 4321, 0o666)


@pytest.mark.skipif(ignores_permissions, reason="this process may write any file (root)")
def test_a_read_only_report_is_refused_at_start(pytester: pytest.Pytester) -> None:
    report = pytester.path / "r.json"
    report.write_text("{}")
    report.chmod(0o444)
    result = run(pytester, "--vramleak-report=r.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --vramleak-report: cannot write a report to r.json: it is read-only"])
    assert report.read_text() == "{}"


@pytest.mark.skipif(ignores_permissions, reason="this process may write in any folder (root)")
def test_a_report_in_a_read_only_folder_is_refused_at_start(pytester: pytest.Pytester) -> None:
    folder = pytester.path / "locked"
    folder.mkdir()
    (folder / "r.json").write_text("{}")
    folder.chmod(0o555)
    try:
        result = run(pytester, "--vramleak-report=locked/r.json")
    finally:
        folder.chmod(0o755)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: --vramleak-report: cannot write a report to locked/r.json: the folder */locked is not writable"]
    )


def test_the_github_step_summary_is_appended_to_through_a_link(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    summary = pytester.path / "summary.md"
    summary.write_text("earlier step\n")
    (pytester.path / "link.md").symlink_to(summary)
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(pytester.path / "link.md"))
    run(pytester).assert_outcomes(failed=1)
    assert (pytester.path / "link.md").is_symlink()
    assert summary.read_text().startswith("earlier step\n## vramleak: 1 checked test: 1 failed; 1 leaked")


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        pytest.param(os.mkfifo, "it is a FIFO, not a regular file", id="fifo"),
        pytest.param(os.mkdir, "it is a folder", id="folder"),
    ],
)
def test_a_github_step_summary_that_cannot_be_appended_to_is_refused_at_start(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, make, problem: str
) -> None:
    summary = pytester.path / "summary"
    make(summary)
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    result = run(pytester)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [f"ERROR: $GITHUB_STEP_SUMMARY: cannot append the Markdown summary to {summary}: {problem}"]
    )
    # A summary written to a path of its own is not appended to $GITHUB_STEP_SUMMARY: then it does not matter.
    run(pytester, "--vramleak-markdown=summary.md").assert_outcomes(failed=1)


def test_writing_through_a_link_replaces_its_target_in_one_step(tmp_path: Path) -> None:
    target = tmp_path / "real" / "r.json"
    target.parent.mkdir()
    target.write_text("old")
    target.chmod(0o600)
    link = tmp_path / "r.json"
    link.symlink_to(Path("real") / "r.json")  # relative, as `ln -s real/r.json r.json` makes it
    write_text_atomically(link, "new")
    assert link.is_symlink() and os.readlink(link) == os.path.join("real", "r.json")
    assert target.read_text() == "new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "real"]


def test_writing_to_a_fifo_raises_and_leaves_it(tmp_path: Path) -> None:
    fifo = tmp_path / "r.json"
    os.mkfifo(fifo)
    with pytest.raises(OutputPathError, match="r.json: it is a FIFO, not a regular file"):
        write_text_atomically(fifo, "{}")
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_a_binary_stream_replaces_the_file_only_when_its_block_ends_well(tmp_path: Path) -> None:
    import pickle

    target = tmp_path / "snapshot.pickle"
    target.write_bytes(b"old")
    with pytest.raises(ZeroDivisionError), replacing(target, binary=True) as stream:
        stream.write(b"half")
        raise ZeroDivisionError
    assert target.read_bytes() == b"old"
    with replacing(target, binary=True) as stream:
        pickle.dump({"segments": []}, stream)
    assert pickle.loads(target.read_bytes()) == {"segments": []}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["snapshot.pickle"]


def test_appending_accepts_what_replacing_refuses_only_where_nothing_is_replaced(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    assert output_problem(tmp_path / "fifo", append=True) == "it is a FIFO, not a regular file"
    assert output_problem(tmp_path / "new.md", append=True) is None
    assert output_problem(tmp_path / "deeper" / "new.md") is None  # folders are made as needed


def run_merge(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest_vramleak", "merge", *args],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def shard(pytester: pytest.Pytester) -> Path:
    run(pytester, "--vramleak-report=shard.json").assert_outcomes(failed=1)
    return pytester.path


@pytest.mark.parametrize(
    ("make", "args", "message"),
    [
        pytest.param(
            os.mkdir,
            ("--json", "out"),
            "--json out: cannot write the merged report there: it is a folder",
            id="json folder",
        ),
        pytest.param(
            os.mkdir,
            ("--html", "out"),
            "--html out: cannot write the merged report there: it is a folder",
            id="html folder",
        ),
        pytest.param(
            os.mkfifo,
            ("--json", "out"),
            "--json out: cannot write the merged report there: it is a FIFO, not a regular file",
            id="json fifo",
        ),
        pytest.param(
            os.mkfifo,
            ("--html", "out"),
            "--html out: cannot write the merged report there: it is a FIFO, not a regular file",
            id="html fifo",
        ),
        pytest.param(
            None,
            ("--json", "out/"),
            "--json out/: cannot write the merged report there: it ends with a slash, so it names a folder",
            id="slash",
        ),
        pytest.param(
            None,
            ("--json", "same", "--html", "same"),
            "--json and --html name the same file, same: give each its own",
            id="same file",
        ),
    ],
)
def test_a_merge_output_that_cannot_be_written_is_one_line_and_nothing_is_written(
    shard: Path, make, args: tuple[str, ...], message: str
) -> None:
    if make is not None:
        make(shard / "out")
    before = sorted(p.name for p in shard.iterdir())
    # The other output is fine, and still not written: the merge stops before writing anything.
    other = () if len(args) > 2 else ("--html", "fine.html") if args[0] == "--json" else ("--json", "fine.json")
    done = run_merge(shard, "shard.json", *args, *other)
    assert done.returncode == 2
    assert done.stderr == f"pytest-vramleak merge: {message}\n"
    assert done.stdout == ""
    assert sorted(p.name for p in shard.iterdir()) == before
    if make is os.mkfifo:
        assert stat.S_ISFIFO((shard / "out").lstat().st_mode)


def test_a_merge_output_named_by_a_symlink_stays_a_link(shard: Path) -> None:
    (shard / "kept.html").write_text("old")
    (shard / "all.html").symlink_to("kept.html")
    (shard / "kept.json").write_text("old")
    (shard / "all.json").symlink_to("kept.json")
    done = run_merge(shard, "shard.json", "--json", "all.json", "--html", "all.html")
    assert done.returncode == 0, done.stderr
    assert (shard / "all.html").is_symlink() and (shard / "kept.html").read_text().startswith("<!DOCTYPE html>")
    assert (shard / "all.json").is_symlink() and json.loads((shard / "kept.json").read_text())["about"][
        "merged from"
    ] == "shard"


# Two outputs that name one file, however spelt, and the error that names both: the one written
# last would replace the other. ({root} is the test's folder; link.json is a symbolic link to r.json.)
COLLIDING = [
    pytest.param(
        ("--vramleak-report=out.xml", "--junitxml=out.xml"),
        "--vramleak-report=out.xml and --junitxml=out.xml",
        id="report and junitxml",
    ),
    pytest.param(
        ("--vramleak-report=r.json", "--vramleak-benchmark-json=./r.json"),
        "--vramleak-report=r.json and --vramleak-benchmark-json=./r.json",
        id="report and benchmark json",
    ),
    pytest.param(
        ("--vramleak-markdown=s.html", "--vramleak-report={root}/s.html"),
        "--vramleak-report={root}/s.html and --vramleak-markdown=s.html",
        id="markdown and html report",
    ),
    pytest.param(
        ("--vramleak-report=r.json", "--vramleak-report=sub/../r.json"),
        "--vramleak-report=r.json and --vramleak-report=sub/../r.json",
        id="one report twice",
    ),
    pytest.param(
        ("--vramleak-save=base", "--vramleak-report=.vramleak/base.json"),
        "--vramleak-report=.vramleak/base.json and --vramleak-save=base (saved to {root}/.vramleak/base.json)",
        id="saved run and report",
    ),
    pytest.param(
        ("--vramleak-benchmark-json=debug.log", "--debug=debug.log"),
        "--vramleak-benchmark-json=debug.log and --debug=debug.log",
        id="benchmark json and debug log",
    ),
    pytest.param(
        ("--junitxml=r.json", "--vramleak-report=link.json"),
        "--vramleak-report=link.json and --junitxml=r.json",
        id="through a link",
    ),
]


@pytest.mark.parametrize(("args", "named"), COLLIDING)
def test_two_outputs_naming_one_file_are_a_usage_error_at_start(
    pytester: pytest.Pytester, args: tuple[str, ...], named: str
) -> None:
    (pytester.path / "r.json").write_text("a user's file\n")
    (pytester.path / "link.json").symlink_to(pytester.path / "r.json")
    (pytester.path / "sub").mkdir()
    result = run(pytester, *(arg.format(root=pytester.path) for arg in args))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            f"ERROR: {named.format(root=pytester.path)} name the same file: the one written last would replace "
            "the other; give each its own path"
        ]
    )
    result.stdout.no_fnmatch_line("*passed*")  # refused before any test ran
    assert (pytester.path / "r.json").read_text() == "a user's file\n"


@pytest.mark.parametrize(
    ("first", "second", "same"),
    [
        ("r.json", "r.json", True),
        ("r.json", "./r.json", True),
        ("r.json", "sub/../r.json", True),
        ("r.json", "{cwd}/r.json", True),
        ("r.json", "r.json.html", False),
        ("r.json", "sub/r.json", False),
    ],
)
def test_which_paths_name_one_file(
    first: str, second: str, same: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_vramleak.plugin.options import OptionError, no_shared_output

    monkeypatch.chdir(tmp_path)
    outputs = [("--a=" + first, first), ("--b=" + second, second.format(cwd=tmp_path))]
    if same:
        with pytest.raises(OptionError, match=f"^--a={first} and --b=.* name the same file"):
            no_shared_output(outputs)
    else:
        no_shared_output(outputs)


def test_an_output_set_in_the_ini_file_and_junitxml_on_one_file_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nvramleak_report = out.xml\n")
    result = run(pytester, f"--junitxml={pytester.path}/out.xml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [f"ERROR: ini option vramleak_report=out.xml and --junitxml={pytester.path}/out.xml name the same file: *"]
    )


def test_a_report_on_the_github_step_summary_is_a_usage_error(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The report would replace what the job's other steps appended there.
    summary = pytester.path / "summary.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    result = run(pytester, "--vramleak-report=summary.md")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [f"ERROR: --vramleak-report=summary.md and $GITHUB_STEP_SUMMARY={summary} name the same file: *"]
    )
    assert summary.read_text() == "earlier step\n"


def test_outputs_on_files_of_their_own_are_all_written(pytester: pytest.Pytester) -> None:
    result = run(
        pytester,
        "--vramleak-report=r.json",
        "--vramleak-report=r.html",
        "--vramleak-markdown=s.md",
        "--vramleak-benchmark-json=b.json",
        "--vramleak-save=base",
        "--junitxml=r.xml",
    )
    result.assert_outcomes(failed=1)
    for name in ("r.json", "r.html", "s.md", "b.json", ".vramleak/base.json", "r.xml"):
        assert (pytester.path / name).stat().st_size > 0, name

"""A test's own timeout (pytest-timeout) over the runs the plugin adds: each run gets the whole of
it, and a timeout that fires in the plugin's own work ends the check, not the session.

Each run is a process of its own: pytest-timeout's signal method sets SIGALRM's handler, and its
thread method ends the process."""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree

import pytest

from .conftest import read_report

pytest.importorskip("pytest_timeout")

GROWS = """
import time
import torch

KEEP = []

def test_grows():
    time.sleep(0.7)
    KEEP.append(torch.ones(500_000))

def test_after():
    pass
"""


@pytest.mark.parametrize("method", ["signal", "thread"])
def test_each_run_of_a_test_has_its_whole_timeout(pytester: pytest.Pytester, method: str) -> None:
    # Four runs of 0.7 s under one timer of 2 s: its third run timed out (signal: judged on its
    # first run alone as memory kept once; thread: the process ended, no report written).
    pytester.makepyfile(test_it=GROWS)
    report = pytester.path / "r.json"
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "no:randomly", "--timeout=2", f"--timeout-method={method}",
        "--vramleak", f"--vramleak-report={report}",
    )  # fmt: skip
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(["*memory grew 1.9 MiB per run of the test over 3 measured runs on cpu*"])
    result.stdout.no_fnmatch_line("*Timeout*")
    tests = read_report(report)
    assert tests["test_grows"]["verdict"] == "leaked"
    assert tests["test_grows"]["pattern"] == "grows"


@pytest.mark.parametrize(
    ("module", "owner", "name", "while_doing", "frozen"),
    [
        ("pytest_vramleak.plugin.runs", None, "kept_once_already", "running the test again", False),
        # (where the suite froze the heap, sites are captured after the run that records them)
        (
            "pytest_vramleak.tracking.sites",
            "SiteRecorder",
            "capture",
            "running the test again to record where its tensors are made",
            True,
        ),
        ("pytest_vramleak.plugin.runs", None, "_name_runs", "naming what holds the memory the runs kept", False),
    ],
)
def test_a_timeout_in_the_plugins_own_work_ends_its_check_and_the_session_goes_on(
    pytester: pytest.Pytester, module: str, owner: str | None, name: str, while_doing: str, frozen: bool
) -> None:
    pytester.makeconftest(
        f"""
        import gc
        import time
        import {module} as module

        if {frozen!r}:
            gc.freeze()

        owner = getattr(module, {owner!r}) if {owner!r} else module
        slowed = getattr(owner, {name!r})

        def slow(*args, **kwargs):  # longer than the test's timeout: it fires in the plugin's work
            time.sleep(5)
            return slowed(*args, **kwargs)

        setattr(owner, {name!r}, slow)
        """
    )
    pytester.makepyfile(
        test_it="""
        import torch

        KEEP = []

        def test_leaks():
            KEEP.append(torch.ones(500_000))

        def test_after():
            pass
        """
    )
    report, junit = pytester.path / "r.json", pytester.path / "j.xml"
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "no:randomly", "--timeout=1", "--vramleak",
        f"--vramleak-report={report}", f"--junitxml={junit}",
    )  # fmt: skip
    result.stdout.no_fnmatch_line("*INTERNALERROR*")
    assert result.ret == pytest.ExitCode.OK
    result.assert_outcomes(passed=2)
    cut = f"undecided: the check was cut short while {while_doing}: Timeout (>1.0s) from pytest-timeout."
    result.stdout.fnmatch_lines([f"test_it.py::test_leaks: {cut}*"])
    tests = read_report(report)
    assert tests["test_leaks"]["verdict"] == "unchecked"
    assert tests["test_leaks"]["reason"].startswith(cut)
    assert tests["test_after"]["verdict"] == "passed"
    cases = {case.get("name"): case for case in ElementTree.parse(junit).iter("testcase")}
    assert set(cases) == {"test_leaks", "test_after"}
    properties = {p.get("name"): p.get("value") for p in cases["test_leaks"].iter("property")}
    assert properties["vramleak_verdict"] == "unchecked"
    assert properties["vramleak_reason"].startswith(cut)


SLOW_CAPTURE = """
import time
import pytest_vramleak.plugin.runs as runs

captured = runs._capture_as_the_body_ends

def slow(*args, **kwargs):  # longer than the test's timeout
    time.sleep(5)
    return captured(*args, **kwargs)

runs._capture_as_the_body_ends = slow
"""
"""A conftest whose run that records sites captures them only after the test's timeout."""


GROWS_MANY = """
import pathlib
import torch

KEEP = []

def test_grows():
    with pathlib.Path("runs.txt").open("a") as runs:
        runs.write("run\\n")
    KEEP.extend(torch.ones(4) for _ in range(3000))

def test_after():
    pass
"""


@pytest.mark.parametrize(
    ("source", "growth", "runs"),
    [
        (GROWS, "*memory grew 1.9 MiB per run of the test over 3 measured runs on cpu*", None),
        # (the first run kept thousands of storages: its second run again records sites, and where
        # that run fails, an untraced run takes its place)
        (GROWS_MANY, "*memory grew 46.9 KiB per run of the test over 2 measured runs on cpu*", 4),
    ],
)
def test_a_timeout_as_the_recording_runs_body_ends_leaves_the_leak_judged_with_its_sites_unknown(
    pytester: pytest.Pytester, source: str, growth: str, runs: int | None
) -> None:
    """The run that records sites captures them as its body ends, inside that run (which has the
    test's whole timeout): a timeout there fails that run, and the leak stands as the runs before
    it (and, for a run again, the untraced run that takes its place) measured it, where its
    tensors were made said to be not known."""
    pytester.makeconftest(SLOW_CAPTURE)
    pytester.makepyfile(test_it=source)
    report = pytester.path / "r.json"
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "no:randomly", "--timeout=1", "--vramleak", f"--vramleak-report={report}",
    )  # fmt: skip
    result.stdout.no_fnmatch_line("*INTERNALERROR*")
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(
        [growth, "where the tensors were made is not known: the run that records it failed in call"]
    )
    if runs is not None:
        assert (pytester.path / "runs.txt").read_text().count("run") == runs
    tests = read_report(report)
    assert tests["test_grows"]["verdict"] == "leaked"
    assert tests["test_grows"]["pattern"] == "grows"

"""What the reports say happened to each test: pytest's outcome, in pytest's words, beside the leak
check's verdict and the step checks' verdict, the same in the JSON report, JUnit XML, the
Markdown summary, the HTML page and the terminal's headline, for every combination of a body
that passes or fails, a leak or none, a step check that grows, is undecided or passes (with a
leak of the whole test or none), a peak over budget, a skip, an xfail and an xpass (with a leak
or none)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from pytest_vramleak.reporting.schemas import first_problem

from .conftest import Elements

# A loop whose padded batches vary: four measured steps cannot tell growth from noise (as in
# test_noisy_loops), so its step check is undecided.
UNDECIDED = """
import random

def test_steps_undecided(vramleak):
    sampler, generator = random.Random(4), torch.Generator().manual_seed(4)
    torch.manual_seed(4)
    embedding = torch.nn.Embedding(100, 16)
    for step in vramleak.steps(6, warmup=2):
        lengths = [sampler.randint(3, 40) for _ in range(8)]
        ids = torch.zeros(8, max(lengths), dtype=torch.long)
        for row, length in enumerate(lengths):
            ids[row, :length] = torch.randint(1, 100, (length,), generator=generator)
        pooled = embedding(ids).mean(1)
        loss = pooled.pow(2).mean()
        loss.backward()
"""

SUITE = (
    """
import pytest, torch
CACHE = []

@pytest.fixture
def broken():
    raise RuntimeError("the fixture failed")

@pytest.mark.vram_budget
def test_body_passes_no_leak():
    torch.ones(256)

@pytest.mark.vram_budget
def test_body_passes_leaks():
    CACHE.append(torch.ones(256))

@pytest.mark.vram_budget
def test_body_fails_no_leak():
    assert torch.ones(2).sum() == 3

@pytest.mark.vram_budget
def test_body_fails_leaks():
    CACHE.append(torch.ones(256))
    assert False, "the body failed"

def test_steps_grow(vramleak):
    kept = []
    for step in vramleak.steps(6):
        kept.append(torch.ones(256))

def test_steps_pass(vramleak):
    for step in vramleak.steps(6):
        torch.ones(256).sum()

@pytest.mark.vram_budget(peak="1 KiB")
def test_over_budget():
    big = torch.ones(1024, 64)
    del big

@pytest.mark.vram_budget
def test_skipped():
    pytest.skip("not today")

@pytest.mark.vram_budget
@pytest.mark.xfail(reason="known bug")
def test_xfails():
    assert False

@pytest.mark.vram_budget
@pytest.mark.xfail(reason="fixed since")
def test_xpasses():
    torch.ones(256)

@pytest.mark.vram_budget
@pytest.mark.xfail(reason="known bug")
def test_xfails_leaks():
    CACHE.append(torch.ones(256))
    assert False

@pytest.mark.vram_budget
@pytest.mark.xfail(reason="fixed since")
def test_xpasses_leaks():
    CACHE.append(torch.ones(256))

@pytest.mark.vram_budget
def test_set_up_fails(broken):
    pass

@pytest.mark.vram_budget
def test_steps_pass_whole_test_leaks(vramleak):
    for step in vramleak.steps(6):
        torch.ones(256).sum()
    CACHE.append(torch.ones(256))

def test_steps_pass_body_fails(vramleak):
    for step in vramleak.steps(6):
        torch.ones(256).sum()
    assert False, "the body failed"
"""
    + UNDECIDED
    + UNDECIDED.replace(
        "def test_steps_undecided(vramleak):",
        "@pytest.mark.vram_budget\ndef test_steps_undecided_whole_test_leaks(vramleak):",
    )
    + "    CACHE.append(torch.ones(256))\n"
)

# test: (pytest's outcome, verdict, step verdict)
EXPECTED = {
    "test_body_passes_no_leak": ("passed", "passed", None),
    "test_body_passes_leaks": ("failed", "leaked", None),
    "test_body_fails_no_leak": ("failed", "passed", None),
    "test_body_fails_leaks": ("failed", "leaked", None),
    "test_steps_grow": ("failed", "leaked", "leaked"),
    "test_steps_pass": ("passed", "passed", "passed"),
    "test_steps_undecided": ("passed", "unchecked", "undecided"),
    "test_over_budget": ("failed", "over_budget", None),
    "test_skipped": ("skipped", "unchecked", None),
    "test_xfails": ("xfailed", "unchecked", None),
    "test_xpasses": ("xpassed", "passed", None),
    "test_xfails_leaks": ("xfailed", "unchecked", None),
    "test_xpasses_leaks": ("xpassed", "leaked", None),
    "test_set_up_fails": ("error", "unchecked", None),
    "test_steps_pass_whole_test_leaks": ("failed", "leaked", "passed"),
    "test_steps_pass_body_fails": ("failed", "unchecked", "passed"),  # (its failure ends the check)
    "test_steps_undecided_whole_test_leaks": ("failed", "leaked", "undecided"),
}
HEADLINE = (
    "17 checked tests: 8 failed, 3 passed, 1 skipped, 2 xfailed, 2 xpassed, 1 error; "
    "6 leaked, 1 over budget, 6 unchecked, 2 step checks undecided"
)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One run of the suite in a subprocess, with every report: the tests below read its files."""
    folder = tmp_path_factory.mktemp("outcomes")
    (folder / "test_suite.py").write_text(SUITE)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
            "-rA",
            "--junitxml=junit.xml",
            "--vramleak-report=r.json",
            "--vramleak-report=r.html",
            "--vramleak-markdown=summary.md",
            "test_suite.py",
        ],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
    )
    (folder / "stdout.txt").write_text(done.stdout + done.stderr)
    return folder


def test_the_json_report_gives_pytests_outcome_beside_the_verdicts(run: Path) -> None:
    document = json.loads((run / "r.json").read_text())
    found = {
        entry["nodeid"].rsplit("::", 1)[1]: (entry["outcome"], entry["verdict"], entry["step_verdict"])
        for entry in document["tests"]
    }
    assert found == EXPECTED, (run / "stdout.txt").read_text()
    assert document["version"] == 2 and first_problem(document, "report") is None


def test_the_terminal_counts_as_pytest_does_and_its_headline_says_the_same(run: Path) -> None:
    stdout = (run / "stdout.txt").read_text()
    assert re.search(r"=+ 8 failed, 3 passed, 1 skipped, 2 xfailed, 2 xpassed, 1 error in [\d.]+s", stdout), stdout
    assert HEADLINE in stdout.splitlines(), stdout
    assert "not measured" not in stdout  # a CPU failure prints no figure it could not measure
    # a leak does not fail a test pytest counts XPASS: the summary says so
    assert (
        "test_suite.py::test_xpasses_leaks: leaked, and pytest counts it XPASS: a test marked xfail that passes "
        "is not failed for a leak (its holders are in the JSON and HTML reports)"
    ) in stdout.splitlines()
    # pytest's -rA lines give each test the word the reports give it
    words = {"FAILED": "failed", "LEAKED": "failed", "OVER BUDGET": "failed", "PASSED": "passed"}
    words |= {"SKIPPED": "skipped", "XFAIL": "xfailed", "XPASS": "xpassed", "ERROR": "error"}
    said = {
        found.group(2): words[found.group(1)]
        for found in (re.match(rf"({'|'.join(words)}) test_suite.py::(\w+)", line) for line in stdout.splitlines())
        if found
    }
    assert said == {name: outcome for name, (outcome, _, _) in EXPECTED.items() if name != "test_skipped"}
    assert re.search(r"^SKIPPED \[1\] test_suite.py:\d+: not today$", stdout, flags=re.M)  # (-rA names no test id)


def test_junit_properties_give_pytests_outcome_and_the_verdicts(run: Path) -> None:
    cases = {case.get("name"): case for case in ElementTree.parse(run / "junit.xml").iter("testcase")}
    for name, (outcome, verdict, step) in EXPECTED.items():
        properties = {p.get("name"): p.get("value") for p in cases[name].iter("property")}
        expected = {"vramleak_outcome": outcome, "vramleak_verdict": verdict}
        if step is not None:
            expected["vramleak_step_verdict"] = step
        assert {key: properties.get(key) for key in expected} == expected, name
        assert list(properties)[:2] == ["vramleak_outcome", "vramleak_verdict"]


def test_the_markdown_summary_lists_what_did_not_pass_with_both_words(run: Path) -> None:
    text = (run / "summary.md").read_text()
    assert text.startswith(f"## vramleak: {HEADLINE}\n")
    rows = {
        cells[0].strip(" `").rsplit("::", 1)[1]: (cells[1].strip(), cells[2].strip())
        for cells in (line.split("|")[1:-1] for line in text.splitlines() if line.startswith("| `"))
    }
    listed = {
        name: (outcome, verdict.replace("_", " "))
        for name, (outcome, verdict, _) in EXPECTED.items()
        if verdict in ("leaked", "over_budget") or outcome in ("failed", "error", "xpassed")
    }
    assert rows == listed


def test_the_html_page_badges_each_test_with_both_words_and_heads_with_the_same_sentence(run: Path) -> None:
    page = (run / "r.html").read_text()
    elements = Elements(page)
    assert elements.text["p"][0] == HEADLINE
    rows = re.findall(
        r'<tr class="(\w+)"(?: data-failing="")?><td data-value="([^"]+)">.*?'
        r'<span class="badge outcome \w+">(\w+)</span>',
        page,
    )
    found = {nodeid.rsplit("::", 1)[1]: (outcome, verdict) for verdict, nodeid, outcome in rows}
    assert found == {name: (outcome, verdict) for name, (outcome, verdict, _) in EXPECTED.items()}


@pytest.mark.skipif(not hasattr(pytest, "Subtests"), reason="pytest's own subtests fixture came with pytest 9")
def test_a_tests_outcome_is_its_own_not_its_subtests(pytester: pytest.Pytester) -> None:
    # pytest counts subtests apart ("4 failed, 1 passed, 2 subtests passed"); a test whose first
    # subtest passed was counted as "subtests passed" instead of its own outcome.
    pytester.makepyfile(
        test_it="""
        def test_some_fail(subtests):
            for i in range(3):
                with subtests.test(i=i):
                    assert i != 1

        def test_all_pass(subtests):
            with subtests.test("x"):
                pass
        """
    )
    report = pytester.path / "vramleak.json"
    # (pytest gives passed subtests a category of their own at any verbosity but 0)
    result = pytester.runpytest("-q", "-p", "no:cacheprovider", "--vramleak", f"--vramleak-report={report}")
    result.stdout.fnmatch_lines(["2 checked tests: 1 failed, 1 passed; none leaked or went over budget"])
    outcomes = {test["nodeid"]: test["outcome"] for test in json.loads(report.read_text())["tests"]}
    assert outcomes == {"test_it.py::test_some_fail": "failed", "test_it.py::test_all_pass": "passed"}

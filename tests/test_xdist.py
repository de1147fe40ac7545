"""pytest-xdist: the same verdicts as a plain run, and one JSON or HTML report holding every worker's tests."""

from __future__ import annotations

import html
import json
import re
import shutil
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).parent.parent / "examples"


def verdicts(pytester: pytest.Pytester, report: str, *args: str) -> dict[str, str]:
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", f"--vramleak-report={report}", *args)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    tests = json.loads((pytester.path / report).read_text())["tests"]
    nodeids = [t["nodeid"] for t in tests]
    assert len(nodeids) == len(set(nodeids))
    return {t["nodeid"]: (t["outcome"], t["verdict"]) for t in tests}


def test_examples_give_the_same_verdicts_under_xdist(pytester: pytest.Pytester) -> None:
    shutil.copytree(EXAMPLES, pytester.path / "examples")
    plain = verdicts(pytester, "plain.json", "examples")
    parallel = verdicts(pytester, "parallel.json", "-n", "2", "--vramleak-report=parallel.html", "examples")
    assert parallel == plain
    assert sorted(set(plain.values())) == [("failed", "leaked"), ("passed", "passed")]
    # The HTML page, written by the controller, lists every worker's tests once each.
    page = (pytester.path / "parallel.html").read_text()
    rows = re.findall(r'<tr class="(\w+)"(?: data-failing="")?><td data-value="([^"]+)">', page)
    assert sorted(html.unescape(nodeid) for _, nodeid in rows) == sorted(plain)
    assert {html.unescape(nodeid): verdict for verdict, nodeid in rows} == {
        nodeid: verdict for nodeid, (_, verdict) in plain.items()
    }


def test_fixture_leftovers_from_every_worker_reach_the_report(pytester: pytest.Pytester) -> None:
    for name in ("a", "b"):
        pytester.makepyfile(
            **{
                f"test_{name}": f"""
                import pytest, torch

                KEPT = []

                @pytest.fixture(scope="module")
                def table_{name}():
                    KEPT.append(torch.ones(1024))
                    return KEPT[-1]

                def test_uses_table(table_{name}):
                    pass
                """
            }
        )
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--vramleak", "--vramleak-report=r.json", "-n", "2"
    )
    result.assert_outcomes(passed=2)
    fixtures = json.loads((pytester.path / "r.json").read_text())["fixtures"]
    assert sorted((f["fixture"], f["scope"], f["bytes"]) for f in fixtures) == [
        ("table_a", "module", 4096),
        ("table_b", "module", 4096),
    ]
    assert all(f["worker"] in ("gw0", "gw1") for f in fixtures)
    result.stdout.fnmatch_lines(
        [
            "*= vramleak summary =*",
            "fixture 'table_*' (module scope, test_*.py, worker gw?) still holds 4.0 KiB it allocated, after its teardown",
        ]
    )


def test_what_workers_found_between_checks_reaches_the_report(pytester: pytest.Pytester) -> None:
    for name in ("a", "b"):
        pytester.makepyfile(
            **{
                f"test_{name}": """
                import torch

                BUFFERS = [torch.zeros(1) for _ in range(2500)]  # more storages than a check compares

                def test_grows():
                    BUFFERS[0].resize_(1024)
                """
            }
        )
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--vramleak", "--vramleak-report=r.json", "-n", "2"
    )
    result.assert_outcomes(passed=2)
    found = json.loads((pytester.path / "r.json").read_text())["between_checks"]
    assert sorted((f["where"], f["bytes"]) for f in found) == [
        ("test_a.py::test_grows", 4092),
        ("test_b.py::test_grows", 4092),
    ]
    assert all(f["worker"] in ("gw0", "gw1") for f in found)
    result.stdout.fnmatch_lines(
        [
            "*older tensors grew in place or were given gradients, 4.0 KiB on cpu, during test_?.py::test_grows (worker gw?) (this process holds over 2,000 *"
        ]
    )

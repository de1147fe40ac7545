"""pytest-xdist: the same verdicts as a plain run, and one JSON report holding every worker's tests."""

from __future__ import annotations

import json
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
    return {t["nodeid"]: t["outcome"] for t in tests}


def test_examples_give_the_same_verdicts_under_xdist(pytester: pytest.Pytester) -> None:
    shutil.copytree(EXAMPLES, pytester.path / "examples")
    plain = verdicts(pytester, "plain.json", "examples")
    parallel = verdicts(pytester, "parallel.json", "-n", "2", "examples")
    assert parallel == plain
    assert sorted(set(plain.values())) == ["leaked", "passed"]

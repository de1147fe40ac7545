"""One report from several runs: ``python -m pytest_vramleak merge``, and figures for
benchmark-tracking CI actions (``--vramleak-benchmark-json``)."""

from __future__ import annotations

import fnmatch
import json
import subprocess
import sys
from pathlib import Path

import pytest

SUITE = """
import pytest
import torch

KEPT = []

@pytest.mark.vram_budget
def test_leaks():
    KEPT.append(torch.ones(256))

@pytest.mark.vram_budget("1 MiB")
def test_clean():
    torch.ones(1000).sum()

@pytest.mark.vram_budget
def test_also_clean():
    pass
"""


def run_merge(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest_vramleak", "merge", *args],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def shards(pytester: pytest.Pytester) -> Path:
    """Two reports from runs that selected different tests, as two CI machines would write them."""
    pytester.makepyfile(test_it=SUITE)
    pytester.runpytest("-p", "no:cacheprovider", "-k", "leaks", "--vramleak-report=shard-1.json")
    pytester.runpytest("-p", "no:cacheprovider", "-k", "clean", "--vramleak-report=shard-2.json")
    return pytester.path


def test_merging_shards_gives_one_report_that_keeps_each_tests_shard(shards: Path) -> None:
    done = run_merge(shards, "shard-1.json", "shard-2.json", "--json", "all.json", "--html", "all.html")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "pytest-vramleak merge: 3 tests from 2 reports"
    merged = json.loads((shards / "all.json").read_text())
    assert {t["nodeid"].rsplit("::", 1)[1]: (t["shard"], t["verdict"]) for t in merged["tests"]} == {
        "test_leaks": ("shard-1", "leaked"),
        "test_clean": ("shard-2", "passed"),
        "test_also_clean": ("shard-2", "passed"),
    }
    assert merged["about"]["merged from"] == "shard-1, shard-2"
    page = (shards / "all.html").read_text()
    assert page.count('<span class="shard">shard-2</span>') == 2


def test_merging_is_idempotent(shards: Path, pytester: pytest.Pytester) -> None:
    pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-n", "2", "--vramleak-report=xdist.json"
    )  # pytest-xdist merged its workers
    assert len(json.loads((shards / "xdist.json").read_text())["tests"]) == 3
    assert run_merge(shards, "shard-1.json", "xdist.json", "--json", "all.json").returncode == 0
    assert run_merge(shards, "all.json", "all.json", "xdist.json", "--json", "again.json").returncode == 0
    first, again = (json.loads((shards / name).read_text()) for name in ("all.json", "again.json"))
    assert again["tests"] == first["tests"]
    assert run_merge(shards, "xdist.json", "xdist.json", "--json", "self.json").returncode == 0
    alone = json.loads((shards / "self.json").read_text())
    assert [{k: v for k, v in t.items() if k != "shard"} for t in alone["tests"]] == json.loads(
        (shards / "xdist.json").read_text()
    )["tests"]


def test_a_test_in_two_reports_with_different_figures_is_said(shards: Path) -> None:
    other = json.loads((shards / "shard-1.json").read_text())
    other["tests"][0]["leaked_bytes"] = 2048
    (shards / "rerun.json").write_text(json.dumps(other))
    done = run_merge(shards, "shard-1.json", "rerun.json", "--json", "all.json")
    assert done.returncode == 0
    assert (
        "test_it.py::test_leaks is in shard-1.json and rerun.json with different figures (leaked_bytes 1024 and 2048): "
        "kept the one from rerun.json" in done.stderr
    )
    merged = json.loads((shards / "all.json").read_text())
    assert [t["leaked_bytes"] for t in merged["tests"]] == [2048]


def test_a_shard_from_an_interrupted_run_keeps_the_merged_report_marked(shards: Path) -> None:
    shard = json.loads((shards / "shard-1.json").read_text())
    shard["interrupted"] = "the run was interrupted"
    (shards / "shard-1.json").write_text(json.dumps(shard))
    done = run_merge(shards, "shard-1.json", "shard-2.json", "--json", "all.json", "--html", "all.html")
    assert done.returncode == 0, done.stderr
    assert json.loads((shards / "all.json").read_text())["interrupted"] == "shard-1: the run was interrupted"
    assert "<strong>Interrupted</strong>: shard-1: the run was interrupted" in (shards / "all.html").read_text()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            '{"version": 3, "tests": []}',
            "bad.json: report format version 3, this pytest-vramleak reads versions 1 and 2: merge reports written by one of those",
        ),
        ("[1, 2]", "bad.json: not a pytest-vramleak JSON report (no 'tests' list)"),
        ("{", "bad.json: not a JSON report: *"),
    ],
)
def test_a_report_that_cannot_be_merged_is_named(tmp_path: Path, content: str, message: str) -> None:
    (tmp_path / "bad.json").write_text(content)
    done = run_merge(tmp_path, "bad.json", "--json", "all.json")
    assert done.returncode == 2
    assert not (tmp_path / "all.json").exists()
    assert fnmatch.fnmatch(done.stderr.strip(), f"pytest-vramleak merge: {message}")


def test_merge_needs_an_output(tmp_path: Path) -> None:
    done = run_merge(tmp_path, "a.json")
    assert done.returncode == 2
    assert "say where to write the merged report" in done.stderr


BENCHMARK_SCHEMA = {
    "type": "array",
    "items": {
        "type": "object",
        "required": ["name", "unit", "value"],
        "properties": {
            "name": {"type": "string"},
            "unit": {"type": "string"},
            "value": {"type": "number"},
            "range": {"type": "string"},
            "extra": {"type": "string"},
        },
        "additionalProperties": False,
    },
}


def test_benchmark_json_has_the_format_benchmark_actions_chart(pytester: pytest.Pytester) -> None:
    import jsonschema

    pytester.makepyfile(test_it=SUITE)
    pytester.runpytest("-p", "no:cacheprovider", "--vramleak-benchmark-json=bench.json")
    entries = json.loads((pytester.path / "bench.json").read_text())
    jsonschema.validate(entries, BENCHMARK_SCHEMA)
    by_name = {entry["name"]: entry for entry in entries}
    assert by_name["test_it.py::test_leaks leaked (cpu)"] == {
        "name": "test_it.py::test_leaks leaked (cpu)",
        "unit": "bytes",
        "value": 1024,
    }
    assert by_name["test_it.py::test_clean peak (cpu)"]["value"] >= 4000
    assert "test_it.py::test_leaks peak (cpu)" not in by_name  # no peak measured: no figure

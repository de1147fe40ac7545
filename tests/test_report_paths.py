"""Paths in what a run prints and writes are relative to where pytest was invoked, and the figures
and indices of a failure say which run they come from, in every report."""

from __future__ import annotations

import json
import re
import textwrap
import xml.etree.ElementTree as ElementTree

import pytest


def test_a_run_from_a_subfolder_names_files_relative_to_it(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    (pytester.path / "src" / "pkg").mkdir(parents=True)
    (pytester.path / "src" / "pkg" / "__init__.py").write_text("")
    (pytester.path / "src" / "pkg" / "cache.py").write_text(
        textwrap.dedent(
            """
            import torch
            KEPT = []

            def remember():
                KEPT.append(torch.ones(256))
            """
        )
    )
    (pytester.path / "tests").mkdir()
    (pytester.path / "tests" / "test_it.py").write_text(
        textwrap.dedent(
            """
            import sys, pathlib
            sys.path.insert(0, str(pathlib.Path(__file__).parent.parent / "src"))
            import pytest
            from pkg.cache import remember

            @pytest.mark.vram_budget
            def test_remembers():
                remember()
            """
        )
    )
    pytester.makeini("[pytest]\n")
    monkeypatch.chdir(pytester.path / "tests")
    result = pytester.runpytest(
        "-p",
        "no:cacheprovider",
        "--vramleak-report=out/r.json",
        "--vramleak-report=../out/r.html",
        "--vramleak-markdown=summary.md",
        "--junitxml=junit.xml",
        "-q",
    )
    result.assert_outcomes(failed=1)
    site = "../src/pkg/cache.py:6 in remember(), called from test_it.py:9 in test_remembers()"
    # the run's indices are those of the run the text names: the fifth, which recorded the sites
    tensors_from = "run 5, which recorded where tensors are made after the 4 above"
    result.stdout.fnmatch_lines(
        [
            "first run: before set-up *, after teardown * (the test kept 1.0 KiB)",
            f"leaked tensors, as one run leaves them ({tensors_from}), 1.0 KiB in all:",
            "float32[256] on cpu: 1 tensor, 1.0 KiB",
            f"    allocated at {site}",
            "    held by pkg.cache.KEPT[[]4]",
            "     1.0 KiB  test_it.py::test_remembers (cpu, grows)",
            "vramleak: wrote summary.md, out/r.json, ../out/r.html",
        ]
    )
    (entry,) = json.loads((pytester.path / "tests" / "out" / "r.json").read_text())["tests"]
    assert entry["tensors"][0]["allocated_at"] == [site]
    assert (entry["tensors_from"], entry["tensors"][0]["held_by"]) == (tensors_from, ["pkg.cache.KEPT[4]"])
    assert entry["nodeid"] == "tests/test_it.py::test_remembers"  # pytest's id, as JUnit XML and --lf have it
    page = (pytester.path / "out" / "r.html").read_text()
    assert f"<li>allocated at <code>{site}</code></li>" in page
    assert f'<p class="from">tensors left by {tensors_from}, 1.0 KiB in all:</p>' in page
    assert re.search(
        r'<p class="figures">device cpu · first run: baseline [^·]*, leaked 1.0 KiB \(allowed 0 B\) · ', page
    )
    # JUnit XML carries the failure's text as the terminal prints it: the same run, the same paths
    (failure,) = ElementTree.parse(pytester.path / "tests" / "junit.xml").iter("failure")
    text = failure.text or ""
    assert f"leaked tensors, as one run leaves them ({tensors_from}), 1.0 KiB in all:" in text.splitlines()
    assert f"    allocated at {site}" in text.splitlines() and "    held by pkg.cache.KEPT[4]" in text.splitlines()
    assert str(pytester.path) not in text + page + json.dumps(entry)
    summary = (pytester.path / "tests" / "summary.md").read_text()
    assert "| `tests/test_it.py::test_remembers` | failed | leaked |" in summary

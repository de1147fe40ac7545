"""Paths in what a run prints and writes are relative to where pytest was invoked."""

from __future__ import annotations

import json
import textwrap

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
    result = pytester.runpytest("-p", "no:cacheprovider", "--vramleak-report=out/r.json", "-q")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "    allocated at ../src/pkg/cache.py:6 in remember(), called from test_it.py:9 in test_remembers()",
            "     1.0 KiB  test_it.py::test_remembers (cpu, grows)",
            "vramleak: wrote out/r.json",
        ]
    )
    (entry,) = json.loads((pytester.path / "tests" / "out" / "r.json").read_text())["tests"]
    assert entry["tensors"][0]["allocated_at"] == [
        "../src/pkg/cache.py:6 in remember(), called from test_it.py:9 in test_remembers()"
    ]
    assert entry["nodeid"] == "tests/test_it.py::test_remembers"  # pytest's id, as JUnit XML and --lf have it

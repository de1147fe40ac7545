"""The HTML report a run writes (its drawings and table: unit/reporting/; the browser test: test_browser.py)."""

from __future__ import annotations

import json
import re

import pytest

from .conftest import Elements


def test_run_writes_html_and_json_side_by_side(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest, torch
        CACHE = {}

        @pytest.mark.vram_budget
        def test_leaks():
            CACHE["user-42"] = torch.ones(2, 512)

        def test_steps(vramleak):
            kept = []
            for step in vramleak.steps(6):
                kept.append(torch.ones(256))
        """
    )
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "--vramleak-report=out/r.html", "--vramleak-report=out/r.json"
    )
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(
        ["vramleak: device cpu, checking tests marked vram_budget, *, step warm-up 2, report out/r.html, out/r.json"]
    )
    page = (pytester.path / "out" / "r.html").read_text()
    report = json.loads((pytester.path / "out" / "r.json").read_text())
    embedded = json.loads(re.search(r'id="vramleak-data">(.*?)</script>', page, flags=re.S).group(1))  # type: ignore[union-attr]
    assert embedded["tests"] == report["tests"]
    elements = Elements(page)
    # a chart for the steps, one for the leaking test's runs; a graph for each test's holders
    assert len(elements.all("svg", class_="chart")) == 2 and len(elements.all("svg", class_="graph")) == 2
    steps = next(t for t in report["tests"] if t["nodeid"].endswith("test_steps"))
    assert len(steps["warmup_steps"]) == 2 and steps["warmup_steps"][-1] == 0 and len(steps["steps"]) == 4
    assert [group["held_by"] for group in steps["tensors"]] == [[f"test_steps:10 local 'kept'[{n}]" for n in (2, 3, 4)]]
    assert "test_it.CACHE[&#x27;user-42&#x27;]" in page


def test_ini_twin_takes_several_report_paths(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nvramleak_report = a.html b.json\n")
    pytester.makepyfile(test_it="import pytest\n\n@pytest.mark.vram_budget\ndef test_it():\n    pass\n")
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)
    assert (pytester.path / "a.html").read_text().startswith("<!DOCTYPE html>")
    assert json.loads((pytester.path / "b.json").read_text())["tests"][0]["verdict"] == "passed"

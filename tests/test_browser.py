"""The HTML report in a real headless browser: it loads without errors, and its chart, graph and table work.

Needs Chromium and ChromeDriver (Debian: ``apt-get install chromium chromium-driver``) and the
``selenium`` package from the ``test`` extra. Without them these tests skip, unless
``VRAMLEAK_BROWSER_TESTS=require`` is set (as ``.ci/run`` does), which makes a missing browser a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
# Flags for a sandboxed, offline machine: without the networking ones Chromium keeps trying to
# reach Google's services and logs every refused connection.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,1000",
)


def _missing(reason: str) -> None:
    if os.environ.get("VRAMLEAK_BROWSER_TESTS") == "require":
        pytest.fail(f"VRAMLEAK_BROWSER_TESTS=require, but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    binary = next((found for name in BROWSERS if (found := shutil.which(name))), None)
    driver_path = shutil.which("chromedriver")
    if binary is None or driver_path is None:
        _missing("Chromium and ChromeDriver are not installed (apt-get install chromium chromium-driver)")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        _missing("selenium is not installed (pip install -e '.[test]')")
    options = webdriver.ChromeOptions()
    options.binary_location = binary  # type: ignore[assignment]
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(driver_path))
    try:
        yield driver
    finally:
        driver.quit()


def errors(driver: Any) -> list[str]:
    """What the page logged as errors: uncaught exceptions, failed loads, console.error."""
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def test_the_error_check_sees_a_broken_page(browser: Any, tmp_path: Path) -> None:
    page = tmp_path / "broken.html"
    page.write_text("<!DOCTYPE html><title>broken</title><script>undefinedFunction();</script>")
    browser.get(page.as_uri())
    # Chromium hands its console log over asynchronously: wait for the entry, so that it is read
    # here and not by the next test's check.
    seen: list[str] = []
    deadline = time.monotonic() + 10
    while not any("undefinedFunction" in message for message in seen) and time.monotonic() < deadline:
        seen += errors(browser)
        time.sleep(0.05)
    assert any("undefinedFunction" in message for message in seen)


@pytest.fixture(scope="module", params=["one run", "two shards merged"])
def report_page(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A report written by a real run: a cache leak, a hook leak, a growing loop and a quiet test;
    or the same tests run as two shards that selected different tests, merged into one page."""
    folder = tmp_path_factory.mktemp("report")
    (folder / "test_suite.py").write_text(
        """
import pytest, torch

CACHE = {}
MODELS = []

@pytest.mark.vram_budget(leak="1 KiB")
def test_cache():
    for user in ("a", "b", "c"):
        CACHE[f"user-{user}"] = torch.ones(64, 64)

@pytest.mark.vram_budget
def test_hook():
    model = torch.nn.Linear(8, 8)
    seen = []
    model.register_forward_hook(lambda module, args, output: seen.append(output))
    MODELS.append(model)
    model(torch.ones(4, 8))

@pytest.mark.vram_budget
def test_quiet():
    torch.ones(1000).sum()

def test_loop(vramleak):
    losses = []
    for step in vramleak.steps(8, warmup=3):
        losses.append(torch.ones(128) * step)
"""
    )
    # In a process of its own, so that what these tests leak on purpose stays there.
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", "-q"]
    if request.param == "one run":
        result = subprocess.run(
            [*command, f"--vramleak-report={folder / 'r.html'}", "test_suite.py"],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == pytest.ExitCode.TESTS_FAILED, result.stdout + result.stderr
        (folder / "stdout.txt").write_text(result.stdout)
        return folder / "r.html"
    for shard, selection in (("shard-1", "cache or quiet"), ("shard-2", "hook or loop")):
        result = subprocess.run(
            [*command, f"--vramleak-report={folder / shard}.json", "-k", selection, "test_suite.py"],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == pytest.ExitCode.TESTS_FAILED, result.stdout + result.stderr
    merge = [sys.executable, "-m", "pytest_vramleak", "merge", "shard-1.json", "shard-2.json", "--html", "r.html"]
    result = subprocess.run(merge, cwd=folder, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return folder / "r.html"


HEADLINE = "4 checked tests: 3 failed, 1 passed; 3 leaked"


def test_report_loads_without_errors_or_requests(browser: Any, report_page: Path) -> None:
    browser.get(report_page.as_uri())
    assert browser.title == f"vramleak report: {HEADLINE}"
    assert errors(browser) == []
    # Self-contained: the page fetched nothing besides itself.
    assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0


def test_the_headline_is_the_terminals_in_the_same_words(browser: Any, report_page: Path) -> None:
    """The page's headline, as the browser shows it, is the line the terminal's summary printed
    (a merged page's too: its shards ran the same tests), and its cards count the same."""
    from selenium.webdriver.common.by import By

    browser.get(report_page.as_uri())
    shown = browser.find_element(By.CSS_SELECTOR, "header .headline").text
    assert shown == HEADLINE
    terminal = report_page.parent / "stdout.txt"
    if terminal.exists():
        lines = terminal.read_text().splitlines()
        summary = lines.index(next(line for line in lines if " vramleak summary " in line))
        assert lines[summary + 1] == shown
        assert lines[-1].startswith("3 failed, 1 passed in ")  # pytest's own count of the same tests
    cards = {
        card.find_element(By.TAG_NAME, "span").text: card.find_element(By.TAG_NAME, "b").text
        for card in browser.find_elements(By.CSS_SELECTOR, ".cards .card")
    }
    assert {name: cards[name] for name in ("checked tests", "failed", "passed", "leaked")} == {
        "checked tests": "4",
        "failed": "3",
        "passed": "1",
        "leaked": "3",
    }


def test_step_chart_renders_with_warm_up_shaded(browser: Any, report_page: Path) -> None:
    browser.get(report_page.as_uri())
    chart = browser.execute_script(
        """
        const svg = document.querySelector('figure.steps:not(.runs) svg.chart');
        const box = (el) => { const r = el.getBoundingClientRect(); return [r.left, r.top, r.width, r.height]; };
        return {
          svg: box(svg),
          line: box(svg.querySelector('polyline.series')),
          warmup: box(svg.querySelector('rect.warmup')),
          points: Array.from(svg.querySelectorAll('circle')).map((c) => [box(c), c.getAttribute('class')]),
        };
        """
    )
    assert chart["svg"][2] > 300 and chart["svg"][3] > 150
    assert chart["line"][2] > 200 and chart["line"][3] > 50  # a rising line, not a flat or empty one
    points = chart["points"]
    assert [kind for _, kind in points] == ["point warm"] * 3 + ["point"] * 5
    centres = [(left + width / 2, top + height / 2) for (left, top, width, height), _ in points]
    assert [x for x, _ in centres] == sorted(x for x, _ in centres)
    assert centres[-1][1] < centres[3][1]  # later steps drawn higher: memory grew
    left, _, width, _ = chart["warmup"]
    assert centres[2][0] < left + width < centres[3][0]  # the shading ends between warm-up and measured steps


def test_retention_graph_renders_nodes_edges_and_labels_that_fit(browser: Any, report_page: Path) -> None:
    browser.get(report_page.as_uri())
    graphs = browser.execute_script(
        """
        return Array.from(document.querySelectorAll('section.test')).map((section) => ({
          test: section.querySelector('h2 code').textContent,
          graphs: Array.from(section.querySelectorAll('svg.graph')).map((svg) => ({
            nodes: Array.from(svg.querySelectorAll('g.node')).map((g) => ({
              label: g.querySelector('text').textContent,
              box: g.querySelector('rect').getBBox().width,
              text: g.querySelector('text').getComputedTextLength(),
            })),
            edges: Array.from(svg.querySelectorAll('path.edge')).map((p) => p.getTotalLength()),
            labels: Array.from(svg.querySelectorAll('text.edge-label')).map((t) => t.textContent),
          })),
        }));
        """
    )
    by_test = {entry["test"].rsplit("::", 1)[-1]: entry["graphs"] for entry in graphs}
    (cache,) = by_test["test_cache"]
    assert sorted(node["label"] for node in cache["nodes"]) == [
        "Tensor",
        "Tensor",
        "Tensor",
        "dict",
        "module test_suite",
    ]
    assert sorted(cache["labels"]) == [".CACHE", "['user-a']", "['user-b']", "['user-c']"]
    assert len(cache["edges"]) == 4 and min(cache["edges"]) > 20
    for graph in (g for graphs in by_test.values() for g in graphs):
        for node in graph["nodes"]:
            assert 0 < node["text"] <= node["box"], node  # every label drawn, inside its box
    hook_labels = {label for graph in by_test["test_hook"] for label in graph["labels"]}
    assert "._forward_hooks" in hook_labels and "closure var 'seen'" in hook_labels


def test_table_sorts_by_a_column_both_ways(browser: Any, report_page: Path) -> None:
    from selenium.webdriver.common.by import By

    browser.get(report_page.as_uri())

    def order() -> list[str]:
        return [
            row.text.split()[0].rsplit("::", 1)[-1] for row in browser.find_elements(By.CSS_SELECTOR, "#tests tbody tr")
        ]

    assert order() == ["test_cache", "test_hook", "test_loop", "test_quiet"]
    leaked = browser.find_element(By.XPATH, "//table[@id='tests']//th[button[text()='leaked']]")
    leaked.find_element(By.TAG_NAME, "button").click()
    assert leaked.get_attribute("aria-sort") == "ascending"
    assert order()[:2] == ["test_loop", "test_quiet"]  # not measured (a step check), then 0 B
    leaked.find_element(By.TAG_NAME, "button").click()
    assert leaked.get_attribute("aria-sort") == "descending"
    assert order()[:2] == ["test_cache", "test_hook"]  # 48 KiB, then the hook's outputs and weights
    assert errors(browser) == []


def test_table_shows_only_failing_tests_on_request(browser: Any, report_page: Path) -> None:
    from selenium.webdriver.common.by import By

    browser.get(report_page.as_uri())

    def shown() -> list[str]:
        rows = browser.find_elements(By.CSS_SELECTOR, "#tests tbody tr")
        return [row.text.split()[0].rsplit("::", 1)[-1] for row in rows if row.is_displayed()]

    only_failing = browser.find_element(By.ID, "only-failing")
    only_failing.click()
    assert shown() == ["test_cache", "test_hook", "test_loop"]
    only_failing.click()
    assert shown() == ["test_cache", "test_hook", "test_loop", "test_quiet"]
    assert errors(browser) == []


def test_run_chart_of_a_repeated_test_renders(browser: Any, tmp_path: Path) -> None:
    (tmp_path / "test_suite.py").write_text(
        """
import torch

KEPT = []

def test_grows():
    KEPT.append(torch.ones(256))
"""
    )
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-q",
        "--vramleak",
        "--vramleak-repeat=6",
        f"--vramleak-report={tmp_path / 'r.html'}",
    ]
    result = subprocess.run([*command, "test_suite.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == pytest.ExitCode.TESTS_FAILED, result.stdout + result.stderr
    browser.get((tmp_path / "r.html").as_uri())
    assert errors(browser) == []
    chart = browser.execute_script(
        """
        const svg = document.querySelector('figure.runs svg.chart');
        const box = (el) => { const r = el.getBoundingClientRect(); return [r.left, r.top, r.width, r.height]; };
        return {
          label: svg.getAttribute('aria-label'),
          axis: svg.querySelector('text.axis').textContent,
          points: Array.from(svg.querySelectorAll('circle')).map((c) => [box(c), c.getAttribute('class')]),
          pattern: document.querySelector('td .pattern').textContent,
        };
        """
    )
    assert chart["label"] == "memory after each run of test_suite.py::test_grows"
    assert chart["axis"] == "run"
    assert chart["pattern"] == "grows"
    points = chart["points"]
    assert [kind for _, kind in points] == ["point warm"] * 2 + ["point"] * 4
    heights = [top + height / 2 for (_, top, _, height), _ in points]
    assert heights == sorted(heights, reverse=True)  # each run drawn higher: memory grew


def test_peak_bars_and_timeline_render_with_a_legend_matching_the_json(browser: Any, tmp_path: Path) -> None:
    (tmp_path / "test_suite.py").write_text(
        """
import pytest, torch

@pytest.mark.vram_budget("64 KiB")
def test_adam_step():
    model = torch.nn.Linear(256, 256)
    model.weight.grad = torch.ones_like(model.weight)
    torch.optim.Adam(model.parameters()).step()
"""
    )
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-q",
        f"--vramleak-report={tmp_path / 'r.html'}",
        f"--vramleak-report={tmp_path / 'r.json'}",
    ]
    result = subprocess.run([*command, "test_suite.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == pytest.ExitCode.TESTS_FAILED, result.stdout + result.stderr
    categories = json.loads((tmp_path / "r.json").read_text())["tests"][0]["peak_breakdown"]["categories"]
    shown = {name for name, size in categories.items() if size > 0}
    browser.get((tmp_path / "r.html").as_uri())
    assert errors(browser) == []
    page = browser.execute_script(
        """
        const box = (el) => { const r = el.getBoundingClientRect(); return [r.left, r.top, r.width, r.height]; };
        const bar = document.querySelector('figure.peak svg.peak-bar');
        return {
          bar: box(bar),
          segments: Array.from(bar.querySelectorAll('rect.segment')).map((r) => [r.dataset.category, box(r)[2]]),
          legend: Array.from(document.querySelectorAll('figure.peak ul.legend li')).map((li) => li.dataset.category),
          areas: Array.from(document.querySelectorAll('figure.peak svg.peak-timeline polygon.area')).map((p) => [p.dataset.category, box(p)[3]]),
        };
        """
    )
    assert set(page["legend"]) == shown
    assert [name for name, _ in page["segments"]] == page["legend"]
    total = sum(categories[name] for name in shown)
    for name, width in page["segments"]:  # each segment as wide as its share of the peak
        assert abs(width - page["bar"][2] * categories[name] / total) <= 1.5
    assert {name for name, _ in page["areas"]} >= {"optimizer state", "parameters"}
    assert all(height > 0 for name, height in page["areas"] if name in ("optimizer state", "parameters"))


def test_a_wide_holder_graph_shrinks_to_the_page_without_a_scrollbar(browser: Any, tmp_path: Path) -> None:
    from pytest_vramleak.reporting.html_report import render_html

    # A chain of twelve long edges: its drawing is far wider than the page.
    path = [["module test_it", "module"]] + [[f".a_rather_long_attribute_name_{n}", "Holder"] for n in range(12)]
    path[-1][1] = "Tensor"
    record = {
        "nodeid": "test_it.py::test_deep",
        "device": "cpu",
        "outcome": "failed",
        "verdict": "leaked",
        "leaked_bytes": 4096,
        "budget": {"leak": 0, "peak": None},
        "tensors": [
            {
                "title": "float32[1024] on cpu: 1 tensor, 4.0 KiB",
                "dtype": "float32",
                "shape": [1024],
                "device": "cpu",
                "bytes": 4096,
                "count": 1,
                "held_by": ["test_it" + "".join(edge for edge, _ in path[1:])],
                "held_by_paths": [path],
            }
        ],
    }
    page = tmp_path / "r.html"
    page.write_text(render_html([record]))
    browser.get(page.as_uri())
    assert errors(browser) == []
    sizes = browser.execute_script(
        """
        const box = document.querySelector('.graph-box');
        const svg = box.querySelector('svg.graph');
        return {scroll: box.scrollWidth, client: box.clientWidth, drawn: svg.getBoundingClientRect().width,
                natural: Number(svg.getAttribute('width')), page: document.documentElement.scrollWidth,
                window: document.documentElement.clientWidth};
        """
    )
    assert sizes["natural"] > sizes["client"] >= sizes["drawn"] > 0, sizes  # drawn smaller than it was made
    assert sizes["scroll"] <= sizes["client"] and sizes["page"] <= sizes["window"], sizes  # nothing to scroll to

"""The HTML report rendered from records: its drawings, its table, its cards, and what it escapes."""

from __future__ import annotations

import json
import re

import pytest

from pytest_vramleak.reporting.html_report import render_html, retention_graph, step_chart
from pytest_vramleak.reporting.report import is_html_path

from ...conftest import Elements

CACHE_PATHS = [[["test_it", "module"], [".CACHE", "dict"], [f"['user-{n}']", "Tensor"]] for n in (1, 2, 3)]


@pytest.mark.parametrize(
    ("path", "html"), [("r.html", True), ("R.HTM", True), ("r.json", False), ("html", False), ("r.html.json", False)]
)
def test_report_kind_follows_the_suffix(path: str, html: bool) -> None:
    assert is_html_path(path) is html


def test_step_chart_shades_the_warm_up_and_plots_every_step() -> None:
    chart = Elements(step_chart([-100, 0], [100, 200, 300]))
    points = chart.all("circle")
    assert [p["class"] for p in points] == ["point warm"] * 2 + ["point"] * 3
    (warmup,) = chart.all("rect", class_="warmup")
    xs = [float(p["cx"] or 0) for p in points]
    assert xs == sorted(xs) and float(warmup["x"] or 0) + float(warmup["width"] or 0) == pytest.approx(
        (xs[1] + xs[2]) / 2
    )
    ys = [float(p["cy"] or 0) for p in points]
    assert ys[0] > ys[1] > ys[2] > ys[3] > ys[4]  # SVG y grows downwards: memory rises step by step
    assert "step 5: 300 B above the warm-up baseline" in " ".join(chart.text["title"])


def test_step_chart_without_warm_up_has_no_shading() -> None:
    chart = Elements(step_chart([], [0, 0, 0]))
    assert len(chart.all("circle")) == 3
    assert chart.all("rect", class_="warmup") == []


def test_retention_graph_merges_chains_that_share_a_beginning() -> None:
    graph = Elements(retention_graph(CACHE_PATHS, "float32[2, 512]"))
    nodes = [a["class"] for a in graph.all("g")]
    assert nodes.count("node root") == 1 and nodes.count("node target") == 3 and nodes.count("node") == 1
    assert len(graph.all("path", class_="edge")) == 4  # module -> dict, dict -> each of three tensors
    labels = [
        "module test_it",
        "dict",
        "Tensor",
        "Tensor",
        "Tensor",
        ".CACHE",
        "['user-1']",
        "['user-2']",
        "['user-3']",
    ]
    assert sorted(graph.text["text"]) == sorted(labels)


def test_retention_graph_adds_the_tensor_when_the_root_holds_it() -> None:
    graph = Elements(retention_graph([[["test_it:7 local 'loss'", "frame local"]]], "float32[]"))
    assert sorted(graph.text["text"]) == ["float32[]", "test_it:7 local 'loss'"]
    assert len(graph.all("path", class_="edge")) == 1


def test_retention_graph_clips_long_labels_and_keeps_them_whole_in_a_tooltip() -> None:
    name = "x" * 200
    graph = Elements(retention_graph([[[name, "frame local"], [".a", "Tensor"]]], "float32[]"))
    assert all(len(t) <= 64 for t in graph.text["text"])
    assert graph.text["title"] == [name]


PYTEST_OUTCOME = {"leaked": "failed", "over_budget": "failed", "passed": "passed", "unchecked": "skipped"}


def result(nodeid: str, verdict: str, **figures: object) -> dict[str, object]:
    return {
        "nodeid": nodeid,
        "device": "cpu",
        "outcome": PYTEST_OUTCOME[verdict],
        "verdict": verdict,
        "budget": {"peak": None, "leak": 0},
        "tensors": [],
        **figures,
    }


def test_page_escapes_everything_it_did_not_write_itself() -> None:
    hostile = "test_x.py::test_it[<script>alert(1)</script>]"
    group = {
        "title": "<marquee>",
        "dtype": "float32",
        "shape": [1],
        "held_by": ["</script><script>alert(2)</script>"],
        "held_by_paths": [[["<blink>", "module"]]],
    }
    page = render_html([result(hostile, "leaked", leaked_bytes=4, tensors=[group])])
    assert "<script>alert" not in page and "<marquee>" not in page and "<blink>" not in page
    scripts = re.findall(r"<script[^>]*>(.*?)</script>", page, flags=re.S)
    assert len(scripts) == 2  # the data and the sorting code, nothing a test name smuggled in
    data = json.loads(scripts[0])
    assert data["tests"][0]["nodeid"] == hostile


def test_page_table_has_a_sortable_row_per_test_and_links_to_details() -> None:
    results = [
        result(
            "t.py::test_leaks",
            "leaked",
            baseline_bytes=10,
            leaked_bytes=4096,
            tensors=[{"dtype": "float32", "shape": [2], "held_by_paths": CACHE_PATHS}],
        ),
        result("t.py::test_quiet", "passed", baseline_bytes=10, leaked_bytes=0),
        result("t.py::test_skipped", "unchecked", reason="the test was skipped"),
    ]
    page = Elements(render_html(results, about={"torch": "2.13.0"}))
    headers = page.all("th")
    assert [h["data-type"] for h in headers] == ["text", "text", "number", "number", "number", "number", "text", "text"]
    rows = page.all("tr", class_="leaked") + page.all("tr", class_="passed") + page.all("tr", class_="unchecked")
    assert len(rows) == 3
    leaked_cells = [a["data-value"] for a in page.all("td", class_="number")][2::4]
    assert leaked_cells == ["4096", "0", "-1"]  # a figure not measured sorts below zero
    links = [a["href"] for a in page.all("a")]
    sections = [a["id"] for a in page.all("section")]
    assert links == [f"#{s}" for s in sections] and len(sections) == 2  # the leak, and why a test went unchecked
    assert len(page.all("svg", class_="graph")) == 1
    assert "2.13.0" in " ".join(page.text["li"])


def test_fixture_leftovers_are_listed_with_their_holders() -> None:
    fixture = {
        "fixture": "model",
        "scope": "module",
        "where": "t.py",
        "bytes": 263168,
        "held_by": ["t.REGISTRY[0].weight"],
        "diagnoses": ["bound it"],
    }
    page = Elements(render_html([result("t.py::test_it", "passed")], fixtures=[fixture]))
    (table,) = page.all("table", class_="fixtures")
    assert "t.REGISTRY[0].weight" in page.text["code"] and "257.0 KiB" in page.text["td"]
    assert page.text["div"][-1] == "bound it"


def test_a_test_with_many_leaked_groups_draws_the_largest_and_counts_the_rest() -> None:
    groups = [
        {"dtype": "float32", "shape": [n], "bytes": 4 * n, "held_by_paths": [[["t", "module"], [f".T{n}", "Tensor"]]]}
        for n in range(30, 0, -1)
    ]
    page = render_html([result("t.py::test_it", "leaked", leaked_bytes=1860, tensors=groups)])
    assert len(Elements(page).all("svg", class_="graph")) == 20
    assert "… and 10 more groups of tensors, 220 B" in page


def test_a_tests_card_says_which_run_left_the_tensors_it_draws() -> None:
    group = {"dtype": "float32", "shape": [4], "bytes": 16, "held_by_paths": [[["t", "module"], [".KEPT", "list"]]]}
    which = "run 5, which recorded where tensors are made after the 4 above"
    page = Elements(
        render_html([result("t.py::test_it", "leaked", leaked_bytes=16, tensors=[group], tensors_from=which)])
    )
    assert page.all("p", class_="from") and f"tensors left by {which}, 16 B in all:" in page.text["p"]
    page = Elements(render_html([result("t.py::test_it", "leaked", leaked_bytes=16, tensors=[group])]))
    assert page.all("p", class_="from") == []


def test_a_step_checks_charts_number_the_steps_as_its_loop_does() -> None:
    # the loop's steps run from 0, as the note "stayed flat after step 2" numbers them
    record = {
        "nodeid": "t.py::test_loop",
        "device": "cpu",
        "outcome": "failed",
        "verdict": "leaked",
        "warmup_steps": [-100, 0],
        "steps": [100, 200, 300, 400],
        "step_history_nodes": [0, 8, 16, 24],
    }
    charts = re.findall(r'<figure class="steps[^"]*">.*?</figure>', render_html([record]), flags=re.S)
    steps, history = (Elements(chart) for chart in charts)
    assert [t for t in steps.text["text"] if t.isdigit()] == ["0", "1", "2", "3", "4", "5"]
    assert "step 2: 100 B above the warm-up baseline" in steps.text["title"]
    assert "numbered as the loop's steps, from 0" in " ".join(steps.text["figcaption"])
    assert [t for t in history.text["text"] if t.isdigit()] == ["2", "3", "4", "5"]
    assert history.text["title"][0] == "step 2: 0 nodes"


def test_the_tensors_heading_gives_their_total_and_says_when_it_is_not_the_first_runs_leak() -> None:
    from pytest_vramleak.reporting.html_report import _listed_total

    tensors = [
        {"kind": "tensor", "bytes": 1024, "graph_bytes": 3072},
        {"kind": "graph", "bytes": 2048, "graph_bytes": 2048},  # a graph group's bytes are its graph's
        {"kind": "history", "bytes": 500},
    ]
    assert _listed_total({"tensors": tensors, "leaked_bytes": 6144}) == ", 6.0 KiB in all"
    assert _listed_total({"tensors": tensors, "leaked_bytes": 1024}) == (
        ", 6.0 KiB in all, where the leak above, 1.0 KiB, is the first run's"
    )
    assert _listed_total({"tensors": [], "leaked_bytes": 1024}) == ""

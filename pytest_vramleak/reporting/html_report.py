"""The HTML report: one self-contained page with every checked test, step charts and retention graphs.

Everything is drawn here as inline SVG and styled by inline CSS; the only script sorts the table.
The page needs no network and no graphviz, and shows its content with scripts turned off.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .outcomes import PYTEST_ORDER, headline, verdict_of, why_passed
from .report import (
    holders_not_searched,
    leaked_figure,
    listed_total_text,
    shape_text,
    sites_not_looked_up_text,
    size_text,
)

VERDICT_ORDER = {"leaked": 0, "over_budget": 1, "passed": 2, "unchecked": 3}
OUTCOME_ORDER = {"failed": 0, "error": 1, "xpassed": 2, "passed": 3, "xfailed": 4, "skipped": 5}
"""pytest's outcomes, failures first, as the table sorts them."""
PASSING = ("passed", "xfailed", "skipped")
"""pytest's outcomes that do not fail a run: a badge shows them green or grey, the others red."""
CHAR_WIDTH = 7.3
"""Width of one character of the 12px monospace font the graphs use, in SVG units."""
MAX_LABEL = 64
MAX_GROUPS_DRAWN = 20
"""Groups of leaked tensors drawn per test; a test that leaks thousands of shapes stays readable."""


def _escape(text: object) -> str:
    return html.escape(str(text), quote=True)


def _clip(text: str, limit: int = MAX_LABEL) -> str:
    """``text`` within ``limit`` characters, cut in its middle: two long keys that differ at their
    end (``['runs/2024-01-01/model-a']``, ``[...model-b']``) stay told apart."""
    if len(text) <= limit:
        return text
    tail = (limit - 1) // 2
    return text[: limit - 1 - tail] + "…" + text[len(text) - tail :]


def _signed_figure(value: int | None) -> int:
    """A cell's sort key: a figure not measured sorts below every measured one."""
    return -1 if value is None else value


# -- the step chart ----------------------------------------------------------------------------


def step_chart(
    warmup_steps: Sequence[int],
    steps: Sequence[int],
    *,
    title: str = "",
    unit: str = "step",
    above: str = "the warm-up baseline",
    figure: Callable[[int], str] = size_text,
    first: int = 1,
) -> str:
    """An SVG line chart of memory above ``above`` after each step (or run: ``unit``), warm-up
    shaded; ``figure`` writes a value (a size, by default; a count of autograd nodes), and
    ``first`` is the number of the first step drawn (a step check's steps are numbered as its loop
    numbers them, from 0; a chart of its measured steps only starts after the warm-up)."""
    values = [*warmup_steps, *steps]
    if not values:
        return ""
    width, height = 640, 240
    left, right, top, bottom = 84, 20, 18, 40
    plot_width, plot_height = width - left - right, height - top - bottom
    low, high = min(0, *values), max(0, *values)
    if high == low:  # a flat line: draw it low in a chart a kibibyte tall
        high = low + 1024
    count = len(values)

    def x(index: int) -> float:
        return left + (plot_width * index / (count - 1) if count > 1 else plot_width / 2)

    def y(value: int) -> float:
        return top + (high - value) * plot_height / (high - low)

    parts = [
        f'<svg class="chart" role="img" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'aria-label="{_escape(title or "memory after each " + unit)}">'
    ]
    warm = len(warmup_steps)
    if warm:
        edge = (x(warm - 1) + x(warm)) / 2 if warm < count else left + plot_width
        parts.append(f'<rect class="warmup" x="{left}" y="{top}" width="{edge - left:.1f}" height="{plot_height}"/>')
        parts.append(f'<text class="warmup-label" x="{left + 6}" y="{top + 14}">warm-up</text>')
    ticks = sorted({low, 0, high})
    for tick in ticks:
        parts.append(
            f'<line class="{"zero" if tick == 0 else "grid"}" x1="{left}" x2="{left + plot_width}" y1="{y(tick):.1f}" y2="{y(tick):.1f}"/>'
        )
        parts.append(
            f'<text class="tick" x="{left - 8}" y="{y(tick) + 4:.1f}" text-anchor="end">{_escape(figure(tick))}</text>'
        )
    stride = max(1, (count + 11) // 12)
    for index in range(0, count, stride):
        parts.append(
            f'<text class="tick" x="{x(index):.1f}" y="{top + plot_height + 18}" text-anchor="middle">{index + first}</text>'
        )
    parts.append(
        f'<text class="axis" x="{left + plot_width / 2:.1f}" y="{height - 4}" text-anchor="middle">{unit}</text>'
    )
    points = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(values))
    parts.append(f'<polyline class="series" points="{points}"/>')
    for index, value in enumerate(values):
        phase = f"warm-up {unit}" if index < warm else unit
        parts.append(
            f'<circle class="{"point warm" if index < warm else "point"}" cx="{x(index):.1f}" cy="{y(value):.1f}" r="3.5">'
            f"<title>{phase} {index + first}: {_escape(figure(value))}{' above ' + _escape(above) if above else ''}</title></circle>"
        )
    parts.append("</svg>")
    return "".join(parts)


# -- the peak by kind ------------------------------------------------------------------------

CATEGORY_COLORS = {
    "activations": "#4c78a8",
    "gradients": "#f58518",
    "optimizer state": "#54a24b",
    "parameters": "#b279a2",
    "inputs": "#eeca3b",
    "temporaries": "#9d755d",
    "autograd detail": "#72b7b2",
    "uncategorized": "#bab0ac",
}


def peak_bars(breakdown: Mapping[str, Any], *, title: str = "") -> str:
    """A stacked bar of the memory at the peak by kind, with its legend."""
    categories = [(name, int(size)) for name, size in (breakdown.get("categories") or {}).items() if int(size) > 0]
    total = sum(size for _, size in categories)
    if not total:
        return ""
    width, height = 640, 28
    parts = [
        f'<svg class="peak-bar" role="img" viewBox="0 0 {width} {height}" width="{width}" height="{height}" aria-label="{_escape(title or "memory at the peak by kind")}">'
    ]
    left = 0.0
    for name, size in categories:
        span = width * size / total
        parts.append(
            f'<rect class="segment" data-category="{_escape(name)}" x="{left:.1f}" y="0" width="{span:.1f}" height="{height}" '
            f'fill="{CATEGORY_COLORS.get(name, "#888")}"><title>{_escape(name)}: {_escape(size_text(size))}</title></rect>'
        )
        left += span
    parts.append("</svg>")
    legend = "".join(
        f'<li data-category="{_escape(name)}"><span class="swatch" style="background:{CATEGORY_COLORS.get(name, "#888")}"></span>'
        f"{_escape(name)} {_escape(size_text(size))} ({100 * size / total:.0f}%)</li>"
        for name, size in categories
    )
    return "".join(parts) + f'<ul class="legend">{legend}</ul>'


def peak_timeline(breakdown: Mapping[str, Any], *, title: str = "") -> str:
    """Stacked areas of memory by kind over the time the peak was watched."""
    timeline = breakdown.get("timeline") or {}
    times = [int(t) for t in timeline.get("times_us") or []]
    series = [(name, [int(v) for v in values]) for name, values in (timeline.get("categories") or {}).items()]
    if len(times) < 2 or not series:
        return ""
    width, height = 640, 200
    left, right, top, bottom = 84, 20, 12, 34
    plot_width, plot_height = width - left - right, height - top - bottom
    stacked = [0] * len(times)
    layers = []
    for name, values in series:
        lower = list(stacked)
        stacked = [base + max(0, value) for base, value in zip(stacked, values, strict=False)]
        layers.append((name, lower, list(stacked)))
    high = max(stacked) or 1
    span = (times[-1] - times[0]) or 1

    def x(index: int) -> float:
        return left + plot_width * (times[index] - times[0]) / span

    def y(value: int) -> float:
        return top + plot_height * (1 - value / high)

    parts = [
        f'<svg class="chart peak-timeline" role="img" viewBox="0 0 {width} {height}" width="{width}" height="{height}" aria-label="{_escape(title or "memory by kind over time")}">'
    ]
    for name, lower, upper in layers:
        forward = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(upper))
        backward = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in reversed(list(enumerate(lower))))
        parts.append(
            f'<polygon class="area" data-category="{_escape(name)}" points="{forward} {backward}" fill="{CATEGORY_COLORS.get(name, "#888")}"><title>{_escape(name)}</title></polygon>'
        )
    for tick in (0, high):
        parts.append(
            f'<text class="tick" x="{left - 8}" y="{y(tick) + 4:.1f}" text-anchor="end">{_escape(size_text(tick))}</text>'
        )
    parts.append(
        f'<text class="axis" x="{left + plot_width / 2:.1f}" y="{height - 4}" text-anchor="middle">time ({(times[-1] - times[0]) / 1000:.1f} ms)</text>'
    )
    parts.append("</svg>")
    return "".join(parts)


# -- the retention graph -----------------------------------------------------------------------


@dataclass
class _Node:
    label: str
    edge: str
    depth: int
    kind: str
    children: list[_Node] = field(default_factory=list)
    row: float = 0.0


def _node_label(text: str, kind: str, depth: int) -> str:
    if depth == 0:
        return f"module {text}" if kind == "module" else text
    return kind


def _tree(paths: Sequence[Sequence[Sequence[str]]], target: str) -> list[_Node]:
    """Merge chains that share a beginning: one root per root object, one branch per edge."""
    roots: list[_Node] = []
    index: dict[tuple[str, ...], _Node] = {}
    for path in paths:
        steps = [(str(text), str(kind)) for text, kind in path]
        if len(steps) == 1:  # the root holds the tensor itself, e.g. a frame's local variable
            steps.append(("", target))
        siblings = roots
        prefix: tuple[str, ...] = ()
        for depth, (text, kind) in enumerate(steps):
            prefix += (text,)
            node = index.get(prefix)
            if node is None:
                last = depth == len(steps) - 1
                node = index[prefix] = _Node(
                    _node_label(text, kind, depth), text.removeprefix(" -> "), depth, "target" if last else kind
                )
                siblings.append(node)
            siblings = node.children
    return roots


def retention_graph(paths: Sequence[Sequence[Sequence[str]]], target: str, *, ident: str = "graph") -> str:
    """An SVG drawing of the chains that hold a group's tensors, from each root to the tensors.

    ``paths`` are the group's ``held_by_paths``: lists of ``[text, kind]``, root first. Nodes are
    labelled with what an object is (its class, or the root's name), edges with how it is reached.
    ``ident`` makes the drawing's element ids unique in a page that has several.
    """
    roots = _tree(paths, target)
    if not roots:
        return ""
    leaves: list[_Node] = []
    columns: dict[int, list[_Node]] = {}

    def place(node: _Node) -> None:
        columns.setdefault(node.depth, []).append(node)
        if not node.children:
            node.row = len(leaves)
            leaves.append(node)
            return
        for child in node.children:
            place(child)
        node.row = (node.children[0].row + node.children[-1].row) / 2

    for root in roots:
        place(root)
    row_height, node_height, margin = 44, 26, 12
    node_widths = {d: max(len(_clip(n.label)) for n in nodes) * CHAR_WIDTH + 18 for d, nodes in columns.items()}
    gaps = {d: max(44.0, max(len(_clip(n.edge)) for n in nodes) * CHAR_WIDTH + 28) for d, nodes in columns.items()}
    lefts: dict[int, float] = {}
    position = float(margin)
    for depth in sorted(columns):
        if depth:
            position += gaps[depth]
        lefts[depth] = position
        position += node_widths[depth]
    width = position + margin
    height = len(leaves) * row_height + 2 * margin - (row_height - node_height)

    def middle(node: _Node) -> float:
        return margin + node.row * row_height + node_height / 2

    arrow = f"{ident}-arrow"
    edges, boxes = [], []
    for depth, nodes in columns.items():
        for node in nodes:
            x, top = lefts[depth], middle(node) - node_height / 2
            css = "node root" if depth == 0 else ("node target" if node.kind == "target" else "node")
            label = _clip(node.label)
            tooltip = f"<title>{_escape(node.label)}</title>" if label != node.label else ""
            boxes.append(
                f'<g class="{css}">{tooltip}<rect x="{x:.1f}" y="{top:.1f}" width="{node_widths[depth]:.1f}" height="{node_height}" rx="5"/>'
                f'<text x="{x + node_widths[depth] / 2:.1f}" y="{top + 17:.1f}" text-anchor="middle">{_escape(label)}</text></g>'
            )
            for child in node.children:
                x1, y1 = x + node_widths[depth], middle(node)
                x2, y2 = lefts[child.depth], middle(child)
                bend = (x2 - x1) / 2
                edges.append(
                    f'<path class="edge" marker-end="url(#{arrow})" d="M{x1:.1f},{y1:.1f} C{x1 + bend:.1f},{y1:.1f} {x2 - bend:.1f},{y2:.1f} {x2:.1f},{y2:.1f}"/>'
                )
                if child.edge:
                    edge = _clip(child.edge)
                    tooltip = f"<title>{_escape(child.edge)}</title>" if edge != child.edge else ""
                    edges.append(
                        f'<text class="edge-label" x="{x2 - 10:.1f}" y="{y2 - 6:.1f}" text-anchor="end">{tooltip}{_escape(edge)}</text>'
                    )
    return (
        f'<svg class="graph" role="img" viewBox="0 0 {width:.0f} {height:.0f}" width="{width:.0f}" height="{height:.0f}" '
        f'aria-label="references holding {_escape(target)}">'
        f'<defs><marker id="{arrow}" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="7" markerHeight="7" orient="auto">'
        '<path d="M0,0 L8,4 L0,8 z"/></marker></defs>' + "".join(edges) + "".join(boxes) + "</svg>"
    )


# -- the page ----------------------------------------------------------------------------------


def _group_target(group: Mapping[str, Any]) -> str:
    return f"{group.get('dtype', '?')}{shape_text(group.get('shape', []))}"


def _figures(result: Mapping[str, Any]) -> str:
    """A card's figures in one line; those of a test's first run say so where it ran again."""
    figures = [f"device {result.get('device') or '—'}"]
    budget = result.get("budget") or {}
    run = []
    if result.get("baseline_bytes") is not None:
        run.append(f"baseline {size_text(result['baseline_bytes'])}")
    if result.get("end_bytes") is not None:
        run.append(f"after teardown {size_text(result['end_bytes'])}")
    if result.get("leaked_bytes") is not None:
        allowed = f" (allowed {size_text(budget['leak'])})" if budget.get("leak") is not None else ""
        run.append(f"leaked {size_text(result['leaked_bytes'])}{allowed}")
    if run and len(result.get("repetitions") or []) > 1:
        figures.append("first run: " + ", ".join(run))
    else:
        figures += run
    if result.get("peak_bytes") is not None:
        allowed = f" (budget {size_text(budget['peak'])})" if budget.get("peak") is not None else ""
        figures.append(f"peak above baseline {size_text(result['peak_bytes'])}{allowed}")
    if result.get("growth_bytes") is not None:
        figures.append(
            f"grew {size_text(result['growth_bytes'])} across the measured {'runs' if result.get('repetitions') else 'steps'}"
        )
    if result.get("pattern"):
        figures.append(f"pattern: {result['pattern']}")
    if result.get("cycle_bytes"):
        figures.append(f"{size_text(result['cycle_bytes'])} lived in reference cycles until collected")
    return " · ".join(_escape(f) for f in figures)


def _listed_total(result: Mapping[str, Any]) -> str:
    """What one run's groups add up to, and where that is not the first run's leak the card
    opens with, that the figure above is the first run's (as the terminal's heading says)."""
    listed = sum(
        group.get("bytes", 0) + (0 if group.get("kind") == "graph" else group.get("graph_bytes", 0))
        for group in result.get("tensors") or []
        if group.get("kind") != "history"
    )
    return listed_total_text(listed, result.get("leaked_bytes"), "leak")


def _group_html(group: Mapping[str, Any], ident: str) -> str:
    title = group.get("title") or _group_target(group)
    parts = [f'<div class="group"><h3>{_escape(title)}</h3>']
    paths = group.get("held_by_paths") or []
    if paths:
        parts.append(f'<div class="graph-box">{retention_graph(paths, _group_target(group), ident=ident)}</div>')
    if group.get("held_by"):
        parts.append(
            '<ul class="held">'
            + "".join(f"<li>held by <code>{_escape(h)}</code></li>" for h in group["held_by"])
            + "</ul>"
        )
    unsearched = holders_not_searched(
        str(group.get("kind") or "tensor"), int(group.get("count") or 0), len(group.get("held_by") or [])
    )
    if unsearched:
        parts.append(f'<p class="more">… and {unsearched:,} more alike, whose holders were not searched</p>')
    if group.get("allocated_at"):
        parts.append(
            '<ul class="sites">'
            + "".join(f"<li>allocated at <code>{_escape(s)}</code></li>" for s in group["allocated_at"])
            + "</ul>"
        )
    if group.get("sites_not_looked_up"):
        parts.append(f'<p class="more">… and {sites_not_looked_up_text(int(group["sites_not_looked_up"]))}</p>')
    if group.get("diagnoses"):
        parts.append('<ul class="diagnoses">' + "".join(f"<li>{_escape(d)}</li>" for d in group["diagnoses"]) + "</ul>")
    parts.append("</div>")
    return "".join(parts)


def _count(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _nodes(count: int) -> str:
    return f"{count:,} nodes"


def _per_step(series: Sequence[int]) -> str:
    rate = (series[-1] - series[0]) / (len(series) - 1)
    return f"{rate:,.0f}" if rate >= 10 or rate == int(rate) else f"{rate:,.1f}"


def _has_details(result: Mapping[str, Any]) -> bool:
    return bool(
        verdict_of(result) in ("leaked", "over_budget")
        or result.get("outcome") not in PASSING
        or result.get("steps")
        or result.get("repetitions")
        or result.get("peak_breakdown")
        or result.get("ranks")
        or result.get("tensors")
        or result.get("cycle_bytes")
        or (verdict_of(result) == "unchecked" and result.get("reason"))
    )


def _outcome_text(outcome: str) -> str:
    return outcome.replace("_", " ")


def _badges(result: Mapping[str, Any]) -> str:
    """pytest's outcome and the leak verdict, as two badges: ``failed`` ``leaked``."""
    outcome = str(result.get("outcome") or "not recorded")
    verdict = verdict_of(result)
    css = "pass" if outcome in PASSING else "fail" if outcome != "not recorded" else "unchecked"
    return (
        f'<span class="badge outcome {css}" title="pytest\'s outcome">{_escape(outcome)}</span> '
        f'<span class="badge {verdict}" title="the leak check\'s verdict">{_escape(_outcome_text(verdict))}</span>'
    )


def _section(result: Mapping[str, Any], anchor: str) -> str:
    """A test's card: its badges and figures, why it passed, its notes, its charts, its tensors."""
    parts = [
        f'<section class="test" id="{anchor}"><h2>{_badges(result)} <code>{_escape(result["nodeid"])}</code></h2>',
        f'<p class="figures">{_figures(result)}</p>',
    ]
    passed = why_passed(result)
    if passed:
        parts.append(f'<p class="reason">{_escape(passed)}</p>')
    if result.get("notes"):
        parts.append('<ul class="notes">' + "".join(f"<li>{_escape(note)}</li>" for note in result["notes"]) + "</ul>")
    if result.get("reason"):
        parts.append(f'<p class="reason">{_escape(result["reason"])}</p>')
    parts += _charts(result)
    if result.get("trace"):
        parts.append(
            f'<p class="trace">allocator history saved to <code>{_escape(result["trace"])}</code> (open it at pytorch.org/memory_viz)</p>'
        )
    parts += _ranks(result, anchor)
    groups = result.get("tensors") or []
    if groups and result.get("tensors_from"):
        parts.append(
            f'<p class="from">tensors left by {_escape(str(result["tensors_from"]))}{_listed_total(result)}:</p>'
        )
    parts += [_group_html(group, f"{anchor}-{i}") for i, group in enumerate(groups[:MAX_GROUPS_DRAWN])]
    parts += _more_groups(groups)
    parts.append("</section>")
    return "".join(parts)


def _charts(result: Mapping[str, Any]) -> list[str]:
    """A card's charts: memory after each step, autograd nodes kept per step, memory after each
    run, and memory at the peak by kind, where the record has them."""
    parts = []
    if result.get("steps"):
        warmup = result.get("warmup_steps") or []
        parts.append(
            f'<figure class="steps">{step_chart(warmup, result["steps"], title="memory after each step of " + result["nodeid"], first=0)}'
            f"<figcaption>memory above the warm-up baseline after each step (numbered as the loop's steps, from 0); "
            f"{_count(len(warmup), 'warm-up step')} shaded, "
            f"{len(result['steps'])} measured</figcaption></figure>"
        )
    history = result.get("step_history_nodes") or []
    if len(history) > 1 and history[-1] > history[0]:
        parts.append(
            f'<figure class="steps history">{step_chart([], history, title="autograd nodes kept after each step of " + result["nodeid"], unit="step", above="", figure=_nodes, first=len(result.get("warmup_steps") or []))}'
            f"<figcaption>autograd nodes made by earlier measured steps that tensors alive after each measured step keep: "
            f"{', '.join(f'{n:,}' for n in history)}; the graph grew {_escape(_per_step(history))} nodes a step "
            "(each step's graph linked to the one before)</figcaption></figure>"
        )
    if result.get("repetitions"):
        warm = int(result.get("repetition_warmup") or 0)
        runs = result["repetitions"]
        chart = step_chart(
            runs[:warm],
            runs[warm:],
            title="memory after each run of " + result["nodeid"],
            unit="run",
            above="the first run's baseline",
        )
        parts.append(
            f'<figure class="steps runs">{chart}<figcaption>memory left after each run of the test, above the first run\'s baseline; '
            f"{_count(warm, 'warm-up run')} shaded, {len(runs) - warm} measured"
            + (f"; pattern: {_escape(result['pattern'])}" if result.get("pattern") else "")
            + "</figcaption></figure>"
        )
    breakdown = result.get("peak_breakdown")
    if breakdown:
        parts.append(
            f'<figure class="peak">{peak_bars(breakdown, title="memory at the peak of " + result["nodeid"] + " by kind")}'
            f"{peak_timeline(breakdown, title='memory by kind over the call of ' + result['nodeid'])}"
            "<figcaption>memory above the start of the call by kind (torch's memory profiler): at the peak, and over time"
            + (f"; {_escape(breakdown['remedy'])}" if breakdown.get("remedy") else "")
            + "</figcaption></figure>"
        )
    return parts


def _ranks(result: Mapping[str, Any], anchor: str) -> list[str]:
    """What each rank process reported, with its tensors."""
    parts = []
    for index, rank in enumerate(result.get("ranks") or []):
        who = f"rank {rank['rank']}" if rank.get("rank") is not None else "a process"
        leaked = rank.get("leaked_bytes")
        parts.append(
            f'<h3 class="rank">{_escape(who)} (pid {_escape(rank.get("pid"))}): {_escape(_outcome_text(str(rank.get("outcome"))))}'
            + (f", leaked {_escape(size_text(leaked))} on {_escape(rank.get('device'))}" if leaked else "")
            + "</h3>"
        )
        rank_groups = rank.get("tensors") or []
        parts += [
            _group_html(group, f"{anchor}-rank{index}-{i}") for i, group in enumerate(rank_groups[:MAX_GROUPS_DRAWN])
        ]
        parts += _more_groups(rank_groups)
    return parts


def _more_groups(groups: Sequence[Mapping[str, Any]]) -> list[str]:
    """The line under groups cut at :data:`MAX_GROUPS_DRAWN`: how many are left out, and where they are."""
    if len(groups) <= MAX_GROUPS_DRAWN:
        return []
    rest = groups[MAX_GROUPS_DRAWN:]
    return [
        f'<p class="more">… and {len(rest)} more groups of tensors, {_escape(size_text(sum(int(g.get("bytes") or 0) for g in rest)))} '
        "(all of them are in the JSON data of this page, and in the JSON report)</p>"
    ]


_COLUMNS = (
    ("test", "text"),
    ("device", "text"),
    ("baseline", "number"),
    ("peak", "number"),
    ("leaked", "number"),
    ("growth", "number"),
    ("outcome", "text"),
    ("verdict", "text"),
)


def _row(result: Mapping[str, Any], anchor: str | None) -> str:
    nodeid = _escape(result["nodeid"])
    shown = nodeid.replace("::", "::<wbr>")  # a long id wraps between its file and its test first
    name = f'<a href="#{anchor}">{shown}</a>' if anchor else shown
    if result.get("shard"):
        name += f' <span class="shard">{_escape(result["shard"])}</span>'
    verdict = verdict_of(result)
    outcome = str(result.get("outcome") or "not recorded")
    reason = f' title="{_escape(result["reason"])}"' if result.get("reason") else ""
    cells = [
        f'<td data-value="{nodeid}"><code>{name}</code></td>',
        f'<td data-value="{_escape(result.get("device") or "")}">{_escape(result.get("device") or "—")}</td>',
    ]
    for key in ("baseline_bytes", "peak_bytes", "leaked_bytes", "growth_bytes"):
        value = result.get(key)
        cells.append(f'<td class="number" data-value="{_signed_figure(value)}">{_escape(size_text(value))}</td>')
    cells.append(
        f'<td data-value="{OUTCOME_ORDER.get(outcome, 9)}"><span class="badge outcome {"pass" if outcome in PASSING else "fail"}">'
        f"{_escape(outcome)}</span></td>"
    )
    cells.append(
        f'<td data-value="{VERDICT_ORDER.get(verdict, 9)}"{reason}><span class="badge {verdict}">{_escape(_outcome_text(verdict))}</span>'
        + (
            f' <span class="pattern">{_escape(result["pattern"].replace("_", " "))}</span>'
            if result.get("pattern")
            else ""
        )
        + "</td>"
    )
    failing = ' data-failing=""' if verdict in ("leaked", "over_budget") or outcome not in PASSING else ""
    return f'<tr class="{verdict}"{failing}>' + "".join(cells) + "</tr>"


def render_html(
    results: Sequence[Mapping[str, Any]],
    *,
    fixtures: Iterable[Mapping[str, Any]] = (),
    between_checks: Iterable[Mapping[str, Any]] = (),
    about: Mapping[str, str] | None = None,
    interrupted: str | None = None,
) -> str:
    """The whole page for a run's results (the JSON report's ``tests``), fixture findings, and
    older tensors found changed between checks.

    ``about`` lists facts of the run shown under the title (versions, date, device);
    ``interrupted``, why the run's tests are not all there, shown under the headline.
    """
    results = sorted(results, key=lambda r: r["nodeid"])
    fixtures = list(fixtures)
    anchors = {r["nodeid"]: f"test-{i}" for i, r in enumerate(results) if _has_details(r)}
    title = headline(results)
    stopped = f'<p class="interrupted"><strong>Interrupted</strong>: {_escape(interrupted)}</p>' if interrupted else ""
    about_items = "".join(f"<li><span>{_escape(k)}</span> {_escape(v)}</li>" for k, v in (about or {}).items())
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>vramleak report: {_escape(title)}</title>",
        f"<style>{_STYLE}</style></head><body>",
        f'<header><h1>vramleak report</h1><p class="headline">{_escape(title)}</p>{stopped}<ul class="about">{about_items}</ul></header>',
        _cards(results),
        '<h2 class="part">Checked tests</h2>',
        '<p class="hint">Click a column to sort; a test with details links to them. '
        '<label><input type="checkbox" id="only-failing"> only tests that failed, leaked or went over budget</label></p>',
        _tests_table(results, anchors),
    ]
    parts += _fixtures_table(fixtures)
    parts += _between_checks_table(list(between_checks))
    parts += _details(results, anchors)
    parts += [
        f'<script type="application/json" id="vramleak-data">{_page_data(results, fixtures)}</script>',
        f"<script>{_SCRIPT}</script>",
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def _cards(results: Sequence[Mapping[str, Any]]) -> str:
    """The row of cards under the title: tests checked, each pytest outcome seen, the verdicts, the leaked total."""
    counts = {verdict: sum(1 for r in results if verdict_of(r) == verdict) for verdict in VERDICT_ORDER}
    outcomes = {outcome: sum(1 for r in results if r.get("outcome") == outcome) for outcome in PYTEST_ORDER}
    leaked_total = sum(leaked_figure(r) for r in results if verdict_of(r) == "leaked")
    cards: list[tuple[str, int | str, str]] = [("checked tests", len(results), "")]
    cards += [
        (outcome, count, "failed" if outcome not in PASSING else "") for outcome, count in outcomes.items() if count
    ]
    cards += [
        ("leaked", counts["leaked"], "leaked"),
        ("over budget", counts["over_budget"], "over_budget"),
        ("unchecked", counts["unchecked"], "unchecked"),
        ("leaked in all", size_text(leaked_total), "leaked" if leaked_total else ""),
    ]
    return (
        '<div class="cards">'
        + "".join(
            f'<div class="card {css}"><b>{_escape(value)}</b><span>{_escape(label)}</span></div>'
            for label, value, css in cards
        )
        + "</div>"
    )


def _tests_table(results: Sequence[Mapping[str, Any]], anchors: Mapping[str, str]) -> str:
    """The sortable table of every checked test, each row linked to its details where it has some."""
    return (
        '<table id="tests"><thead><tr>'
        + "".join(f'<th data-type="{kind}"><button type="button">{name}</button></th>' for name, kind in _COLUMNS)
        + "</tr></thead><tbody>"
        + "".join(_row(r, anchors.get(r["nodeid"])) for r in results)
        + "</tbody></table>"
    )


def _fixtures_table(fixtures: Sequence[Mapping[str, Any]]) -> list[str]:
    """The table of fixtures still holding memory after their teardown (nothing where there are none)."""
    if not fixtures:
        return []
    return [
        '<h2 class="part">Fixtures still holding memory after their teardown</h2><table class="fixtures"><thead><tr>',
        "<th>fixture</th><th>scope</th><th>where</th><th>bytes</th><th>held by</th></tr></thead><tbody>",
        *(
            f"<tr><td><code>{_escape(f['fixture'])}</code></td><td>{_escape(f['scope'])}</td>"
            f'<td><code>{_escape(f["where"])}</code></td><td class="number">{_escape(size_text(f["bytes"]))}</td>'
            "<td>"
            + "<br>".join(f"<code>{_escape(chain)}</code>" for chain in f.get("held_by", []))
            + "".join(f'<div class="diagnosis">{_escape(finding)}</div>' for finding in f.get("diagnoses", []))
            + "</td></tr>"
            for f in fixtures
        ),
        "</tbody></table>",
    ]


def _between_checks_table(between: Sequence[Mapping[str, Any]]) -> list[str]:
    """The table of older tensors grown in place or given gradients between checks (nothing where there are none)."""
    if not between:
        return []
    return [
        '<h2 class="part">Older tensors grown in place or given gradients between checks (charged to no test)</h2>',
        '<table class="fixtures"><thead><tr><th>during</th><th>device</th><th>bytes</th><th>held by</th></tr></thead><tbody>',
        *(
            f"<tr><td><code>{_escape(b['where'])}</code></td><td>{_escape(b['device'])}</td>"
            f'<td class="number">{_escape(size_text(b["bytes"]))}</td><td>'
            + "<br>".join(f"<code>{_escape(chain)}</code>" for chain in b.get("held_by", []))
            + "</td></tr>"
            for b in between
        ),
        "</tbody></table>",
    ]


def _details(results: Sequence[Mapping[str, Any]], anchors: Mapping[str, str]) -> list[str]:
    """The details of each test that has some, failures first and the largest leak first among them,
    as in the terminal summary (nothing where no test has details)."""
    ordered = sorted(
        (r for r in results if r["nodeid"] in anchors),
        key=lambda r: (
            VERDICT_ORDER.get(verdict_of(r), 9),
            OUTCOME_ORDER.get(str(r.get("outcome")), 9),
            -leaked_figure(r),
            r["nodeid"],
        ),
    )
    if not ordered:
        return []
    return ['<h2 class="part">Details</h2>', *(_section(r, anchors[r["nodeid"]]) for r in ordered)]


def _page_data(results: Sequence[Mapping[str, Any]], fixtures: Sequence[Mapping[str, Any]]) -> str:
    """The results and fixture findings as JSON for the page's data element."""
    # No "<" may reach the script element's text, or a test name could end it or open a comment.
    return (
        json.dumps({"tests": list(results), "fixtures": fixtures})
        .replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
    )


_SCRIPT = """
(function () {
  "use strict";
  var table = document.getElementById("tests");
  var headers = table.tHead.rows[0].cells;
  Array.prototype.forEach.call(headers, function (th, column) {
    th.querySelector("button").addEventListener("click", function () {
      var ascending = th.getAttribute("aria-sort") !== "ascending";
      Array.prototype.forEach.call(headers, function (other) { other.removeAttribute("aria-sort"); });
      th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
      var numeric = th.getAttribute("data-type") === "number";
      var body = table.tBodies[0];
      var rows = Array.prototype.slice.call(body.rows);
      rows.sort(function (a, b) {
        var x = a.cells[column].getAttribute("data-value"), y = b.cells[column].getAttribute("data-value");
        var order = numeric ? Number(x) - Number(y) : x.localeCompare(y);
        return ascending ? order : -order;
      });
      rows.forEach(function (row) { body.appendChild(row); });
    });
  });
  document.getElementById("only-failing").addEventListener("change", function (event) {
    Array.prototype.forEach.call(table.tBodies[0].rows, function (row) {
      row.hidden = event.target.checked && !row.hasAttribute("data-failing");
    });
  });
})();
"""

_STYLE = """
:root { --ink: #1d2433; --muted: #5b6478; --line: #d9dee8; --soft: #f4f6fa;
  --leaked: #b42318; --leaked-bg: #fef3f2; --over: #b54708; --over-bg: #fffaeb;
  --passed: #067647; --passed-bg: #ecfdf3; --unchecked: #475467; --unchecked-bg: #f2f4f7; --accent: #3559c7; }
* { box-sizing: border-box; }
body { margin: 0 auto; max-width: 1180px; padding: 24px 28px 60px; color: var(--ink);
  font: 14px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; background: #fff; }
code, .graph text, .chart text { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace; }
code { font-size: 12.5px; }
h1 { font-size: 22px; margin: 0; }
.headline { font-size: 16px; margin: 4px 0 6px; }
.interrupted { margin: 4px 0 6px; padding: 6px 10px; border-left: 4px solid #b45309; background: #fef3c7; color: #1f2937; }
.about { list-style: none; padding: 0; margin: 0; display: flex; flex-wrap: wrap; gap: 4px 18px; color: var(--muted); font-size: 12.5px; }
.about span { font-weight: 600; }
.cards { display: flex; gap: 12px; margin: 18px 0 8px; flex-wrap: wrap; }
.card { border: 1px solid var(--line); border-radius: 8px; padding: 10px 16px; min-width: 120px; background: var(--soft); }
.card b { display: block; font-size: 22px; }
.card span { color: var(--muted); font-size: 12.5px; }
.card.leaked { border-color: #fda29b; background: var(--leaked-bg); color: var(--leaked); }
.card.failed { border-color: #fda29b; background: var(--leaked-bg); color: var(--leaked); }
.card.over_budget { border-color: #fec84b; background: var(--over-bg); color: var(--over); }
h2.part { font-size: 17px; margin: 28px 0 4px; border-bottom: 1px solid var(--line); padding-bottom: 4px; }
.hint { color: var(--muted); font-size: 12.5px; margin: 0 0 8px; }
.hint label { margin-left: 12px; color: var(--ink); }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: 5px 10px; border-bottom: 1px solid var(--line); vertical-align: top; }
td.number, th[data-type="number"] { text-align: right; }
th { background: var(--soft); font-weight: 600; white-space: nowrap; }
th button { all: unset; cursor: pointer; }
th button::after { content: " \\2195"; color: var(--muted); font-size: 11px; }
th[aria-sort="ascending"] button::after { content: " \\25B2"; color: var(--accent); }
th[aria-sort="descending"] button::after { content: " \\25BC"; color: var(--accent); }
tbody tr:hover { background: #f9fafc; }
td a { color: var(--accent); text-decoration: none; }
td a:hover { text-decoration: underline; }
.badge { display: inline-block; border-radius: 10px; padding: 0 8px; font-size: 12px; font-weight: 600; white-space: nowrap; }
.badge.leaked { background: var(--leaked-bg); color: var(--leaked); border: 1px solid #fda29b; }
.badge.over_budget { background: var(--over-bg); color: var(--over); border: 1px solid #fec84b; }
.badge.passed { background: var(--passed-bg); color: var(--passed); border: 1px solid #abefc6; }
.badge.outcome.pass { background: var(--soft); color: var(--passed); border: 1px solid var(--line); }
.badge.outcome.fail { background: var(--leaked); color: #fff; border: 1px solid var(--leaked); }
.badge.unchecked { background: var(--unchecked-bg); color: var(--unchecked); border: 1px solid var(--line); }
section.test { border: 1px solid var(--line); border-radius: 8px; padding: 4px 18px 12px; margin: 16px 0; }
section.test h2 { font-size: 15px; margin: 12px 0 4px; }
.figures { color: var(--muted); margin: 0 0 8px; }
.reason { font-style: italic; }
.group { border-top: 1px dashed var(--line); padding-top: 6px; margin-top: 8px; }
.group h3 { font-size: 14px; margin: 4px 0; }
.graph-box { padding: 4px 0; }
.graph-box svg.graph { max-width: 100%; height: auto; }
section.test code { overflow-wrap: anywhere; }
p.more { color: var(--muted); font-size: 12.5px; margin: 2px 0 6px 20px; }
td.number { white-space: nowrap; }
#tests td:first-child code { overflow-wrap: anywhere; }
ul.notes { margin: 0 0 8px; padding-left: 20px; color: var(--muted); }
ul.held, ul.sites, ul.diagnoses { margin: 4px 0; padding-left: 20px; }
ul.diagnoses li { color: var(--leaked); }
.fixtures .diagnosis { color: var(--leaked); font-size: 12.5px; }
ul.diagnoses li::marker { content: "\\26A0  "; }
figure.steps { margin: 8px 0; }
.pattern, .shard { color: var(--muted); font-size: 12px; }
figure.peak { margin: 8px 0; }
.legend { list-style: none; padding: 0; margin: 4px 0 8px; display: flex; flex-wrap: wrap; gap: 12px; font-size: 12px; }
.swatch { display: inline-block; width: 10px; height: 10px; margin-right: 4px; vertical-align: middle; }
figcaption { color: var(--muted); font-size: 12.5px; }
.chart .warmup { fill: #eef1f6; }
.chart .warmup-label { fill: var(--muted); font-size: 11px; }
.chart .grid { stroke: var(--line); }
.chart .zero { stroke: #98a2b3; stroke-dasharray: 4 3; }
.chart .tick, .chart .axis { fill: var(--muted); font-size: 11px; }
.chart .series { fill: none; stroke: var(--accent); stroke-width: 2; }
.chart .point { fill: var(--accent); }
.chart .point.warm { fill: #98a2b3; }
.graph text { font-size: 12px; }
.graph .node rect { fill: var(--soft); stroke: #98a2b3; }
.graph .node.root rect { fill: #eef4ff; stroke: var(--accent); }
.graph .node.target rect { fill: var(--leaked-bg); stroke: var(--leaked); }
.graph .node text { fill: var(--ink); }
.graph .edge { fill: none; stroke: #98a2b3; stroke-width: 1.4; }
.graph marker path { fill: #98a2b3; }
.graph .edge-label { fill: var(--accent); font-size: 11.5px; }
"""

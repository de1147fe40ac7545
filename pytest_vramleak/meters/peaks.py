"""What filled the memory at a test's peak, by kind, with the remedy that fits the largest kind.

PyTorch's memory profiler (``torch.profiler._memory_profiler.MemoryProfile``, the analysis behind
``profile.export_memory_timeline``) puts every allocation recorded with ``profile_memory``,
``record_shapes`` and ``with_stack`` into a category: parameter, optimizer state, input,
temporary, activation, gradient or autograd detail. :func:`breakdown` replays its timeline,
finds the moment memory stood highest above where it started, and says how much of it each
category held then, with the largest tensors of each and where they were made.

One refinement: torch calls *activation* every tensor computed forward from the inputs, with or
without autograd. The remedies for activations (checkpointing, mixed precision, ``no_grad`` in
evaluation) concern the tensors autograd saves for backward, so an output of an op that recorded
no autograd node (its sequence number is negative: it ran under ``no_grad`` or on tensors that
need no gradient) is counted as a temporary instead.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..judging.sizes import format_size
from ..tracking.sites import found_on_path, site_text

CATEGORIES = (
    "activations",
    "gradients",
    "optimizer state",
    "parameters",
    "inputs",
    "temporaries",
    "autograd detail",
    "uncategorized",
)

REMEDIES = {
    "activations": (
        "activations saved for backward fill the peak: activation checkpointing (torch.utils.checkpoint), mixed "
        "precision (torch.autocast), or a smaller batch with gradient accumulation; in evaluation, run under "
        "torch.no_grad() or torch.inference_mode()"
    ),
    "gradients": "gradients fill the peak: zero_grad(set_to_none=True) frees them between steps; free them before evaluation",
    "optimizer state": (
        "optimizer state fills the peak: a lighter optimizer (SGD with momentum, Adafactor), 8-bit optimizer "
        "states, or foreach=False to lower the step's temporary copies"
    ),
    "parameters": "parameters fill the peak: a lower precision (bfloat16), or sharding the model (FSDP)",
    "inputs": "inputs fill the peak: a smaller batch, or each batch moved to the device only when it is used",
    "temporaries": (
        "temporaries fill the peak: in-place operations, fewer intermediate copies, large operations in chunks, "
        "or foreach=False in the optimizer"
    ),
    "autograd detail": "autograd's buffers during backward fill the peak: activation checkpointing or a smaller batch",
    "uncategorized": "memory torch's profiler could not categorize fills the peak (an optimizer's temporaries are often among it)",
}

MAX_LARGEST = 3
"""Largest tensors named per category."""
MAX_TIMELINE_POINTS = 200

_PLUGIN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # the package, every layer of it


@dataclass
class PeakBreakdown:
    """Bytes per category at the peak (above the start), the largest tensors of each, and the
    memory over time by category (at most :data:`MAX_TIMELINE_POINTS` points)."""

    peak_bytes: int
    categories: dict[str, int]
    largest: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    not_listed: dict[str, int] = field(default_factory=dict)
    """Per category, how many more tensors made during the call were alive at the peak, smaller
    than the :data:`MAX_LARGEST` listed."""
    times_us: list[int] = field(default_factory=list)
    timeline: dict[str, list[int]] = field(default_factory=dict)

    @property
    def dominant(self) -> str | None:
        positive = {name: size for name, size in self.categories.items() if size > 0}
        return max(positive, key=positive.__getitem__) if positive else None

    def render(self) -> str:
        """One readable block: bytes and share per category, the largest tensors, the remedy."""
        lines = [
            f"memory at the peak ({format_size(self.peak_bytes)} above the start), by kind (torch's memory profiler):"
        ]
        for name, size in self.categories.items():
            if size <= 0:
                continue
            share = 100 * size / self.peak_bytes if self.peak_bytes > 0 else 0.0
            lines.append(f"  {name:<16} {format_size(size):>10}  {share:5.1f}%")
            lines += [f"      {format_size(nbytes):>10}  {what}" for nbytes, what in self.largest.get(name, [])]
            rest = self.not_listed.get(name, 0)
            if rest:
                lines.append(
                    f"      ... and {rest:,} smaller tensor{'' if rest == 1 else 's'} of this kind, not listed"
                )
        dominant = self.dominant
        if dominant is not None:
            lines.append(f"  remedy: {REMEDIES[dominant]}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        dominant = self.dominant
        return {
            "peak_bytes": self.peak_bytes,
            "categories": dict(self.categories),
            "largest": {
                name: [{"bytes": nbytes, "what": what} for nbytes, what in items]
                for name, items in self.largest.items()
            },
            "not_listed": dict(self.not_listed),
            "dominant": dominant,
            "remedy": REMEDIES[dominant] if dominant is not None else None,
            "timeline": {
                "times_us": list(self.times_us),
                "categories": {name: list(values) for name, values in self.timeline.items()},
            },
        }


def breakdown(kineto_results: Any, device: str = "cpu") -> PeakBreakdown | None:
    """The breakdown of the peak on ``device`` in a finished profile's results, or None where the
    memory profiler cannot read them."""
    from torch.profiler import _memory_profiler as memory_profiler

    profile = memory_profiler.MemoryProfile(kineto_results)
    producers = _producers(profile)
    category = _categorizer(memory_profiler, profile._categories, producers)
    wanted = _torch_device(device)
    timeline: list[Any] = [entry for entry in profile.timeline if entry[2][0].device == wanted]
    action = memory_profiler.Action
    start, peak, peak_index = _peak(timeline, action)
    points, at_peak, peak_totals = _replay(timeline, action, category, peak_index)
    if peak_index < 0:
        return PeakBreakdown(0, {name: 0 for name in CATEGORIES})
    preexisting = {(key, version) for _, kind, (key, version), _ in timeline if kind == action.PREEXISTING}
    largest, not_listed = _largest(at_peak, preexisting, category, producers)
    ordered = dict(sorted(peak_totals.items(), key=lambda item: -item[1]))
    result = PeakBreakdown(peak - start, ordered, largest, not_listed)
    if points:
        result.times_us, result.timeline = _thinned(points)
    return result


def _category_names(memory_profiler: Any) -> dict[Any, str]:
    """The name this module gives each of torch's memory profiler categories."""
    category = memory_profiler.Category
    return {
        category.ACTIVATION: "activations",
        category.GRADIENT: "gradients",
        category.OPTIMIZER_STATE: "optimizer state",
        category.PARAMETER: "parameters",
        category.INPUT: "inputs",
        category.TEMPORARY: "temporaries",
        category.AUTOGRAD_DETAIL: "autograd detail",
    }


def _producers(profile: Any) -> dict[tuple[Any, int], Any]:
    """The profiler event that made each version of each tensor."""
    producers: dict[tuple[Any, int], Any] = {}
    for node in profile._data_flow_graph.flow_nodes:
        for key, version in node.outputs.items():
            producers[(key, version)] = node._event
    return producers


def _categorizer(
    memory_profiler: Any, categories: Any, producers: dict[tuple[Any, int], Any]
) -> Callable[[Any, int], str]:
    """The function that names the category of a tensor's version, activations made without autograd
    counted as temporaries."""
    names = _category_names(memory_profiler)

    def category(key: Any, version: int) -> str:
        found = categories.get(key, version) if isinstance(key, memory_profiler.TensorKey) else None
        name = names.get(found, "uncategorized") if found is not None else "uncategorized"
        if name == "activations" and _made_without_autograd(producers.get((key, version))):
            return "temporaries"  # computed forward without autograd: nothing saved for backward
        return name

    return category


def _made_without_autograd(event: Any) -> bool:
    """Whether a producer event recorded no autograd node (a negative sequence number)."""
    sequence = getattr(event.typed[1], "sequence_number", 0) if event is not None else 0
    return sequence is not None and sequence < 0


def _peak(timeline: list[Any], action: Any) -> tuple[int, int, int]:
    """The memory at the start, its highest level, and the index of the event that reached it (-1
    where it never rose above the start)."""
    start = sum(size for _, kind, _, size in timeline if kind == action.PREEXISTING)
    level, peak, peak_index = start, start, -1
    for index, (_, kind, _, size) in enumerate(timeline):
        if kind == action.CREATE:
            level += size
        elif kind == action.DESTROY:
            level -= size
        if level > peak:
            peak, peak_index = level, index
    return start, peak, peak_index


def _replay(
    timeline: list[Any], action: Any, category: Callable[[Any, int], str], peak_index: int
) -> tuple[list[tuple[int, dict[str, int]]], dict[tuple[Any, int], int], dict[str, int]]:
    """The memory by category above the start after each timed event, the tensors alive at the peak,
    and the memory by category above the start at the peak."""
    alive: dict[tuple[Any, int], int] = {}
    totals = dict.fromkeys(CATEGORIES, 0)
    base = dict.fromkeys(CATEGORIES, 0)
    points: list[tuple[int, dict[str, int]]] = []
    at_peak: dict[tuple[Any, int], int] = {}
    peak_totals: dict[str, int] = {}
    for index, (time_ns, kind, (key, version), size) in enumerate(timeline):
        if kind in (action.PREEXISTING, action.CREATE):
            alive[(key, version)] = size
            totals[category(key, version)] += size
            if kind == action.PREEXISTING:
                base[category(key, version)] += size
        elif kind == action.INCREMENT_VERSION:
            alive.pop((key, version), None)
            alive[(key, version + 1)] = size
            totals[category(key, version)] -= size
            totals[category(key, version + 1)] += size
        elif kind == action.DESTROY:
            alive.pop((key, version), None)
            totals[category(key, version)] -= size
        if time_ns >= 0:
            points.append((time_ns // 1000, {name: totals[name] - base[name] for name in CATEGORIES}))
        if index == peak_index:
            at_peak = dict(alive)
            peak_totals = {name: totals[name] - base[name] for name in CATEGORIES}
    return points, at_peak, peak_totals


def _largest(
    at_peak: dict[tuple[Any, int], int],
    preexisting: set[tuple[Any, int]],
    category: Callable[[Any, int], str],
    producers: dict[tuple[Any, int], Any],
) -> tuple[dict[str, list[tuple[int, str]]], dict[str, int]]:
    """The largest tensors made during the call and alive at the peak, :data:`MAX_LARGEST` per
    category, with where each was made; and how many more each category had."""
    largest: dict[str, list[tuple[int, str]]] = {}
    not_listed: dict[str, int] = {}
    for entry, nbytes in sorted(at_peak.items(), key=lambda item: -item[1]):
        if entry in preexisting:
            continue
        name = category(*entry)
        items = largest.setdefault(name, [])
        if len(items) < MAX_LARGEST:
            items.append((nbytes, _describe(producers.get(entry), nbytes)))
        else:
            not_listed[name] = not_listed.get(name, 0) + 1
    return largest, not_listed


def _thinned(points: list[tuple[int, dict[str, int]]]) -> tuple[list[int], dict[str, list[int]]]:
    """At most about :data:`MAX_TIMELINE_POINTS` of the points, the last always kept, as times from
    the first and the series of each category that was ever non-zero."""
    stride = max(1, len(points) // MAX_TIMELINE_POINTS)
    kept = points[::stride]
    if kept[-1] is not points[-1]:
        kept.append(points[-1])
    times_us = [time - kept[0][0] for time, _ in kept]
    timeline = {
        name: [values[name] for _, values in kept] for name in CATEGORIES if any(values[name] for _, values in kept)
    }
    return times_us, timeline


def _torch_device(device: str) -> Any:
    import torch

    return torch.device(device)


def _describe(event: Any, nbytes: int) -> str:
    """``made by aten::linear in Linear, from test_model.py:15 in forward()`` for a tensor's producer."""
    if event is None:
        return "made by an operation the profiler did not record"
    text = f"made by {event.name}"
    module = site = None
    parent = event.parent
    from torch._C._profiler import _EventType

    below = None  # the Python call made from the function now looked at: its caller's line is where
    while parent is not None and (module is None or site is None):
        if parent.typed[0] == _EventType.PyCall:
            fields = parent.typed[1]
            if module is None and fields.module is not None:
                module = fields.module.cls_name
            callsite = fields.callsite  # the function entered, at its first line
            if site is None and _is_users(callsite.file_name):
                line = below.typed[1].caller.line_number if below is not None else callsite.line_number
                site = site_text((found_on_path(callsite.file_name), line, callsite.function_name))
            below = parent
        elif parent.typed[0] == _EventType.PyCCall:  # a C function (torch.ones_like) called from Python
            below = parent
        parent = parent.parent
    if module:
        text += f" in {module}"
    if site:
        text += f", from {site}"
    return text


_NOT_USERS = frozenset({"torch", "pytest_vramleak", "_pytest", "pytest", "pluggy", *sys.stdlib_module_names})


def _is_users(path: str) -> bool:
    """Whether a file the profiler names (relative to its ``sys.path`` entry, as ``torch/nn/functional.py``)
    is the user's code rather than torch's, pytest's, the standard library's or the plugin's."""
    if path.startswith(_PLUGIN_DIR):
        return False
    first = path.replace(os.sep, "/").split("/", 1)[0]
    return first.removesuffix(".py") not in _NOT_USERS and "site-packages/torch/" not in path

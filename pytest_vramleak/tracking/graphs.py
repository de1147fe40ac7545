"""Autograd history a test made and left alive: how many nodes, and which tensors keep them.

Every autograd node takes its thread's next sequence number when it is made, so the nodes a test
made on its thread are those numbered from the counter read as it began (:func:`graph_clock`).
A test keeps them alive only through tensors alive after it whose ``grad_fn`` leads to them: the
tensors read since the test began, and older ones it changed in place (an in-place operation gives
a tensor a new graph). :func:`kept_graph` follows each such tensor's graph through the nodes made
since the threshold only (older nodes' inputs are older still) and counts each node once.
Nodes are C++ objects no allocator statistic counts; :data:`NODE_BYTES` gives their number a size.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any, NamedTuple

from .census import _torch, graph_nodes, live_tensors
from .index import grad_fn_reader
from .refs import Entry, new_entry

NODE_BYTES = 700
"""Host memory an autograd node keeps once backward has freed what it saved, about: measured with
glibc's ``mallinfo2`` on a two-layer MLP step (4.9 KB for 7 nodes). Nodes are C++ objects that no
allocator statistic counts; this turns their number into a size a person can weigh."""

MAX_GRAPH_ROOTS = 3
"""Tensors kept as the holders of a kept autograd history (the ones that keep the most nodes)."""


class KeptGraph(NamedTuple):
    """Autograd nodes a test made that tensors alive after it keep: how many, and which tensors
    keep most of them (weak references, with their node counts)."""

    nodes: int
    roots: list[tuple[weakref.ref[Any], int]]

    @property
    def estimated_bytes(self) -> int:
        return self.nodes * NODE_BYTES


def graph_clock(torch: Any) -> int | None:
    """This thread's autograd sequence counter, or None where torch does not say it.

    Every autograd node takes its thread's next number when it is made, so a counter that moved
    means the thread built graphs; where it cannot be read, every observation compares the
    gradients (see :mod:`pytest_vramleak.tracking.watches`)."""
    peek = getattr(torch._C._autograd, "_get_sequence_nr", None)
    try:
        return int(peek()) if peek is not None else None
    except Exception:
        return None


def count_nodes(node: Any, threshold: int, visited: set[int], keep: list[Any], before: int | None = None) -> int:
    """Nodes under ``node`` numbered ``threshold`` or later (made since then on this thread), each
    counted once overall; older nodes are neither counted nor followed (their inputs are older
    still). ``AccumulateGrad`` nodes belong to their leaves and are not counted. With ``before``,
    nodes numbered from it on are followed but not counted (a step check's current step)."""
    accumulate = _torch()._C._functions.AccumulateGrad
    end = 1 << 63 if before is None else before

    def number(current: Any) -> int:
        return -1 if type(current) is accumulate else _sequence_number(current)

    def made_since(current: Any) -> bool:
        return threshold <= number(current) < 1 << 63

    return sum(threshold <= number(current) < end for current in graph_nodes([node], visited, keep, follow=made_since))


def _sequence_number(node: Any) -> int:
    try:
        number: int = node._sequence_nr()
    except Exception:
        return -1
    return number


def _tracing_tensor_types() -> tuple[type, ...]:
    """The tensors torch.compile traces with (fake and functional tensors), where torch loaded
    them: they hold no memory, and the autograd nodes they keep are the compiler's caches'. (Read
    each time, not cached: a torch that loads them later than the first check has them then.)"""
    found = []
    for module_name, class_name in (
        ("torch._subclasses.fake_tensor", "FakeTensor"),
        ("torch._subclasses.functional_tensor", "FunctionalTensor"),
    ):
        module = sys.modules.get(module_name)
        kind = getattr(module, class_name, None) if module is not None else None
        if isinstance(kind, type):
            found.append(kind)
    return tuple(found)


def kept_graph(roots: list[Entry], threshold: int | None, before: int | None = None) -> KeptGraph:
    """The autograd nodes made since ``threshold`` (this thread's counter), and before ``before``
    where given, that the live tensors of ``roots`` keep."""
    if threshold is None:
        return KeptGraph(0, [])
    grad_fn = grad_fn_reader()
    traced = _tracing_tensor_types()
    visited: set[int] = set()
    keep: list[Any] = []
    counted: list[tuple[weakref.ref[Any], int]] = []
    nodes: list[tuple[int, weakref.ref[Any], Any]] = []
    try:
        for entry in roots:
            tensor = entry()
            if tensor is None or (traced and issubclass(type(tensor), traced)):
                continue
            try:
                node = grad_fn(tensor)
            except Exception:
                continue
            if node is not None:
                nodes.append((_sequence_number(node) if before is not None else 0, entry, node))
            del tensor
        if before is not None:
            # A node shared by several tensors is credited to the first counted. A step's
            # carried state is made after its temporaries (the sum after the loss added to it,
            # the new weight after the loss and gradient that made it): latest first.
            nodes.sort(key=lambda item: -item[0])
        for _, ref, node in nodes:
            found = count_nodes(node, threshold, visited, keep, before)
            if found:
                counted.append((ref, found))
    finally:
        nodes.clear()
        keep.clear()
    counted.sort(key=lambda item: -item[1])
    return KeptGraph(sum(found for _, found in counted), counted[:MAX_GRAPH_ROOTS])


def young_graph(threshold: int | None, before: int | None = None) -> KeptGraph:
    """:func:`kept_graph` through the tensors made since the heap was frozen, found by one
    traversal of the young objects without indexing them (an allocator counts the memory)."""
    if threshold is None:
        return KeptGraph(0, [])
    found = live_tensors()
    entries = []
    try:
        for obj in found:
            try:
                entries.append(new_entry(obj))
            except TypeError:
                continue
    finally:
        found.clear()
    return kept_graph(entries, threshold, before)

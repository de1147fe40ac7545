"""Naming many alike tensors: a sample of each kind is named, the rest counted into its group."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from pytest_vramleak.holders.naming import ALIKE_SAMPLED, NAMED_EACH, _count_in, _sample_alike
from pytest_vramleak.holders.snapshot import TensorGroup


def _refs(count: int) -> list[Any]:
    """Storages at pointers 1 to ``count``, first seen at the clock of their pointer's parity."""
    return [SimpleNamespace(device="cpu", pointer=index + 1, nbytes=16, born=(index + 1) % 2) for index in range(count)]


def _sampled(tensors: list[Any], part: Any = None, sited: set[int] | None = None) -> tuple[list[Any], list[Any], Any]:
    refs = _refs(len(tensors))
    tracker = SimpleNamespace(sole_users=lambda asked: list(tensors))
    named, alike = _sample_alike(tracker, refs, part, sited or set())  # type: ignore[arg-type]
    return refs, named, alike


def test_few_storages_are_each_named() -> None:
    refs, named, alike = _sampled([torch.ones(4) for _ in range(NAMED_EACH)])
    assert named == [(ref.device, ref.pointer) for ref in refs]
    assert alike == []


def test_the_newest_of_each_kind_are_named_and_the_rest_counted_into_their_group() -> None:
    many = NAMED_EACH + 10
    refs, named, alike = _sampled([torch.ones(4) for _ in range(many)] + [torch.ones(2), None])
    newest = [("cpu", pointer) for pointer in range(many - ALIKE_SAMPLED + 1, many + 1)]
    assert named == [*newest, ("cpu", many + 1), ("cpu", many + 2)]  # (the lone tensor; a storage no one tensor uses)
    ((sample, rest),) = alike
    assert sample == newest and [ref.pointer for ref in rest] == list(range(1, many - ALIKE_SAMPLED + 1))
    group = TensorGroup("float32", (4,), "cpu", bytes=16 * ALIKE_SAMPLED, count=ALIKE_SAMPLED, keys=list(sample))
    lone = TensorGroup("float32", (2,), "cpu", bytes=8, count=1, keys=[("cpu", many + 1)])
    assert _count_in([group, lone], alike)
    assert (group.count, group.bytes, group.sites_not_looked_up) == (many, 16 * many, len(rest))
    assert len(group.keys) == many and lone.count == 1


def test_the_sample_takes_the_tensors_whose_sites_were_captured_first() -> None:
    many = NAMED_EACH + 10
    sited = {1, 2, 3, 100}  # (data pointers)
    _, named, alike = _sampled([torch.ones(4) for _ in range(many)], sited=sited)
    newest = [("cpu", pointer) for pointer in range(many - ALIKE_SAMPLED + len(sited) + 1, many + 1)]
    assert named == [("cpu", pointer) for pointer in sorted(sited)] + newest
    ((sample, rest),) = alike
    assert sample == named and len(rest) == many - ALIKE_SAMPLED


def test_each_run_is_sampled_apart() -> None:
    many = NAMED_EACH + 10
    _, named, alike = _sampled(
        [torch.ones(4) for _ in range(many)], part=lambda key: key[1] % 2
    )  # (by when first seen)
    assert len(named) == 2 * ALIKE_SAMPLED
    assert sorted(len(rest) for _, rest in alike) == [many // 2 - ALIKE_SAMPLED] * 2


def test_a_sample_named_in_two_groups_counts_nothing_in() -> None:
    _, _, alike = _sampled([torch.ones(4) for _ in range(NAMED_EACH + 10)])
    ((sample, _),) = alike
    half = ALIKE_SAMPLED // 2
    held = TensorGroup("float32", (4,), "cpu", count=half, keys=list(sample[:half]))
    saved = TensorGroup("float32", (4,), "cpu", count=half, keys=list(sample[half:]), kind="graph")
    assert not _count_in([held, saved], alike)
    assert (held.count, saved.count, held.sites_not_looked_up) == (half, half, 0)
    whole_graph = TensorGroup("float32", (4,), "cpu", count=ALIKE_SAMPLED, keys=list(sample), kind="graph")
    assert not _count_in([whole_graph], alike)


def test_paths_the_same_way_differ_only_in_entries_and_the_numbers_of_their_roots() -> None:
    from pytest_vramleak.holders.paths import Edge, HolderPath, Root

    def figure(number: int, *edges: Edge) -> HolderPath:
        return HolderPath(Root("pyplot figure", f"pyplot figure {number} (open)", "Figure"), edges)

    locs = (Edge("attribute", "_localaxes", "list"), Edge("item", "0", "Axes"), Edge("attribute", "locs", "ndarray"))
    assert figure(8, *locs).way() == figure(10, *locs).way()
    state = HolderPath(Root("module", "test_it", "module", name="test_it"), (Edge("attribute", "STATE", "dict"),))
    assert state.with_edge(Edge("item", "'a'")).way() == state.with_edge(Edge("item", "'b'")).way()
    assert state.with_edge(Edge("item", "'a'")).way() != state.with_edge(Edge("attribute", "a")).way()
    assert figure(8, *locs).way() != figure(8, *locs[:2]).way()

"""The naming pipeline that whole-test and step checks share: group what leaked, name its holders,
and say which groups no test is charged for, each from the holder paths' data."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..tracking.census import StorageKey, _torch, collections_paused, storage_key
from ..tracking.sites import SiteSource, groups_of
from ..tracking.tracker import NODE_BYTES, StorageRef, Tracker
from .diagnosis import all_from, diagnose, held_by_torch_cache
from .edges import NamedRoot
from .paths import PYTEST_LISTS
from .snapshot import TensorGroup, describe, describe_history

__all__ = [
    "held_by_threads",
    "held_by_torch_cache",
    "held_in_cpp_only",
    "held_by_pytest_warnings",
    "held_by_the_failure",
    "held_in_cpp_on_frozen_cycles",
    "kept_by_pytest_lists",
    "name_storages",
]


def name_storages(
    tracker: Tracker,
    device: str,
    refs: Sequence[StorageRef],
    graph_roots: Sequence[tuple[Any, int]],
    *,
    sites: SiteSource | None,
    named: Sequence[NamedRoot],
    collected: bool = False,
    part: Callable[[StorageKey], Any] | None = None,
) -> tuple[list[TensorGroup], list[TensorGroup]]:
    """Group and name ``refs`` (storages still alive), then the tensors in ``graph_roots`` (weak
    references, each with the autograd nodes it keeps) as kept autograd history: the groups, and
    the history groups. A tensor already named among the storages, or held only where a group of
    saved tensors names its holder, says it keeps its graph already: it gets no history group.
    With ``part`` see :func:`~.snapshot.describe`."""
    # (an object or more per storage named or counted in, 10^5 and more: no collection of the whole
    # heap, unfrozen for naming, is set off on the way)
    with collections_paused():
        live = [ref for ref in refs if ref() is not None]
        keys = [(ref.device, ref.pointer) for ref in live]
        wanted = set(keys)
        captured = getattr(sites, "captured_pointers", None)
        sampled, alike = _sample_alike(tracker, live, part, captured() if captured is not None else set())
        roots = [(t, nodes) for t, nodes in ((ref(), nodes) for ref, nodes in graph_roots) if t is not None]
        roots = [(t, nodes) for t, nodes in roots if (storage_key(t) or ((None, 0), 0))[0] not in wanted]
        try:
            with tracker.unfrozen():  # naming holders needs the whole heap
                groups = (
                    describe(sampled, device, sites=sites, named=named, collected=collected, part=part) if keys else []
                )
                # (where the sample of a kind of tensor told it apart, each is named)
                if alike and not _count_in(groups, alike):
                    groups = describe(keys, device, sites=sites, named=named, collected=collected, part=part)
                history = (
                    describe_history(roots, device, node_bytes=NODE_BYTES, named=named, collect=False) if roots else []
                )
        finally:
            roots.clear()
        return groups, _history_not_named(groups, history)


NAMED_EACH = 2_000
"""Storages named one by one: where the runs keep more, those that alike tensors use (one
storage each, of one dtype, shape, device, class and run) are named for a sample of each kind,
and the rest counted in with the sample's group."""
ALIKE_SAMPLED = 8
"""Tensors of each kind named where more are kept (more than a report shows: see
:data:`~pytest_vramleak.reporting.report.HOLDERS_SAMPLED`)."""

_Alike = list[tuple[list[StorageKey], list[StorageRef]]]


def _sample_alike(
    tracker: Tracker, refs: list[StorageRef], part: Callable[[StorageKey], Any] | None, sited: set[int]
) -> tuple[list[StorageKey], _Alike]:
    """The keys of ``refs`` to name one by one (in the order given), and, for each kind of alike
    tensors of which more are kept than :data:`ALIKE_SAMPLED`, the keys of the sample named and
    the storages left to count in (see :data:`NAMED_EACH`). A kind's sample is its newest
    storages whose sites were captured (their data pointers are ``sited``), then its newest."""
    keys = [(ref.device, ref.pointer) for ref in refs]
    if len(refs) <= NAMED_EACH:
        return keys, []
    known, each = _kinds(tracker, refs, keys, part)
    named = set(range(len(refs))) - known  # (a storage no one tensor alone uses)
    alike: _Alike = []
    for members in each:
        sample = _sample_of(members, refs, sited)
        named.update(sample)
        if len(sample) < len(members):
            taken = set(sample)
            rest = [refs[index] for index in members if index not in taken]
            alike.append(([keys[index] for index in sorted(sample)], rest))
    return [keys[index] for index in sorted(named)], alike


def _kinds(
    tracker: Tracker, refs: list[StorageRef], keys: list[StorageKey], part: Callable[[StorageKey], Any] | None
) -> tuple[set[int], list[list[int]]]:
    """The positions of the storages one tensor alone uses, and those positions by kind of tensor
    (class, dtype, shape, device) and part, each kind's in the order given."""
    tensors = tracker.sole_users(refs)
    known = [index for index, tensor in enumerate(tensors) if tensor is not None]
    users = [tensors[index] for index in known]
    tensors.clear()
    torch = _torch()
    try:
        with torch._C.DisableTorchFunction(), collections_paused():
            kinds = groups_of(users, torch._C.TensorBase)
    finally:
        users.clear()
    born: dict[Any, list[int]] = {}  # (a part is told by when its storages were first seen: asked once a clock)
    for index, kind in zip(known, kinds, strict=True):
        born.setdefault((kind, refs[index].born), []).append(index)
    each: dict[Any, list[int]] = {}
    for (kind, _), members in born.items():
        each.setdefault((kind, part(keys[members[0]]) if part is not None else None), []).extend(members)
    for members in each.values():
        members.sort()  # (in the order given: the newest last)
    return set(known), list(each.values())


def _sample_of(members: list[int], refs: list[StorageRef], sited: set[int]) -> list[int]:
    """The :data:`ALIKE_SAMPLED` of a kind's members to name: the newest whose sites were
    captured, then the newest."""
    if len(members) <= ALIKE_SAMPLED:
        return members
    sample = [index for index in members if refs[index].pointer in sited][-ALIKE_SAMPLED:]
    if len(sample) < ALIKE_SAMPLED:
        taken = set(sample)
        sample += [index for index in members if index not in taken][len(sample) - ALIKE_SAMPLED :]
    return sample


def _count_in(groups: list[TensorGroup], alike: _Alike) -> bool:
    """Count each kind's storages left out into the group its sample was named in, where the whole
    sample is in one group of tensors or gradients; whether every kind's was (else none is)."""
    group_of = {key: group for group in groups for key in group.keys}
    into = []
    for sample, rest in alike:
        group = group_of.get(sample[0])
        if (
            group is None
            or group.kind not in ("tensor", "grad")
            or any(group_of.get(key) is not group for key in sample)
        ):
            return False
        into.append((group, rest))
    for group, rest in into:
        if group.with_graph == group.count:  # (a sample of one kind: the rest are alike)
            group.with_graph += len(rest)
        group.bytes += sum(ref.nbytes for ref in rest)
        group.count += len(rest)
        group.keys += [(ref.device, ref.pointer) for ref in rest]
        group.sites_not_looked_up += len(rest)
    return True


def _history_not_named(groups: list[TensorGroup], history: list[TensorGroup]) -> list[TensorGroup]:
    """The history groups a group of saved tensors does not name already (a path that names no
    holder, as held from C++, tells no two tensors apart). Where a kept history is a gradient's
    (backward(create_graph=True)), the graphs nothing in Python holds are the gradients'."""
    if not history:
        return history
    graph_holders = {path for group in groups if group.kind == "graph" for path in group.holders if not path.opaque}
    if any(group.grad_graph for group in history):
        for group in groups:
            if group.kind == "graph" and group.holders and all(path.opaque for path in group.holders):
                group.grad_graph = True
                group.diagnoses = diagnose(group)
    return [group for group in history if not set(group.holders) <= graph_holders]


def held_in_cpp_only(group: TensorGroup) -> bool:
    """Whether PyTorch itself keeps the group: nothing Python can reach holds it (no Python
    reference, no autograd node Python holds, or only a reference cycle kept from outside gc), and
    torch made it: a storage object kept without a
    tensor (torch makes those as it traces, scripts or converts), or tensors the recorded run saw
    torch's own code make. Tensors the user's code made that torch keeps for it (a scripted
    module's attributes, kept each time it is scripted), or whose maker is not known, stay the
    test's."""
    if group.kind not in ("tensor", "grad", "storage") or not group.unreached_from_python:
        return False
    return group.kind == "storage" or group.made_inside_library is True


def held_in_cpp_on_frozen_cycles(group: TensorGroup) -> bool:
    """Whether the group is PyTorch's as :func:`held_in_cpp_only` says, each holder a reference
    cycle found while the suite had frozen the heap (garbage frozen with it, or kept from C++)."""
    return held_in_cpp_only(group) and all_from(group, "frozen cycle")


def held_by_threads(group: TensorGroup, threads: set[int]) -> bool:
    """Whether only the frames of ``threads`` (by ident) hold the group."""
    return bool(group.holders) and all(
        path.root.kind == "thread local" and path.root.thread_id in threads for path in group.holders
    )


def held_by_the_failure(group: TensorGroup) -> bool:
    """Whether only the frames of the test's own failure hold the group (kept with its traceback,
    by pytest or a plugin: a failing test is judged on what remains once its traceback is let go)."""
    return all_from(group, "failure")


def held_by_pytest_warnings(group: TensorGroup) -> bool:
    """Whether only the warnings pytest recorded hold the group (a warning the test raised with a
    tensor among its arguments, kept for the warnings summary: pytest's, as its log records are)."""
    return all_from(group, "pytest warnings")


def kept_by_pytest_lists(group: TensorGroup) -> bool:
    """Whether only pytest's lists that gain an entry with every run (record_property values,
    recorded warnings) hold the group."""
    return bool(group.holders) and all(path.root.kind in PYTEST_LISTS for path in group.holders)

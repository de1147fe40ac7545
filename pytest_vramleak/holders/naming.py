"""The naming pipeline that whole-test and step checks share: group what leaked, name its holders,
and say which groups no test is charged for, each from the holder paths' data."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..tracking.census import StorageKey, storage_key
from ..tracking.sites import SiteSource
from ..tracking.tracker import NODE_BYTES, StorageRef, Tracker
from .diagnosis import diagnose, held_by_torch_cache
from .edges import NamedRoot
from .paths import PYTEST_LISTS
from .snapshot import TensorGroup, describe, describe_history

__all__ = [
    "held_by_threads",
    "held_by_torch_cache",
    "held_in_cpp_only",
    "held_by_pytest_warnings",
    "held_by_the_failure",
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
    keys = [(ref.device, ref.pointer) for ref in refs if ref() is not None]
    wanted = set(keys)
    roots = [(tensor, nodes) for tensor, nodes in ((ref(), nodes) for ref, nodes in graph_roots) if tensor is not None]
    roots = [(tensor, nodes) for tensor, nodes in roots if (storage_key(tensor) or ((None, 0), 0))[0] not in wanted]
    try:
        with tracker.unfrozen():  # naming holders needs the whole heap
            groups = describe(keys, device, sites=sites, named=named, collected=collected, part=part) if keys else []
            history = (
                describe_history(roots, device, node_bytes=NODE_BYTES, named=named, collect=False) if roots else []
            )
    finally:
        roots.clear()
    return groups, _history_not_named(groups, history)


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
    reference, no autograd node Python holds), and torch made it: a storage object kept without a
    tensor (torch makes those as it traces, scripts or converts), or tensors the recorded run saw
    torch's own code make. Tensors the user's code made that torch keeps for it (a scripted
    module's attributes, kept each time it is scripted), or whose maker is not known, stay the
    test's."""
    if group.kind not in ("tensor", "grad", "storage") or not group.held_from_cpp_alone:
        return False
    return group.kind == "storage" or group.made_inside_library is True


def held_by_threads(group: TensorGroup, threads: set[int]) -> bool:
    """Whether only the frames of ``threads`` (by ident) hold the group."""
    return bool(group.holders) and all(
        path.root.kind == "thread local" and path.root.thread_id in threads for path in group.holders
    )


def held_by_the_failure(group: TensorGroup) -> bool:
    """Whether only the frames of the test's own failure hold the group (kept with its traceback,
    by pytest or a plugin: a failing test is judged on what remains once its traceback is let go)."""
    return bool(group.holders) and all(path.root.kind == "failure" for path in group.holders)


def held_by_pytest_warnings(group: TensorGroup) -> bool:
    """Whether only the warnings pytest recorded hold the group (a warning the test raised with a
    tensor among its arguments, kept for the warnings summary: pytest's, as its log records are)."""
    return bool(group.holders) and all(path.root.kind == "pytest warnings" for path in group.holders)


def kept_by_pytest_lists(group: TensorGroup) -> bool:
    """Whether only pytest's lists that gain an entry with every run (record_property values,
    recorded warnings) hold the group."""
    return bool(group.holders) and all(path.root.kind in PYTEST_LISTS for path in group.holders)

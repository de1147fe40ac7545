"""A census of the tensor storages alive in the process, counted once each.

gc sees Python tensor objects, but not everything that keeps storage alive: gradients live in
C++ until Python asks for them, and the tensors an autograd graph saves for backward are reachable
only through ``grad_fn`` nodes. The census walks all three, and counts each storage once (keyed by
device and data pointer), because a small view of a big tensor keeps the whole storage alive.

Nothing here touches an object through its Python class: tensors are recognised by ``type()``, and
their storage is read with subclass ``__torch_function__`` overrides disabled, so no user code runs.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

StorageKey = tuple[str, int]
"""A storage's identity while it lives: its device (``"cpu"``, ``"cuda:0"``) and data pointer."""

# Weak keys: a strong reference to a class would keep its module, and every tensor the module
# holds, alive after the test that defined it is gone.
_tensor_type_cache: weakref.WeakKeyDictionary[type, bool] = weakref.WeakKeyDictionary()
_saved_names_cache: weakref.WeakKeyDictionary[type, tuple[str, ...]] = weakref.WeakKeyDictionary()


def _torch() -> Any:
    import torch

    return torch


def is_tensor_type(cls: type) -> bool:
    """Whether ``cls`` is ``torch.Tensor`` or a subclass, decided once per class without ``isinstance``.

    ``isinstance(o, Tensor)`` reads ``o.__class__``, which a proxy or a lazy module can override to run
    arbitrary code; ``issubclass`` on ``type(o)`` cannot.
    """
    known = _tensor_type_cache.get(cls)
    if known is None:
        try:
            known = issubclass(cls, _torch()._C.TensorBase)
        except Exception:
            known = False
        _tensor_type_cache[cls] = known
    return known


FREEZERS: weakref.WeakSet[Any] = weakref.WeakSet()
"""Trackers that froze the heap; each indexes the tensors created since before it is unfrozen."""


@contextmanager
def whole_heap() -> Iterator[None]:
    """Make every object visible to gc's listings for a while, frozen ones included.

    ``gc.get_objects()`` and ``gc.get_referrers()`` skip objects frozen with ``gc.freeze()``: inside
    a checked test (or a suite that freezes its heap) a census or a holder search would miss them.
    The heap is unfrozen meanwhile and frozen again after; trackers that froze it index the
    tensors created since first, so their next measurement still finds every tensor.
    """
    if gc.get_freeze_count() == 0:
        yield
        return
    for tracker in list(FREEZERS):
        tracker.index_young()
    gc.unfreeze()
    try:
        yield
    finally:
        gc.freeze()


def tensor_types() -> list[type]:
    """``torch.Tensor`` and every subclass of it defined so far."""
    found: list[type] = []
    pending: list[type] = [_torch().Tensor]
    while pending:
        cls = pending.pop()
        if cls not in found:
            found.append(cls)
            pending.extend(type.__subclasses__(cls))
    return found


def live_tensors() -> list[Any]:
    """Every tensor gc tracks (in the unfrozen generations), found in one C-level heap traversal.

    An instance of a class defined in Python refers to its class, so the tensors are among the
    referrers of the tensor classes; that traversal runs in C, where a Python loop over every
    object in the heap is several times slower.
    """
    classes = tensor_types()
    exact = set(classes)
    referrers = gc.get_referrers(*classes)
    try:
        return [obj for obj in referrers if type(obj) in exact]
    finally:
        del referrers


@dataclass(frozen=True)
class Found:
    """One tensor the census met, and how it was reached."""

    key: StorageKey
    nbytes: int
    tensor: Any
    via: str = "gc"
    """``"gc"`` for a Python-visible tensor, ``"grad"`` for a gradient, ``"graph"`` for a saved tensor."""
    owner: Any = None
    """For ``"grad"`` and ``"graph"``: the Python-visible tensor that keeps this one alive."""


def storage_key(tensor: Any) -> tuple[StorageKey, int] | None:
    """The key and size of ``tensor``'s storage, or None where it has none (sparse, meta, wrappers)."""
    torch = _torch()
    try:
        with torch._C.DisableTorchFunctionSubclass():
            storage = torch._C.TensorBase.untyped_storage(tensor)
            pointer = storage.data_ptr()
            nbytes = storage.nbytes()
            device = str(storage.device)
    except Exception:
        return None
    if pointer == 0 or nbytes == 0:
        return None
    return (device, pointer), nbytes


def _saved_names(node: Any) -> tuple[str, ...]:
    cls = type(node)
    names = _saved_names_cache.get(cls)
    if names is None:
        # AccumulateGrad's ``variable`` is the leaf the graph accumulates into, kept alive by it.
        names = tuple(n for n in dir(cls) if n.startswith("_saved_") or n in ("saved_tensors", "variable"))
        _saved_names_cache[cls] = names
    return names


def _graph_tensors(root: Any, visited: set[int], keep: list[Any]) -> Iterator[Any]:
    """Tensors saved for backward by the graph under ``root``, each node visited once overall.

    ``keep`` holds every node visited so that ids stay unique while the walk lasts.
    """
    stack = [root]
    while stack:
        node = stack.pop()
        if node is None or id(node) in visited:
            continue
        visited.add(id(node))
        keep.append(node)
        for name in _saved_names(node):
            try:
                value = getattr(node, name)
            except Exception:  # freed by backward(), or not a tensor slot
                continue
            if type(value) in (tuple, list):
                yield from (v for v in value if is_tensor_type(type(v)))
            elif is_tensor_type(type(value)):
                yield value
        try:
            stack.extend(child for child, _ in node.next_functions)
        except Exception:
            continue


def walk(device: str | None = None, *, defer_owners: frozenset[int] | set[int] = frozenset()) -> Iterator[Found]:
    """Yield every live tensor storage on ``device`` (all devices if None), with a tensor that uses it.

    Tensors Python sees come first, then their gradients and the tensors their autograd graphs
    saved. A graph shared by several tensors is walked once and credited to the first of them;
    tensors whose ids are in ``defer_owners`` are credited last. A storage may be yielded more
    than once (views, saved copies of a live tensor); callers dedupe by key. Found items hold
    strong references: drop them before the caller returns.
    """
    torch = _torch()
    visited_nodes: set[int] = set()
    keep_nodes: list[Any] = []
    graph_roots: list[tuple[Any, Any]] = []

    def on_device(found: tuple[StorageKey, int] | None) -> bool:
        return found is not None and (device is None or found[0][0] == device)

    try:
        for obj in gc.get_objects():
            if not is_tensor_type(type(obj)):
                continue
            found = storage_key(obj)
            if found is not None and on_device(found):
                yield Found(found[0], found[1], obj)
            with torch._C.DisableTorchFunctionSubclass():
                try:
                    is_leaf = obj.is_leaf
                    grad = obj._grad if (is_leaf or obj.retains_grad) else None
                    grad_fn = obj.grad_fn
                except Exception:
                    continue
            if grad is not None:
                found = storage_key(grad)
                if found is not None and on_device(found):
                    yield Found(found[0], found[1], grad, "grad", obj)
            if grad_fn is not None:
                graph_roots.append((obj, grad_fn))
        graph_roots.sort(key=lambda root: id(root[0]) in defer_owners)
        for owner, grad_fn in graph_roots:
            for saved in _graph_tensors(grad_fn, visited_nodes, keep_nodes):
                found = storage_key(saved)
                if found is not None and on_device(found):
                    yield Found(found[0], found[1], saved, "graph", owner)
    finally:
        keep_nodes.clear()
        graph_roots.clear()


@dataclass
class Census:
    """Live storages by key, with their sizes. Holds no reference to any tensor."""

    device: str | None
    storages: dict[StorageKey, int] = field(default_factory=dict)
    identities: dict[StorageKey, weakref.ref[Any]] = field(default_factory=dict)
    """Weak references to the storage objects, to tell a storage from a later one at the same address."""

    @property
    def total_bytes(self) -> int:
        """Bytes of all storages counted, each once."""
        return sum(self.storages.values())


def storage_ref(tensor: Any) -> weakref.ref[Any] | None:
    """A weak reference to ``tensor``'s storage object, which torch keeps while the storage lives."""
    torch = _torch()
    try:
        with torch._C.DisableTorchFunctionSubclass():
            return weakref.ref(torch._C.TensorBase.untyped_storage(tensor))
    except Exception:
        return None


def take_census(device: str | None = None, *, identify: bool = False) -> Census:
    """Count the live tensor storages on ``device`` (a string such as ``"cpu"`` or ``"cuda:0"``).

    With ``identify``, also keep a weak reference to each storage: an allocator reuses addresses,
    so a key alone cannot tell a storage from a later one at the same address.
    """
    census = Census(device)
    with whole_heap():
        found_all = list(walk(device))
    for found in found_all:
        if found.key not in census.storages:
            census.storages[found.key] = found.nbytes
            if identify:
                reference = storage_ref(found.tensor)
                if reference is not None:
                    census.identities[found.key] = reference
    found_all.clear()
    return census

"""A census of the tensor storages alive in the process, counted once each.

gc sees Python tensor objects, but not everything that keeps storage alive: gradients live in
C++ until Python asks for them, and the tensors an autograd graph saves for backward are reachable
only through ``grad_fn`` nodes. The census walks all three, and counts each storage once (keyed by
device and data pointer), because a small view of a big tensor keeps the whole storage alive.
Sparse tensors have no storage of their own: their indices and values are counted. A storage
object kept without any tensor (``t.untyped_storage()``, ``t.storage()``) is counted too.

Nothing here touches an object through its Python class: tensors are recognised by ``type()``, and
their storage is read with ``__torch_function__`` overrides and modes disabled, so no user code runs.
"""

from __future__ import annotations

import itertools
import operator
import types
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ..judging.words import Reached
from . import gc_functions as gc
from .torch_api import objects_referring_to

StorageKey = tuple[str, int]
"""A storage's identity while it lives: its device (``"cpu"``, ``"cuda:0"``) and data pointer."""

# Weak keys: a strong reference to a class would keep its module, and every tensor the module
# holds, alive after the test that defined it is gone.
_tensor_type_cache: weakref.WeakKeyDictionary[type, bool] = weakref.WeakKeyDictionary()
_saved_names_cache: weakref.WeakKeyDictionary[type, tuple[tuple[str, str], ...]] = weakref.WeakKeyDictionary()


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
    global _thawed_for_the_suite
    if not gc.frozen_by_anyone():
        yield
        return
    freezers = list(FREEZERS)
    for tracker in freezers:
        tracker.index_young()
    gc.unfreeze()
    outer = _thawed_for_the_suite
    _thawed_for_the_suite = outer or not freezers
    try:
        yield
    finally:
        _thawed_for_the_suite = outer
        gc.freeze()
        note_frozen()
        for tracker in freezers:
            tracker.refrozen()


_thawed_for_the_suite = False
_frozen_as_noted = -1


def note_frozen() -> None:
    """Note how many objects are frozen now (see :func:`frozen_since_noted`)."""
    global _frozen_as_noted
    _frozen_as_noted = gc.get_freeze_count()


def frozen_since_noted() -> bool:
    """Whether the number of frozen objects changed since :func:`note_frozen` (someone froze or
    thawed the heap: a walk of the frozen list)."""
    return gc.get_freeze_count() != _frozen_as_noted


def frozen_by_the_suite() -> bool:
    """Whether the suite itself froze the heap (``gc.freeze()`` in a test or a conftest, no tracker
    of this package's): inside :func:`whole_heap`, whether it was so as it began. Garbage frozen
    with the heap is never collected: a reference cycle nothing refers to may be that garbage."""
    return _thawed_for_the_suite or (gc.frozen_by_anyone() and not FREEZERS)


@contextmanager
def collections_paused() -> Iterator[None]:
    """Keep Python's collector from running while many objects are indexed at once.

    Indexing allocates several small objects per tensor; with the heap unfrozen, the collections
    those allocations set off walk it again and again (most of the time indexing 10^5 tensors).
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _subclasses(*roots: type) -> list[type]:
    found: list[type] = []
    pending = list(roots)
    while pending:
        cls = pending.pop()
        if cls not in found:
            found.append(cls)
            pending.extend(type.__subclasses__(cls))
    return found


def tensor_types() -> list[type]:
    """``torch.Tensor`` and every subclass of it defined so far."""
    return _subclasses(_torch().Tensor)


def storage_types() -> list[type]:
    """The Python storage classes (``UntypedStorage``, ``TypedStorage`` and the legacy typed ones)."""
    torch = _torch()
    return _subclasses(torch.UntypedStorage, torch.storage.TypedStorage)


def untyped_storage_types() -> list[type]:
    """``UntypedStorage`` and its subclasses: what indexing needs of the storage classes.

    A typed storage object keeps an untyped one that gc tracks as well, so the untyped one is
    found beside it; leaving the typed classes (some thirty legacy ones) out of a heap
    traversal's targets halves its cost.
    """
    return _subclasses(_torch().UntypedStorage)


def live_tensors() -> list[Any]:
    """Every tensor gc tracks (in the unfrozen generations), found in one C-level heap traversal.

    An instance of a class defined in Python refers to its class, so the tensors are among the
    referrers of the tensor classes; that traversal runs in C, where a Python loop over every
    object in the heap is several times slower (the fallback where torch hides that reference:
    see :func:`~pytest_vramleak.tracking.torch_api.objects_referring_to`).
    """
    classes = tensor_types()
    exact = set(classes)
    referrers = objects_referring_to(tuple(classes))
    try:
        return [obj for obj in referrers if type(obj) in exact]
    finally:
        del referrers


# The tensors a sparse layout keeps its data in, read in place of a storage it does not have.
_SPARSE_PARTS = {
    "torch.sparse_coo": ("_indices", "_values"),
    "torch.sparse_csr": ("crow_indices", "col_indices", "values"),
    "torch.sparse_bsr": ("crow_indices", "col_indices", "values"),
    "torch.sparse_csc": ("ccol_indices", "row_indices", "values"),
    "torch.sparse_bsc": ("ccol_indices", "row_indices", "values"),
}
# The layout of tensors whose memory an opaque library (oneDNN) owns: no storage, no data pointer.
_OPAQUE = "torch._mkldnn"
# A strided nested tensor keeps the sizes, strides and offsets of its components in tensors of its own.
_NESTED_PARTS = ("_nested_tensor_size", "_nested_tensor_strides", "_nested_tensor_storage_offsets")


def tensor_storages(tensor: Any) -> list[Any]:
    """The untyped storages that hold ``tensor``'s data: one for a strided tensor, the index and
    value storages of a sparse one, the buffer and metadata of a nested one, none for a wrapper
    or meta tensor. Call with torch function handling disabled."""
    base = _torch()._C.TensorBase
    try:
        storage = base.untyped_storage(tensor)
    except Exception:  # sparse tensors and wrapper subclasses have no storage to read
        try:
            layout = str(base.layout.__get__(tensor))
        except Exception:
            return []
        if layout == _OPAQUE:
            return [tensor]  # stands for its storage (see storage_facts)
        parts = _SPARSE_PARTS.get(layout)
        found = []
        for name in parts or ():
            try:
                found.append(base.untyped_storage(getattr(base, name)(tensor)))
            except Exception:
                continue
        return found
    try:
        nested = base.is_nested.__get__(tensor)
    except Exception:
        nested = False
    if not nested:
        return [storage]
    found = [storage]
    for name in _NESTED_PARTS:
        try:
            found.append(base.untyped_storage(getattr(base, name)(tensor)))
        except Exception:
            continue
    return found


def only_worth_reading(objects: list[Any], pointers: set[int]) -> list[Any]:
    """``objects`` (tensors and storage objects, as :func:`walk` goes through them) less those a
    search for the storages at ``pointers`` (data pointers) need not read: strided tensors over
    another storage, with no autograd graph and no gradient, and untyped storage objects of
    another storage. Picked by torch's getters mapped over them in C (a Python loop over the 10^5
    tensors a test keeps costs tenths of a second); every object is kept where a getter fails on
    one of them (a sparse, nested or wrapper tensor). Call with torch function handling disabled."""
    tensor_classes, storage_classes = set(tensor_types()), set(untyped_storage_types())
    is_tensor = list(map(tensor_classes.__contains__, map(type, objects)))
    is_storage = list(map(storage_classes.__contains__, map(type, objects)))
    tensors = list(itertools.compress(objects, is_tensor))
    storages = list(itertools.compress(objects, is_storage))
    torch = _torch()
    try:
        tensors_read = iter(_tensors_worth_reading(torch, tensors, pointers))
        storages_read = iter(_storages_worth_reading(torch, storages, pointers))
    except Exception:
        return list(objects)
    finally:
        tensors.clear()
        storages.clear()
    keep = [
        next(tensors_read) if tensor else next(storages_read) if storage else True
        for tensor, storage in zip(is_tensor, is_storage, strict=True)
    ]
    return list(itertools.compress(objects, keep))


def _storages_worth_reading(torch: Any, storages: list[Any], pointers: set[int]) -> list[bool]:
    """Whether each untyped storage object is at ``pointers`` (all are, where one is on the meta
    device: its data pointer is never read)."""
    base = torch._C.StorageBase
    if any(device.type == "meta" for device in set(map(base.device.__get__, storages))):
        return [True] * len(storages)
    return list(map(pointers.__contains__, map(base.data_ptr, storages)))


def _tensors_worth_reading(torch: Any, tensors: list[Any], pointers: set[int]) -> list[bool]:
    """Whether each tensor is over a storage at ``pointers``, has an autograd graph or a gradient,
    or is over the meta device (a meta tensor, or a fake tensor of ``torch.compile``'s, which says
    it is on another: their data pointer is never read, since reading it warns) or has no storage
    to read."""
    base = torch._C.TensorBase
    meta = list(map(base.is_meta.__get__, tensors))
    plain = {torch.Tensor, torch.nn.Parameter}
    # (a subclass's storage is asked for its device; where every tensor is plain, as most often, no
    # loop over them runs in Python)
    for index, tensor in enumerate(tensors) if not set(map(type, tensors)) <= plain else ():
        if not meta[index] and type(tensor) not in plain:
            try:
                meta[index] = base.untyped_storage(tensor).device.type == "meta"
            except Exception:  # (a wrapper without a storage: read the general way)
                meta[index] = True
    real = list(itertools.compress(tensors, map(operator.not_, meta))) if any(meta) else tensors
    over = map(pointers.__contains__, map(torch.UntypedStorage.data_ptr, map(base.untyped_storage, real)))
    graph = map(operator.is_not, map(base.grad_fn.__get__, real), itertools.repeat(None))
    # (a gradient is read only of a leaf or of a tensor that retains one: reading another's warns)
    may_have = map(operator.or_, map(base.is_leaf.__get__, real), map(base.retains_grad.__get__, real))
    grad = (may and base._grad.__get__(tensor) is not None for tensor, may in zip(real, may_have, strict=True))
    worth = iter(list(map(any, zip(over, graph, grad, strict=True))))
    return [True if is_meta else next(worth) for is_meta in meta]


def storage_of_storage_object(obj: Any) -> Any | None:
    """The untyped storage a Python storage object (``UntypedStorage`` or ``TypedStorage``) stands for."""
    torch = _torch()
    if issubclass(type(obj), torch.UntypedStorage):
        return obj
    namespace = type.__dict__["__dict__"].__get__(type(obj)).get("__dict__")
    try:
        values = namespace.__get__(obj) if namespace is not None else None
    except Exception:
        return None
    inner = values.get("_untyped_storage") if type(values) is dict else None
    return inner if inner is not None and issubclass(type(inner), torch.UntypedStorage) else None


def storage_facts(storage: Any, *, empty: bool = False) -> tuple[str, int, int] | None:
    """``(device, data pointer, bytes)`` of an untyped storage, or None for one that holds no
    memory (empty, unless ``empty`` asks for those too, or on the meta device, as the fake tensors
    of ``torch.compile`` are: their data pointer is never read, since reading it warns)."""
    try:
        device = storage.device
        name: Any = _device_names.get(device, _UNSEEN)
        if name is _UNSEEN:
            # str(torch.device) and its fields cost more than the rest: once per device
            name = _device_names[device] = None if device.type == "meta" else str(device)
        if name is None:
            return None
        nbytes = storage.nbytes()
        pointer = storage.data_ptr() if nbytes else 0
    except Exception:
        return _opaque_facts(storage)
    if (not pointer or not nbytes) and not (empty and not nbytes):
        return None
    return name, pointer, nbytes


def _opaque_facts(tensor: Any) -> tuple[str, int, int] | None:
    """An opaque tensor (``to_mkldnn()``) stands for the storage it does not expose: its
    TensorImpl's address for a pointer, the size of its elements for its bytes."""
    try:
        base = _torch()._C.TensorBase
        if not issubclass(type(tensor), base) or str(base.layout.__get__(tensor)) != _OPAQUE:
            return None
        nbytes = base.numel(tensor) * base.element_size(tensor)
        return str(base.device.__get__(tensor)), base._cdata.__get__(tensor), nbytes
    except Exception:
        return None


_UNSEEN = object()
_device_names: dict[Any, str | None] = {}
"""Each device met (a ``torch.device``), by name; None for the meta device."""


@dataclass(frozen=True)
class Found:
    """One tensor (or storage object) the census met, and how it was reached."""

    key: StorageKey
    nbytes: int
    tensor: Any
    via: Reached = "gc"
    """``"gc"`` for a Python-visible tensor, ``"grad"`` for a gradient, ``"graph"`` for a saved tensor,
    ``"storage"`` for a storage object kept without a tensor (``tensor`` is then that object)."""
    owner: Any = None
    """For ``"grad"`` and ``"graph"``: the Python-visible tensor that keeps this one alive."""
    storage: Any = None
    """The untyped storage object at ``key``."""
    hooks: frozenset[str] = frozenset()
    """For ``"graph"``: the names (``module.qualname``) of the ``saved_tensors_hooks`` unpack hooks met
    in the owner's graph, :data:`KEEPS_ITS_OUTPUT` where a pack hook kept an op's output, and
    :data:`SAVED_A_VIEW_OF_ITS_OUTPUT` (with the node's function) where a node saved a view of its own."""


def storage_key(tensor: Any) -> tuple[StorageKey, int] | None:
    """The key and size of ``tensor``'s (first) storage, or None where it has none (meta, wrappers)."""
    torch = _torch()
    with torch._C.DisableTorchFunction():
        for storage in tensor_storages(tensor):
            facts = storage_facts(storage)
            if facts is not None:
                return (facts[0], facts[1]), facts[2]
    return None


def _keys_of(tensor: Any) -> list[tuple[StorageKey, int, Any]]:
    found = []
    for storage in tensor_storages(tensor):
        facts = storage_facts(storage)
        if facts is not None:
            found.append(((facts[0], facts[1]), facts[2], storage))
    return found


def _saved_names(node: Any) -> tuple[tuple[str, str], ...]:
    """Each attribute under which ``node``'s class gives what it saved, with the attribute that gives
    the saved tensor itself where torch has one that tells a packed tensor apart (see :func:`_packed`)."""
    cls = type(node)
    names = _saved_names_cache.get(cls)
    if names is None:
        # AccumulateGrad's ``variable`` is the leaf the graph accumulates into, kept alive by it.
        attributes = dir(cls)
        found = [n for n in attributes if n.startswith("_saved_") or n in ("saved_tensors", "variable")]
        names = tuple((n, _raw_name(n, set(attributes))) for n in found)
        _saved_names_cache[cls] = names
    return names


def _raw_name(name: str, attributes: set[str]) -> str:
    raw = "_raw" + name if name.startswith("_saved_") else "_raw_saved_tensors" if name == "saved_tensors" else ""
    saved_tensor = getattr(getattr(_torch()._C, "_autograd", None), "SavedTensor", None)
    return raw if raw in attributes and hasattr(saved_tensor, "unpack_hook") else ""


def graph_nodes(
    roots: list[Any], visited: set[int], keep: list[Any], follow: Callable[[Any], bool] | None = None
) -> Iterator[Any]:
    """Each autograd node under ``roots``, once overall (their ids go into ``visited``).

    ``keep`` holds every node visited so that ids stay unique while the walk lasts. With
    ``follow``, the walk goes on below a node only where ``follow(node)`` is true.
    """
    stack = list(roots)
    while stack:
        node = stack.pop()
        if node is None or id(node) in visited:
            continue
        visited.add(id(node))
        keep.append(node)
        yield node
        if follow is not None and not follow(node):
            continue
        try:
            stack.extend(child for child, _ in node.next_functions)
        except Exception:
            continue


def _tensors_in(value: Any) -> Iterator[Any]:
    if type(value) in (tuple, list):
        yield from (v for v in value if is_tensor_type(type(v)))
    elif is_tensor_type(type(value)):
        yield value


def _hook_name(hook: Any) -> str:
    """``module.qualname`` of an unpack hook, read from the function or the type (a callable object's
    code is never run)."""
    function = hook.__func__ if type(hook) is types.MethodType else hook
    named = function if type(function) is types.FunctionType else type(hook)
    module, qualname = named.__module__, named.__qualname__
    return f"{module}.{qualname}" if type(module) is str and type(qualname) is str else ""


KEEPS_ITS_OUTPUT = "a pack hook kept an op's output with its grad_fn"
"""Noted among a graph's hooks (:func:`_graph_tensors`) where a pack hook returned the output of the
op that saved it with that op's ``grad_fn`` (``lambda t: t``): the graph holds its own output, a
reference cycle through C++ that Python's collector cannot break (pytorch/pytorch#115255)."""


def _keeps_its_output(node: Any, packed: Any) -> bool:
    return is_tensor_type(type(packed)) and _torch()._C.TensorBase.grad_fn.__get__(packed) is node


SAVED_A_VIEW_OF_ITS_OUTPUT = "saved a view of its own output: "
"""Noted among a graph's hooks (:func:`_graph_tensors`), followed by the node's function
(``module.qualname``), where a node saved a view of its own output for backward (a custom
``autograd.Function`` whose ``forward`` calls ``ctx.save_for_backward(out.view(-1))``): the view
keeps its base, the output, whose ``grad_fn`` keeps the view, a reference cycle through C++ that
Python's collector cannot break (pytorch/pytorch#94990). An output saved whole is no such cycle:
autograd saves it without its ``grad_fn``."""


def _saved_a_view_of_its_output(node: Any, value: Any) -> str | None:
    """The name of ``node``'s function where ``value`` (what it saved) holds a view of the node's own
    output; None where it holds none."""
    tensor_base = _torch()._C.TensorBase
    for tensor in _tensors_in(value):
        try:
            base = tensor_base._base.__get__(tensor)
            if base is None or tensor_base.grad_fn.__get__(base) is not node:
                continue
        except Exception:  # (a tensor without a base to read)
            continue
        function = getattr(type(node), "_forward_cls", type(node))  # (a custom Function's node names its class)
        module, qualname = getattr(function, "__module__", ""), getattr(function, "__qualname__", "")
        return f"{module}.{qualname}" if type(module) is str and type(qualname) is str else type(node).__name__
    return None


def _packed(node: Any, raw_name: str) -> tuple[list[str], list[Any]]:
    """The names (``module.qualname``) of the ``saved_tensors_hooks`` unpack hooks of what ``node``
    saved (``raw_name``: the attribute that gives the saved tensor itself, ``_raw_saved_x``), none
    where no pack hook packed it, and the objects the pack hooks returned, read without calling
    the unpack hooks.

    Reading ``node._saved_x`` calls the unpack hook of a hooked saved tensor, which runs user code
    and may allocate: torch.utils.checkpoint's recomputes the checkpointed forward pass and keeps
    what it made. The saved tensor's ``unpack_hook`` and ``data`` tell the hook and its packed
    object apart; where torch has neither, the saved tensor is read as it always was
    (docs/limits.md).
    """
    try:
        raw: Any = getattr(node, raw_name)
        if type(raw) not in (tuple, list):
            hook = raw.unpack_hook
            return ([], []) if hook is None else ([_hook_name(hook)], [raw.data])
        hooked = [(hook, one) for one in raw if (hook := one.unpack_hook) is not None]
        return [_hook_name(hook) for hook, _ in hooked], [one.data for _, one in hooked]
    except Exception:  # freed by backward(), or not a saved tensor slot
        return [], []


def _graph_tensors(root: Any, visited: set[int], keep: list[Any], hooks: set[str] | None = None) -> Iterator[Any]:
    """Tensors saved for backward by the graph under ``root``, each node visited once overall. Where
    a pack hook packed them, the tensors it packed (see :func:`_packed`), and the names of their
    unpack hooks go into ``hooks`` (with :data:`KEEPS_ITS_OUTPUT` where one kept an op's output, and
    :data:`SAVED_A_VIEW_OF_ITS_OUTPUT` where a node saved a view of its own)."""
    for node in graph_nodes([root], visited, keep):
        for name, raw_name in _saved_names(node):
            names, packed = _packed(node, raw_name) if raw_name else ((), ())
            if names:
                if hooks is not None:
                    hooks.update(names)
                    if any(_keeps_its_output(node, value) for value in packed):
                        hooks.add(KEEPS_ITS_OUTPUT)
                for value in packed:
                    yield from _tensors_in(value)
                continue
            try:
                value = getattr(node, name)
            except Exception:  # freed by backward(), or not a tensor slot
                continue
            if hooks is not None and (function := _saved_a_view_of_its_output(node, value)) is not None:
                hooks.add(SAVED_A_VIEW_OF_ITS_OUTPUT + function)
            yield from _tensors_in(value)


def walk(
    device: str | None = None,
    *,
    defer_owners: frozenset[int] | set[int] = frozenset(),
    objects: list[Any] | None = None,
) -> Iterator[Found]:
    """Yield every live tensor storage on ``device`` (all devices if None), with a tensor that uses it.

    Tensors Python sees come first, then storage objects kept without a tensor, then gradients and
    the tensors autograd graphs saved. A graph shared by several tensors is walked once and
    credited to the first of them; tensors whose ids are in ``defer_owners`` are credited last. A
    storage may be yielded more than once (views, saved copies of a live tensor); callers dedupe
    by key. Found items hold strong references: drop them before the caller returns.
    ``objects``: the objects to go through in place of the referrers of the tensor and storage
    classes, where the caller has listed them (every tensor and storage object gc tracks, in
    the order gc keeps them).
    """
    torch = _torch()
    storage_classes = set(storage_types())
    visited_nodes: set[int] = set()
    keep_nodes: list[Any] = []
    graph_roots: list[tuple[Any, Any]] = []
    grads: list[Found] = []

    def on_device(key: StorageKey) -> bool:
        return device is None or key[0] == device

    tensor_classes = tensor_types()
    exact = set(tensor_classes)
    try:
        with torch._C.DisableTorchFunction():
            # Tensors and storage objects refer to their classes: finding them among the classes'
            # referrers runs in C, where a Python loop over every object of the heap would not.
            for obj in objects_referring_to((*tensor_classes, *storage_classes)) if objects is None else objects:
                cls = type(obj)
                if cls in storage_classes:
                    storage = storage_of_storage_object(obj)
                    facts = storage_facts(storage) if storage is not None else None
                    if facts is not None and on_device((facts[0], facts[1])):
                        yield Found((facts[0], facts[1]), facts[2], obj, "storage", storage=storage)
                    continue
                if cls not in exact:
                    continue
                for key, nbytes, storage in _keys_of(obj):
                    if on_device(key):
                        yield Found(key, nbytes, obj, storage=storage)
                try:
                    is_leaf = obj.is_leaf
                    grad = obj._grad if (is_leaf or obj.retains_grad) else None
                    grad_fn = obj.grad_fn
                except Exception:
                    continue
                if grad is not None:
                    grads += [
                        Found(key, n, grad, "grad", obj, storage)
                        for key, n, storage in _keys_of(grad)
                        if on_device(key)
                    ]
                if grad_fn is not None:
                    graph_roots.append((obj, grad_fn))
            yield from grads
            grads.clear()
            graph_roots.sort(key=lambda root: id(root[0]) in defer_owners)
            for owner, grad_fn in graph_roots:
                hooks: set[str] = set()
                saved_tensors = list(_graph_tensors(grad_fn, visited_nodes, keep_nodes, hooks))
                met = frozenset(hooks)
                for saved in saved_tensors:
                    for key, nbytes, storage in _keys_of(saved):
                        if on_device(key):
                            yield Found(key, nbytes, saved, "graph", owner, storage, met)
                saved_tensors.clear()
    finally:
        keep_nodes.clear()
        graph_roots.clear()
        grads.clear()


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
            if identify and found.storage is not None:
                census.identities[found.key] = weakref.ref(found.storage)
    found_all.clear()
    return census

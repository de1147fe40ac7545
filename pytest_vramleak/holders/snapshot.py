"""The engine: snapshot a device's memory, diff two snapshots, and name what holds the difference.

Usable without pytest::

    from pytest_vramleak import take_snapshot, diff

    before = take_snapshot("cpu")
    train_one_epoch()
    leak = diff(before)
    if leak.leaked_bytes:
        print(leak.render())

A snapshot keeps storage keys (device and data pointer) and byte counts, never tensors, so holding
one keeps nothing of the user's alive.
"""

from __future__ import annotations

import ctypes
import datetime
import itertools
import sys
import types
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..judging.sizes import format_size
from ..judging.words import GroupKind
from ..meters.devices import Meter, make_meter, resolve_device
from ..reporting.report import HOLDERS_SAMPLED, holders_not_searched, render_groups, shape_text
from ..tracking import gc_functions as gc
from ..tracking.backward import graph_leaves
from ..tracking.census import (
    KEEPS_ITS_OUTPUT,
    Found,
    StorageKey,
    _graph_tensors,
    _keys_of,
    collections_paused,
    is_tensor_type,
    live_tensors,
    only_worth_reading,
    storage_facts,
    storage_key,
    storage_of_storage_object,
    storage_types,
    take_census,
    tensor_storages,
    tensor_types,
    walk,
    whole_heap,
)
from ..tracking.sites import SiteSource, describe_stack
from .diagnosis import diagnose, saved_views_of_outputs, through_checkpoint, user_hooks
from .paths import HELD_FROM_CPP, HELD_IN_CPP_PATH, Edge, HolderPath, own_graph_path, own_view_path
from .referrers import (
    NamedRoot,
    cycle_holding,
    holder_paths,
    hook_holdings,
    module_types,
    traceback_frames,
    type_name,
    untracked_referents,
    without_python_holders,
)

__all__ = ["HELD_FROM_CPP", "Leak", "Snapshot", "TensorGroup", "describe", "describe_history", "diff", "take_snapshot"]

MAX_CHAINS_PER_GROUP = HOLDERS_SAMPLED
SAVED_BY_THE_GRAPH = "what its autograd graph saved"
"""Said after a site of a group's tensors that is where the tensors their graph saved were made."""
STEP_FUNCTION = "the step function "
"""How a step check names the function given to ``check()`` where it holds a leak."""


def _torch() -> Any:
    import torch

    return torch


@dataclass(frozen=True)
class Snapshot:
    """A device's memory at one moment: allocated bytes and the live storages, by key and size."""

    device: str
    allocated_bytes: int
    storages: dict[StorageKey, int]
    details: dict[str, int] = field(default_factory=dict)
    identities: dict[StorageKey, weakref.ref[Any]] = field(default_factory=dict, repr=False)
    """Weak references to the storages, so a later storage at a reused address is told apart."""
    young: frozenset[StorageKey] = frozenset()
    """Storages made since a checked test's setup began (its fixtures'): their freeing never
    offsets a leak. Through a tracker that cannot tell ages every storage counts as young; in a
    snapshot taken without a tracker, none does."""

    def new_since(self, earlier: Snapshot) -> set[StorageKey]:
        """Keys of storages alive here that were not alive at ``earlier``."""
        return {key for key in self.storages if not earlier.holds_same(key, self)}

    def holds_same(self, key: StorageKey, other: Snapshot) -> bool:
        """Whether the storage ``other`` has at ``key`` is the one this snapshot saw there."""
        if key not in self.storages or key not in other.storages:
            return False
        mine, theirs = self.identities.get(key), other.identities.get(key)
        if mine is None or theirs is None:
            return True  # no identity recorded: trust the key
        return mine() is not None and mine() is theirs()

    def leaked_since(self, earlier: Snapshot) -> int:
        """Bytes by which allocated memory grew after ``earlier``.

        On accelerators, the allocator's growth (as PyTorch's own leak check measures it). On
        CPU, the bytes of storages that are new since ``earlier`` (plus in-place growth of older
        ones), less the bytes of storages older than ``earlier`` that were freed since: a test
        that replaces a tensor (a model's gradients, an entry a bounded cache evicts) leaks
        nothing. Storages in ``earlier.young`` (what a checked test's fixtures made during its
        setup) do not offset: a fixture that frees at teardown what it made cannot hide a leak.
        Earlier garbage cannot either: it is frozen while a checked test runs.
        """
        if self.device != "cpu":
            return self.allocated_bytes - earlier.allocated_bytes
        grown = 0
        for key, nbytes in self.storages.items():
            if not earlier.holds_same(key, self):
                grown += nbytes
            else:
                grown += max(0, nbytes - earlier.storages[key])
        freed = sum(
            nbytes
            for key, nbytes in earlier.storages.items()
            if key not in earlier.young and not earlier.holds_same(key, self)
        )
        return max(0, grown - freed)


@dataclass
class TensorGroup:
    """Leaked tensors of one dtype, shape and device, and what keeps them alive."""

    dtype: str
    shape: tuple[int, ...]
    device: str
    bytes: int = 0
    count: int = 0
    holders: list[HolderPath] = field(default_factory=list)
    """Each path of references that keeps a tensor of the group alive."""
    graph_bytes: int = 0
    """Bytes of tensors saved by autograd graphs that these tensors keep alive."""
    graph_tensors: int = 0
    graph_hooks: set[str] = field(default_factory=set, repr=False)
    """The names of the ``saved_tensors_hooks`` unpack hooks met in that graph (see
    :attr:`~pytest_vramleak.tracking.census.Found.hooks`)."""
    allocated_at: list[str] = field(default_factory=list)
    """Where the tensors were created (``file:line in function()``, then callers), where recorded."""
    site_bytes: dict[str, int] = field(default_factory=dict, repr=False)
    """The bytes found allocated at each of ``allocated_at``, which lists the site of the most bytes
    first where the group keeps an autograd graph (``graph_bytes``)."""
    sites_not_looked_up: int = 0
    """Tensors of the group whose site was not looked up: once it showed ``MAX_CHAINS_PER_GROUP``
    sites, the rest may have been made at any of them, or elsewhere."""
    diagnoses: list[str] = field(default_factory=list)
    """The leak patterns recognised, each with its cause and fix (see :mod:`pytest_vramleak.holders.diagnosis`)."""
    kind: GroupKind = "tensor"
    """``tensor``, ``grad`` (a gradient of a live tensor), ``graph`` (saved by an autograd graph) or
    ``storage`` (a storage object kept without a tensor)."""
    cls: str = ""
    """The tensors' class where it is a subclass of ``torch.Tensor`` (``Parameter``, a user's own)."""
    hook: str = ""
    """A module hook that holds the tensors' container (``a forward hook of a Linear``), if one does."""
    nodes: int = 0
    """For ``history``: the autograd nodes the check's code made that the tensor keeps alive."""
    with_graph: int = 0
    """Tensors of the group that carry the autograd graph that made them (a ``grad_fn``): of those
    named one by one, and the rest counted in where every one named carried one."""
    keys: list[StorageKey] = field(default_factory=list, repr=False)
    """The storages of the group (not in the JSON: they name memory, not what a reader can use)."""
    grad_fn: str = field(default="", repr=False)
    """The class of the grad_fn of the first of the group's tensors that has one (``CopySlices``)."""
    viewed: int = field(default=0, repr=False)
    """Of a group of tensors: the bytes of its storages that the tensors Python holds over them view,
    each storage's views summed (at most its size): all of a batch where each of its rows is kept."""
    made_inside_library: bool | None = field(default=None, repr=False)
    """Whether library code (torch's own, as it traces or scripts) made these tensors, rather than
    a line of the user's; None where not recorded."""
    grad_graph: bool = False
    """For gradients: they have an autograd graph of their own (``backward(create_graph=True)``);
    for an autograd graph nothing in Python holds, beside such gradients: theirs."""
    part: Any = field(default=None, repr=False)
    """Which part of the storages named this group is (a run of a test run again), where the
    caller split them (see :func:`describe`)."""
    parts: list[TensorGroup] = field(default_factory=list, repr=False)
    """For a group :func:`merge_parts` made: the groups of each part it merges."""
    graph_of_other_parts: int = field(default=0, repr=False)
    """Of ``graph_bytes``: the bytes of saved storages of another part than the group's (made by
    another run of the test: a graph that chains onto what those runs computed)."""

    @property
    def alike(self) -> tuple[Any, ...]:
        """What groups of different parts share where they hold alike tensors (dtype, shape,
        device, kind, class): what :func:`merge_parts` joins them by."""
        return self.dtype, self.shape, self.device, self.kind, self.cls

    @property
    def told_by_part(self) -> bool:
        """Whether the storages named were split by part (see ``graph_of_other_parts``)."""
        return self.part is not None or any(piece.part is not None for piece in self.parts)

    @property
    def held_by(self) -> list[str]:
        """Each holder path as one line, as reports write it."""
        return [path.render() for path in self.holders]

    @property
    def held_by_paths(self) -> list[list[tuple[str, str]]]:
        """Each holder path step by step: ``(text, kind)`` of the root, then of each edge."""
        return [path.parts() for path in self.holders]

    def add_holder(self, path: HolderPath) -> bool:
        """Add ``path`` unless the group lists it already; whether it was added."""
        if path in self.holders:
            return False
        self.holders.append(path)
        return True

    def sort_sites(self) -> None:
        """Where the group keeps an autograd graph, list its sites by the bytes found at each, most first."""
        if self.graph_bytes:
            self.allocated_at.sort(key=lambda site: -self.site_bytes.get(site, 0))

    @property
    def held_from_cpp_alone(self) -> bool:
        """Whether every holder path found for the group is "held from C++": nothing in Python holds it."""
        return bool(self.holders) and all(path.root.kind == "held from C++" and not path.edges for path in self.holders)

    @property
    def unreached_from_python(self) -> bool:
        """Whether nothing Python reaches holds the group: held from C++, or by a reference cycle
        that is kept from outside gc (see :func:`~pytest_vramleak.holders.referrers.find_chains`)."""
        return bool(self.holders) and all(
            path.root.kind in ("kept cycle", "frozen cycle") or (path.root.kind == "held from C++" and not path.edges)
            for path in self.holders
        )

    @property
    def total_bytes(self) -> int:
        """The memory the group keeps: its tensors' and what their autograd graph saved (a
        ``graph`` group's ``bytes`` are its graph's, once :func:`describe` has finished it)."""
        return self.bytes if self.kind == "graph" else self.bytes + self.graph_bytes

    def title(self) -> str:
        """One line: what the tensors are, how many, how many bytes."""
        shape = shape_text(self.shape) + (f" {self.cls}" if self.cls else "")
        if self.kind == "history":
            return (
                f"autograd history of a {self.dtype}{shape} tensor on {self.device}: {self.nodes:,} nodes made by the "
                f"test, about {format_size(self.bytes)} of host memory"
            )
        if self.kind == "graph":
            return (
                f"autograd graph of a {self.dtype}{shape} tensor on {self.device}: "
                f"{self.graph_tensors} saved tensors, {format_size(self.graph_bytes)}"
            )
        if self.kind == "storage":
            noun = "storage" if self.count == 1 else "storages"
            return f"storage kept without a tensor on {self.device}: {self.count} {noun}, {format_size(self.bytes)}"
        what = " gradient" if self.kind == "grad" else ""
        noun = "tensor" if self.count == 1 else "tensors"
        title = f"{self.dtype}{shape}{what} on {self.device}: {self.count} {noun}, {format_size(self.bytes)}"
        if (
            self.kind == "grad" and self.graph_tensors
        ):  # (backward(create_graph=True)): what their graphs saved is theirs
            title += f", and their autograd graph's {self.graph_tensors} saved tensors, {format_size(self.graph_bytes)}"
        elif self.graph_tensors:  # a loss kept with its graph: the graph is most of what it keeps
            behind = "it" if self.count == 1 else "them"
            title += (
                f", and the autograd graph behind {behind}: {self.graph_tensors} saved tensors, "
                f"{format_size(self.graph_bytes)}"
            )
        return title

    def to_json(self) -> dict[str, Any]:
        return {
            "title": self.title(),
            "dtype": self.dtype,
            "shape": list(self.shape),
            "device": self.device,
            "bytes": self.bytes,
            "count": self.count,
            "held_by": list(self.held_by),
            "held_by_paths": [[list(step) for step in path] for path in self.held_by_paths],
            "holders_not_searched": holders_not_searched(self.kind, self.count, len(self.holders)),
            "allocated_at": list(self.allocated_at),
            "sites_not_looked_up": self.sites_not_looked_up,
            "diagnoses": list(self.diagnoses),
            "kind": self.kind,
            "class": self.cls,
            "graph_bytes": self.graph_bytes,
            "nodes": self.nodes,
        }


@dataclass
class Leak:
    """The difference between two snapshots, described without references to any tensor."""

    device: str
    baseline_bytes: int
    end_bytes: int
    leaked_bytes: int
    """See :meth:`Snapshot.leaked_since`."""
    groups: list[TensorGroup] = field(default_factory=list)
    details: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    """What the groups alone do not say (how the memory grew)."""

    def render(self) -> str:
        """The notes, then the groups and their holders, one group per paragraph."""
        return "\n".join([*self.notes, render_groups(self.groups)])


def meter_for(device: str | None = "auto") -> Meter:
    """The meter of a device given as ``auto``, ``cpu``, ``cuda``, ``cuda:N``, ``mps`` or ``xpu``."""
    torch = _torch()
    return make_meter(resolve_device(device, torch), torch)


def take_snapshot(device: str | None = "auto", *, meter: Meter | None = None, settle: bool = True) -> Snapshot:
    """Collect garbage, wait for the device, and record its allocated bytes and live storages.

    This walks the whole heap (a per-test check uses :class:`pytest_vramleak.LeakCheck`, which
    reads only what changed). With ``settle=False`` garbage is left uncollected.
    """
    meter = meter or meter_for(device)
    if settle:
        meter.settle()  # collects garbage
    census = take_census(meter.name, identify=True)
    storages, identities = census.storages, census.identities
    allocated = meter.allocated_bytes() if meter.keeps_counters else sum(storages.values())
    return Snapshot(meter.name, allocated, storages, meter.details(), identities)


def diff(
    before: Snapshot,
    after: Snapshot | None = None,
    *,
    meter: Meter | None = None,
    name: bool = True,
    sites: SiteSource | None = None,
) -> Leak:
    """What was allocated after ``before`` and is still alive, grouped and with its holders named.

    ``after`` defaults to a snapshot taken now. With ``name=False`` the tensors are grouped but
    the (slower) search for their holders is skipped. With a :class:`SiteRecorder` that was active
    meanwhile, each group says where its tensors were allocated.
    """
    meter = meter or meter_for(before.device)
    if after is None:
        after = take_snapshot(meter=meter)
    new_keys = after.new_since(before)
    groups = describe(new_keys, after.device, name=name, sites=sites) if new_keys else []
    return Leak(
        after.device, before.allocated_bytes, after.allocated_bytes, after.leaked_since(before), groups, after.details
    )


LARGEST_SHOWN = 5


def memory_contents(meter: Meter, error: BaseException | None = None) -> str:
    """What fills a device now: its allocator's figures and its largest live storages, with holders.

    Used when a test runs out of memory, while the failed test's frames are still alive: the
    locals of the frames in ``error``'s traceback are named as such.
    """
    frames = [frame for frame, _ in traceback_frames(error)]
    census = take_census(meter.name)
    largest = sorted(census.storages, key=census.storages.__getitem__, reverse=True)[:LARGEST_SHOWN]
    figures = [
        f"tensor storages alive on {meter.name}: {format_size(census.total_bytes)} in {len(census.storages)} storages"
    ]
    if meter.name != "cpu":
        figures.append(f"allocated by the caching allocator: {format_size(meter.allocated_bytes())}")
        figures += [f"{name.replace('_', ' ')}: {format_size(value)}" for name, value in meter.details().items()]
    groups = describe(largest, meter.name, frames=frames[::-1])
    frames.clear()
    return "\n".join([*figures, "largest tensors:", render_groups(groups)])


def describe_history(
    roots: Sequence[tuple[Any, int]],
    device: str,
    *,
    node_bytes: int,
    frames: Sequence[types.FrameType] = (),
    named: Sequence[NamedRoot] = (),
    collect: bool = True,
) -> list[TensorGroup]:
    """One group per tensor that keeps autograd nodes the check's code made (``roots``: the
    tensors, with how many nodes each keeps), with its holders named: the tensor was kept, and
    behind its ``grad_fn`` every node of every step that added to it."""
    groups: list[TensorGroup] = []
    tensors = [tensor for tensor, _ in roots]
    owners: dict[int, Any] = {}
    try:
        paths = (
            holder_paths(tensors, exclude_types=_RECORDS, frames=frames, named=named, collect=collect)
            if tensors
            else []
        )
        if any(path is None for path in paths):
            # A gradient that keeps history (backward(create_graph=True) made it with a graph) is
            # held as its parameter's .grad, an edge gc does not show: named through its owner.
            owners = _gradient_owners([tensor for tensor, path in zip(tensors, paths, strict=False) if path is None])
            if owners:
                owned = list(owners.values())
                through = dict(
                    zip(
                        map(id, owned),
                        holder_paths(owned, exclude_types=_RECORDS, frames=frames, named=named, collect=False),
                        strict=False,
                    )
                )
                owned.clear()
                for index, (tensor, path) in enumerate(zip(tensors, paths, strict=False)):
                    owner = owners.get(id(tensor))
                    found = through.get(id(owner)) if path is None and owner is not None else None
                    if found is not None:
                        paths[index] = found.with_edge(GRADIENT)
        for (tensor, nodes), path in zip(roots, paths, strict=False):
            dtype, shape, where = tensor_key(tensor)
            group = TensorGroup(
                dtype,
                shape,
                where,
                bytes=nodes * node_bytes,
                count=1,
                kind="history",
                cls=tensor_class(tensor),
                nodes=nodes,
            )
            group.grad_graph = id(tensor) in owners
            group.holders.append(path if path is not None else HELD_IN_CPP_PATH)
            group.diagnoses = diagnose(group)
            groups.append(group)
    finally:
        tensors.clear()
        owners.clear()
    return groups


GRADIENT = Edge("gradient", "grad", "Tensor")
"""A tensor's ``.grad``: an edge gc does not show, named through the gradient's owner."""


def _gradient_owners(tensors: list[Any]) -> dict[int, Any]:
    """The tensors whose gradient is one of ``tensors``, by the gradient's id: one pass over the
    tensors gc tracks, frozen ones too (a parameter older than the test), reading the gradient of
    each leaf or tensor that retains one (torch warns where another's is read)."""
    wanted = {id(tensor) for tensor in tensors}
    owners: dict[int, Any] = {}
    with whole_heap():
        found = live_tensors()
    try:
        with _torch()._C.DisableTorchFunction():
            for obj in found:
                try:
                    grad = obj._grad if (obj.is_leaf or obj.retains_grad) else None
                except Exception:
                    continue
                if grad is not None and id(grad) in wanted:
                    owners.setdefault(id(grad), obj)
                del grad
    finally:
        found.clear()
    return owners


def _locate(
    keys: Iterable[StorageKey], device: str, defer_owners: set[int] | None = None, objects: list[Any] | None = None
) -> dict[StorageKey, list[Found]]:
    wanted = set(keys)
    located: dict[StorageKey, list[Found]] = {}
    with whole_heap():
        for found in walk(device, defer_owners=defer_owners or set(), objects=objects):
            if found.key in wanted:
                located.setdefault(found.key, []).append(found)
    return located


_node_type_cache: dict[type, bool] = {}


def _is_graph_node_type(cls: type) -> bool:
    known = _node_type_cache.get(cls)
    if known is None:
        try:
            from torch.autograd.graph import Node

            known = issubclass(cls, Node)
        except Exception:
            known = False
        if len(_node_type_cache) < 10_000:
            _node_type_cache[cls] = known
    return known


def _paths_through_graph_nodes(
    targets: list[Any], frames: Sequence[types.FrameType], named: Sequence[NamedRoot]
) -> dict[int, HolderPath]:
    """For tensors nothing in Python refers to: the chain to an autograd node (a ``grad_fn``) that
    Python holds and whose graph keeps the tensor (saved for backward, or the leaf it accumulates
    into). The node was kept, not a tensor."""
    torch = _torch()
    wanted: dict[int, Any] = {}
    with torch._C.DisableTorchFunction():
        for target in targets:
            for storage in tensor_storages(target):
                wanted[id(storage)] = target
    found: dict[int, tuple[Any, str]] = {}
    with whole_heap():
        # The heap's objects are picked by type in C (a Python test per object of a heap of 10^5
        # or more costs tenths of a second): the classes met first, then the objects of those
        # that are autograd nodes.
        everything = gc.get_objects()
        node_types = {cls for cls in set(map(type, everything)) if _is_graph_node_type(cls)}
        nodes = (
            list(itertools.compress(everything, map(node_types.__contains__, map(type, everything))))
            if node_types
            else []
        )
        del everything
    try:
        visited: set[int] = set()
        keep: list[Any] = []
        with torch._C.DisableTorchFunction():
            for node in nodes:
                for saved in _graph_tensors(node, visited, keep):
                    for storage in tensor_storages(saved):
                        target = wanted.get(id(storage))
                        if target is not None and id(target) not in found:
                            found[id(target)] = (node, type_name(node))
        keep.clear()
        if not found:
            return {}
        holders = list({id(node): node for node, _ in found.values()}.values())
        node_paths = dict(
            zip(
                (id(node) for node in holders),
                holder_paths(holders, exclude_types=_RECORDS, frames=frames, named=named),
                strict=False,
            )
        )
        paths = {}
        for ident, (node, kind) in found.items():
            path = node_paths.get(id(node))
            if path is not None:
                paths[ident] = path.with_edge(Edge("autograd node", kind, "Tensor"))
        return paths
    finally:
        nodes.clear()
        found.clear()


_CAPSULE = type(datetime.datetime_CAPI)
"""Python's capsule type (``types.CapsuleType`` from 3.13 on)."""
_DLTENSOR = b"dltensor"
"""The name of a DLPack capsule nobody has consumed yet: it owns its ``DLManagedTensor``."""
_DLTENSOR_BYTE_OFFSET = 40
"""Where ``byte_offset`` lies in a ``DLTensor`` (after data, device, ndim, dtype, shape, strides)."""


def _capsule_data(capsule: Any) -> int | None:
    """The address of the data a DLPack capsule (``torch.utils.dlpack.to_dlpack``) stands for."""
    api = ctypes.pythonapi
    api.PyCapsule_GetName.restype = ctypes.c_char_p
    api.PyCapsule_GetName.argtypes = [ctypes.py_object]
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    if api.PyCapsule_GetName(capsule) != _DLTENSOR:
        return None
    managed = api.PyCapsule_GetPointer(capsule, _DLTENSOR)
    if not managed:
        return None
    data = ctypes.c_void_p.from_address(managed).value or 0
    return data + ctypes.c_uint64.from_address(managed + _DLTENSOR_BYTE_OFFSET).value


def _script_module_holds(torch: Any, objects: Sequence[Any], holds: Callable[[Any, int | None, Edge], None]) -> None:
    """Tell ``holds`` of the tensors a TorchScript module keeps in C++ (``to_mkldnn(model)``'s
    buffers): each attribute, and the tensors its autograd graph keeps (the dense weight behind
    ``weight.to_mkldnn()``). Read with ``nn.Module``'s own methods, never a subclass's."""
    script_module = getattr(torch.jit, "ScriptModule", None)
    if script_module is None:
        return
    module = torch.nn.Module
    with torch._C.DisableTorchFunction():
        for obj in objects:
            if not issubclass(type(obj), script_module):  # (isinstance would read a __class__ property)
                continue
            try:
                named = [*module.named_parameters(obj), *module.named_buffers(obj)]
            except Exception:
                continue
            visited: set[int] = set()
            keep: list[Any] = []
            for name, tensor in named:
                reached = [(tensor, Edge("attribute", name, "Tensor"))]
                node = getattr(tensor, "grad_fn", None)
                if node is not None:
                    graph = Edge("saved tensor", name, "Tensor")
                    reached += [(saved, graph) for saved in _graph_tensors(node, visited, keep)]
                    reached += [(leaf, graph) for leaf in graph_leaves(tensor, ())]
                for held, what in reached:
                    for storage in tensor_storages(held):
                        facts = storage_facts(storage)
                        holds(obj, facts[1] if facts is not None else None, what)
            keep.clear()


def _paths_through_opaque_holders(
    targets: list[Any], frames: Sequence[types.FrameType], named: Sequence[NamedRoot]
) -> dict[int, HolderPath]:
    """For tensors nothing in Python refers to: the chain to an object Python holds that keeps the
    tensor's memory without a reference gc sees: a DLPack capsule (``to_dlpack``), a numpy array
    made from one (``np.from_dlpack``), a finished ``torch.futures.Future`` whose value it is.
    Capsules and arrays are not tracked by gc: every object's referents are read (one pass in C),
    so this runs only for what no cheaper search named."""
    torch = _torch()
    found = _Holdings(_spans(torch, targets))
    if not found.spans:
        return {}
    with whole_heap():
        everything = gc.get_objects()
    try:
        _untracked_holds(_untracked_holders(everything), found.note)
        _script_module_holds(torch, everything, found.note)
        _future_holds(torch, everything, found.note)
    finally:
        del everything
    found.spans.clear()
    if not found:
        return {}
    holders = list({id(holder): holder for candidates in found.values() for holder, _ in candidates}.values())
    holder_ids = [id(holder) for holder in holders]
    # (this search's own record of candidates, reached through the method that fills it, is no holder)
    paths = dict(
        zip(
            holder_ids,
            holder_paths(holders, exclude_types=_RECORDS, frames=frames, named=named),
            strict=False,
        )
    )
    holders.clear()
    chains = {}
    for ident, candidates in found.items():
        for holder, edge in candidates:  # the first candidate Python holds
            path = paths.get(id(holder))
            if path is not None:
                chains[ident] = path.with_edge(edge)
                break
    found.clear()
    return chains


def _spans(torch: Any, targets: list[Any]) -> list[tuple[int, int, Any]]:
    """``(start, end, target)``: the memory of each target (a tensor, or a storage object seen without one).
    An opaque tensor (``to_mkldnn()``) stands for its memory by its own object's address, which
    only a record of that tensor gives: its span is that address alone, or whatever the process
    allocated next to it (a numpy array's data) would be taken for a holder of its memory."""
    spans: list[tuple[int, int, Any]] = []
    with torch._C.DisableTorchFunction():
        for target in targets:
            tensor = is_tensor_type(type(target))
            for storage in tensor_storages(target) if tensor else [target]:
                facts = storage_facts(storage)
                if facts is not None:
                    opaque = tensor and storage is target
                    spans.append((facts[1], facts[1] + (1 if opaque else facts[2]), target))
    return spans


class _Holdings(dict):  # type: ignore[type-arg]
    """Candidate holders by the id of the tensor they keep (:func:`_paths_through_opaque_holders`)."""

    def __init__(self, spans: list[tuple[int, int, Any]]) -> None:
        super().__init__()
        self.spans = spans

    def note(self, holder: Any, address: int | None, edge: Edge) -> None:
        """``holder`` keeps the memory at ``address`` (through ``edge``): a candidate for the target there."""
        for start, end, target in self.spans:
            if address is not None and start <= address < end:
                self.setdefault(id(target), []).append((holder, edge))


def _untracked_holders(everything: list[Any]) -> list[Any]:
    """The numpy arrays and capsules that objects gc tracks refer to (gc does not track them, nor a
    container of only such objects: a few levels of those)."""
    ndarray = getattr(sys.modules.get("numpy"), "ndarray", None)
    picked, containers = untracked_referents(everything, {_CAPSULE, ndarray} - {None})
    containers.clear()
    return picked


_NUMPY_MEMORY = Edge("numpy memory", type_name="Tensor")
_CAPSULE_MEMORY = Edge("dlpack capsule", type_name="Tensor")
_FUTURE_VALUE = Edge("future value", type_name="Tensor")


def _untracked_holds(picked: list[Any], holds: Callable[[Any, int | None, Edge], None]) -> None:
    """Tell ``holds`` of the memory each numpy array or DLPack capsule in ``picked`` stands for."""
    ndarray = getattr(sys.modules.get("numpy"), "ndarray", None)
    for obj in picked:
        try:
            if type(obj) is ndarray:
                holds(obj, ndarray.__array_interface__.__get__(obj)["data"][0], _NUMPY_MEMORY)
            else:
                holds(obj, _capsule_data(obj), _CAPSULE_MEMORY)
        except Exception:
            continue
    picked.clear()


def _future_holds(torch: Any, objects: list[Any], holds: Callable[[Any, int | None, Edge], None]) -> None:
    """Tell ``holds`` of the tensors each finished ``torch.futures.Future`` among ``objects`` has as its value."""
    future = getattr(torch._C, "Future", None)
    if future is None:
        return
    with torch._C.DisableTorchFunction():
        for obj in objects:
            if not (issubclass(type(obj), future) and future.done(obj)):
                continue
            try:
                value = future.value(obj)
            except Exception:
                continue
            for tensor in value if type(value) in (list, tuple) else (value,):
                if is_tensor_type(type(tensor)):
                    for storage in tensor_storages(tensor):
                        facts = storage_facts(storage)
                        holds(obj, facts[1] if facts is not None else None, _FUTURE_VALUE)
            del value


def _list_heap() -> tuple[list[Any], list[Any]]:
    """Every tensor and storage object gc tracks, in the order gc keeps them (what
    :func:`census.walk` goes through), and every ``nn.Module``: one listing of the heap, its
    objects picked by the id of their type in C (no class's ``__hash__`` or ``__eq__`` runs).
    Clear both lists once done."""
    storages = {id(cls) for cls in (*tensor_types(), *storage_types())}
    modules = {id(cls) for cls in module_types()}
    wanted = storages | modules
    with whole_heap():
        everything = gc.get_objects()
        picked = list(itertools.compress(everything, map(wanted.__contains__, map(id, map(type, everything)))))
        del everything
    try:
        listing = [obj for obj in picked if id(type(obj)) in storages]
        return listing, [obj for obj in picked if id(type(obj)) in modules]
    finally:
        picked.clear()


@dataclass
class _Unheld:
    """What :func:`_unheld_tensors` found: ids only."""

    ids: set[int]
    """The tensors asked about that nothing in Python refers to."""
    owners: set[int]
    """Of those, the ones with an autograd graph."""
    asked: set[int]


def _unheld_tensors(keys: Sequence[StorageKey], listing: list[Any], holders: list[Any]) -> _Unheld:
    """Which tensors (and storage objects) gc sees that nothing in Python refers to, among the
    tensors with an autograd graph (candidates for owning what graphs saved) and those over the
    storages at ``keys``: one pass over the heap, whose holders go into ``holders`` for the search
    of holders that follows. ``listing``: the tensors and storage objects :func:`_list_heap` gave."""
    torch = _torch()
    wanted = set(keys)
    tensor_classes = set(tensor_types())
    storage_classes = set(storage_types())
    asked: list[Any] = []
    owners: set[int] = set()
    try:
        with torch._C.DisableTorchFunction():
            for obj in listing:
                cls = type(obj)
                if cls in storage_classes:
                    storage = storage_of_storage_object(obj)
                    facts = storage_facts(storage) if storage is not None else None
                    if facts is not None and (facts[0], facts[1]) in wanted:
                        asked.append(obj)
                elif cls in tensor_classes:
                    graph = _has_graph(obj)
                    if graph:
                        owners.add(id(obj))
                    if graph or any(key in wanted for key, _, _ in _keys_of(obj)):
                        asked.append(obj)
        unheld = (
            without_python_holders(asked, exclude_types=_RECORDS, keep=holders, ignore=(listing,)) if asked else set()
        )
        return _Unheld(unheld, owners & unheld, {id(obj) for obj in asked})
    finally:
        asked.clear()


def _group_key(found: Found) -> tuple[str, tuple[int, ...], str]:
    """dtype, shape and device of what a find holds; a storage kept without a tensor has no dtype."""
    if found.via == "storage":
        return "untyped storage", (found.nbytes,), found.key[0]
    return tensor_key(found.tensor)


def tensor_class(tensor: Any) -> str:
    """The name of a tensor's class where it is a subclass of ``torch.Tensor`` (``Parameter``), else ``""``."""
    cls = type(tensor)
    if cls is _torch().Tensor:
        return ""
    name = type.__dict__["__qualname__"].__get__(cls)
    return name if type(name) is str else "?"


def tensor_key(tensor: Any) -> tuple[str, tuple[int, ...], str]:
    """dtype, shape and device of a tensor: a nested tensor's shape is its number of components."""
    torch = _torch()
    base = torch._C.TensorBase
    with torch._C.DisableTorchFunction():
        dtype = _name_of(base.dtype.__get__(tensor))
        device = _name_of(base.device.__get__(tensor))
        try:
            shape = tuple(base.size(tensor))
        except Exception:  # nested tensors have no single shape
            try:
                shape = (int(base.size(tensor, 0)),)
            except Exception:
                shape = ()
            dtype = f"nested {dtype}"
    return dtype, shape, device


_names: dict[Any, str] = {}


def _name_of(value: Any) -> str:
    """A dtype's name (``float32``) or a device's (``cuda:0``): named once each (``str`` of
    either costs more than the rest of a tensor's key)."""
    name = _names.get(value)
    if name is None:
        name = str(value).removeprefix("torch.")
        if len(_names) < 1_000:
            _names[value] = name
    return name


def _primary(finds: list[Found], orphans: set[int]) -> Found:
    """Which find explains a storage: a tensor Python holds, else a gradient, else an autograd graph.

    A tensor gc sees but nothing in Python refers to, whose storage an autograd graph saved, is
    the graph's: torch keeps the Python object of a saved tensor alive once it has been unpacked.
    """
    by_via = {f.via: f for f in reversed(finds)}
    held = [f for f in finds if f.via in ("gc", "storage") and id(f.tensor) not in orphans]
    if held:
        return held[0]
    if "grad" in by_via:
        return by_via["grad"]
    if "graph" in by_via:
        return by_via["graph"]
    # a tensor over a storage object nothing in Python holds either (a numpy array over the tensor
    # holds it, unseen by gc; torch keeps the storage's Python object once one was made)
    return by_via.get("gc", finds[0])


def _other_views(finds: list[Found], primary: Found, orphans: set[int]) -> list[Any]:
    """The tensors Python holds over a storage besides the one that explains it (views of it,
    ``x.detach()`` kept in several places)."""
    if primary.via != "gc" or len(finds) < 2:
        return []
    return [
        found.tensor
        for found in finds
        if found.via == "gc" and found.tensor is not primary.tensor and id(found.tensor) not in orphans
    ]


def _element_bytes(tensor: Any) -> int:
    """The bytes of a tensor's own elements (0 where it will not say)."""
    try:
        with _torch()._C.DisableTorchFunction():
            return int(tensor.numel()) * int(tensor.element_size())
    except Exception:
        return 0


def _allocation_site(sites: SiteSource | None, found: Found, tensor: Any | None = None) -> str | None:
    """Where the storage was allocated, then, where the tensor kept is a view made elsewhere
    (``x.detach()`` in a hook, a slice), where that view was made."""
    if sites is None or found.storage is None:
        return None
    kept = found.tensor if tensor is None else tensor
    try:
        stack = sites.site_of(kept, found.storage)
        view_site_of = getattr(sites, "view_site_of", None)
        view = view_site_of(kept, found.storage) if stack and view_site_of is not None and found.via == "gc" else None
    except Exception:
        return None
    if not stack:
        return None
    text = describe_stack(stack)
    return f"{text}; kept through a view made at {describe_stack(view)}" if view else text


def describe(
    keys: Iterable[StorageKey],
    device: str,
    *,
    name: bool = True,
    sites: SiteSource | None = None,
    frames: Sequence[types.FrameType] = (),
    named: Sequence[NamedRoot] = (),
    collected: bool = False,
    part: Callable[[StorageKey], Any] | None = None,
) -> list[TensorGroup]:
    """Group the live storages in ``keys`` by dtype, shape and device, and name their holders
    (values in ``named`` by the names given, such as a test's fixtures and parametrize values).

    With ``part``, storages of different parts (the runs of a test run again) are never grouped
    together, and each part's groups name holders of their own: every part is named by one walk of
    the heap (:func:`merge_parts` joins them again).

    A storage saved only by an autograd graph is added to the group of the tensor whose graph
    holds it (``graph_bytes``); a gradient is named through the tensor it belongs to.
    """
    keys = list(dict.fromkeys(keys))  # the caller's order (oldest first) decides the order of the chains shown
    grouping = _Grouping(keys, sites, part)
    targets = grouping.targets
    known: list[Any] = []
    try:
        # Describing makes an object or more per storage: the collections that would set off, each a
        # walk of the whole heap (unfrozen here), cost more than the describing itself.
        with collections_paused():
            located, orphans, hooked = _find_storages(keys, device, known)
            primaries = [_primary(finds, orphans.ids) for finds in located.values()]
            views = [
                (primary, _other_views(finds, primary, orphans.ids))
                for finds, primary in zip(located.values(), primaries, strict=True)
            ]
            located.clear()
            primaries.sort(key=lambda f: (f.via == "graph", grouping.order[f.key]))  # owners' groups first
            for found in primaries:
                grouping.add(found)
            for found, others in views:  # (where the groups have room left for chains)
                grouping.add_views(found, others)
            primaries.clear()
            views.clear()
        if name and targets:
            paths = _name_targets(targets, frames, named, collected, (orphans.asked, known))
            grouping.name(paths, hooked)
    finally:
        targets.clear()
        grouping.owner_groups.clear()
        known.clear()
    return _finish(list(grouping.groups.values()))


def _find_storages(
    keys: list[StorageKey], device: str, known: list[Any]
) -> tuple[dict[StorageKey, list[Found]], _Unheld, dict[int, str]]:
    """What holds each storage in ``keys`` (tensors, gradients, autograd graphs), which of the
    tensors nothing in Python refers to, and what module hooks' closures hold (see
    :func:`hook_holdings`): one listing of the heap. ``known``: see :func:`referrers.find_chains`."""
    listing, modules = _list_heap()
    try:
        hooked = hook_holdings(modules)
        modules.clear()
        with _torch()._C.DisableTorchFunction():
            pruned = only_worth_reading(listing, {pointer for _, pointer in keys})
        listing.clear()
        listing = pruned
        orphans = _unheld_tensors(keys, listing, known)
        # A graph shared by several tensors is credited to one of them; a tensor that only the
        # graph itself keeps alive (an intermediate result) is a poor owner to show, so it goes last.
        located = _locate(keys, device, orphans.owners, listing)
    finally:
        listing.clear()
        modules.clear()
    # (storage objects kept without a tensor, and tensors of classes defined meanwhile)
    unasked = [
        f.tensor
        for finds in located.values()
        for f in finds
        if f.via in ("gc", "storage") and id(f.tensor) not in orphans.asked
    ]
    if unasked:
        orphans.ids |= without_python_holders(unasked, exclude_types=_RECORDS)
    unasked.clear()
    return located, orphans, hooked


class _Grouping:
    """The groups :func:`describe` builds, and the tensors whose holders name them (``targets``,
    each with its group in ``target_groups``, and whether it is named through its owner's ``.grad``)."""

    def __init__(self, keys: list[StorageKey], sites: SiteSource | None, part: Callable[[StorageKey], Any] | None):
        self.order = {key: index for index, key in enumerate(keys)}
        self.sites = sites
        self.part = part
        self.groups: dict[tuple[Any, ...], TensorGroup] = {}
        self.targets: list[Any] = []
        self.target_groups: list[tuple[TensorGroup, bool]] = []
        self.owner_groups: dict[int, TensorGroup] = {}
        self.counted: set[int] = set()

    def add(self, found: Found) -> None:
        """Count ``found`` in its group (what an autograd graph saved: in its owner's)."""
        if found.via == "graph":
            self._add_saved(found)
        else:
            self._add_held(found)

    def _group(self, found: Found, key: tuple[str, tuple[int, ...], str], kind: GroupKind, cls: str) -> TensorGroup:
        share = self.part(found.key) if self.part is not None else None
        dtype, shape, where = key
        return self.groups.setdefault(
            (dtype, shape, where, kind, cls, share), TensorGroup(dtype, shape, where, kind=kind, cls=cls, part=share)
        )

    def _add_saved(self, found: Found) -> None:
        group = self.owner_groups.get(id(found.owner))
        if group is None:
            group = self._group(found, tensor_key(found.owner), "graph", tensor_class(found.owner))
            self.owner_groups[id(found.owner)] = group
            group.count += 1
            group.grad_fn = group.grad_fn or _grad_fn_name(found.owner)
            self.targets.append(found.owner)
            self.target_groups.append((group, False))
        group.graph_bytes += found.nbytes
        group.graph_tensors += 1
        group.graph_hooks |= found.hooks
        group.keys.append(found.key)
        if self.part is not None and self.part(found.key) != group.part:
            group.graph_of_other_parts += found.nbytes
        site = _allocation_site(self.sites, found, found.owner)
        if site is None:
            return
        if group.kind != "graph":  # the group's own tensors are the owners: say which site is the graph's
            site = f"{site} ({SAVED_BY_THE_GRAPH})"
        if site not in group.allocated_at:
            group.allocated_at.append(site)
        group.site_bytes[site] = group.site_bytes.get(site, 0) + found.nbytes

    def _add_held(self, found: Found) -> None:
        kind: GroupKind = "tensor" if found.via == "gc" else found.via
        group = self._group(
            found, _group_key(found), kind, tensor_class(found.tensor) if found.via != "storage" else ""
        )
        group.bytes += found.nbytes
        group.keys.append(found.key)
        if id(found.tensor) in self.counted:  # a sparse or nested tensor: several storages, one tensor
            return
        self.counted.add(id(found.tensor))
        group.count += 1
        grad_fn = _grad_fn_name(found.tensor) if found.via == "gc" else ""
        if grad_fn:
            group.with_graph += 1
            group.grad_fn = group.grad_fn or grad_fn
        self.owner_groups.setdefault(id(found.tensor), group)
        if found.via == "grad" and not group.grad_graph:
            group.grad_graph = _has_graph(found.tensor)
        site = _allocation_site(self.sites, found) if len(group.allocated_at) < MAX_CHAINS_PER_GROUP else None
        if site is not None:
            group.site_bytes[site] = group.site_bytes.get(site, 0) + found.nbytes
        if site is not None and site not in group.allocated_at:
            group.allocated_at.append(site)
        elif len(group.allocated_at) >= MAX_CHAINS_PER_GROUP:
            group.sites_not_looked_up += 1
        ask = getattr(self.sites, "made_inside_library", None) if found.via in ("gc", "storage") else None
        inside = ask(found.tensor) if ask is not None else None
        if inside is not None:
            group.made_inside_library = bool(inside) and group.made_inside_library is not False
        if self._has_room(group):
            self.targets.append(found.tensor if found.via in ("gc", "storage") else found.owner)
            self.target_groups.append((group, found.via == "grad"))

    def add_views(self, primary: Found, others: list[Any]) -> None:
        """Count what the tensors Python holds over a storage view of it (``primary``'s, and those of
        :func:`_other_views`) in its group's ``viewed``, and name the storage through the others,
        while the group has room for chains: which of them explains the storage is the one gc lists
        first, and another may hold it longer (a hook per instance of a test's class appends its
        own view of each output: the last run's instance holds one, every earlier hook another)."""
        group = self.owner_groups.get(id(primary.tensor))
        if group is not None and primary.via == "gc":
            group.viewed += min(primary.nbytes, sum(_element_bytes(tensor) for tensor in (primary.tensor, *others)))
        for tensor in others:
            if group is None or not self._has_room(group):
                return
            self.targets.append(tensor)
            self.target_groups.append((group, False))

    def _has_room(self, group: TensorGroup) -> bool:
        """Whether the group names fewer targets than it shows chains."""
        return sum(1 for g, _ in self.target_groups if g is group) < MAX_CHAINS_PER_GROUP

    def name(self, paths: list[HolderPath], hooked: dict[int, str]) -> None:
        """Give each target's group its holder path; where a module hook's closure holds the
        container a tensor is kept in, say so (``hooked``: see :func:`hook_holdings`)."""
        for (group, through_grad), path in zip(self.target_groups, paths, strict=False):
            group.add_holder(path.with_edge(GRADIENT) if through_grad and path is not HELD_IN_CPP_PATH else path)
        # A hook that appends what it sees to a list the test also holds: the shortest chain
        # is the test's local, but the hook is the cause.
        checked: set[int] = set()
        for target, (group, through_grad) in zip(self.targets, self.target_groups, strict=False):
            if through_grad or id(group) in checked or group.kind != "tensor":
                continue
            checked.add(id(group))
            if _may_be_hooked(group):
                group.hook = hooked.get(id(target), "")


def _may_be_hooked(group: TensorGroup) -> bool:
    """Whether a module hook may hold the container that holds the group: it is held through a
    running frame's local, a closure (where a hook's container is usually seen; a step function
    given to check() is the closure itself) or an attribute (a hook that stores on its module),
    and through no hook dict already."""
    reachable = any(
        (path.through_local() or path.has("closure variable", "attribute")) and path.root.kind != "step"
        for path in group.holders
    )
    return reachable and not any(path.hook_entries() for path in group.holders)


# The records naming keeps of the tensors it names (a group's list of them, its candidates): never holders.
_RECORDS = (Found, _Holdings, _Grouping)


def _name_targets(
    targets: list[Any],
    frames: Sequence[types.FrameType],
    named: Sequence[NamedRoot],
    collected: bool,
    known: tuple[set[int], list[Any]],
) -> list[HolderPath]:
    """The holder path of each target: the references Python has to it; else an autograd node
    Python holds whose graph keeps it; else an object that keeps its memory from C++ (a DLPack
    capsule, a Future); else none (held from C++)."""
    paths = holder_paths(
        targets, exclude_types=_RECORDS, frames=frames, named=named, collect=not collected, known=known
    )
    for search in (_paths_through_graph_nodes, _paths_through_opaque_or_none):
        if any(path is None for path in paths):
            found = search([t for t, p in zip(targets, paths, strict=False) if p is None], frames, named)
            paths = [path if path is not None else found.get(id(t)) for t, path in zip(targets, paths, strict=False)]
    return [path if path is not None else HELD_IN_CPP_PATH for path in paths]


def _paths_through_opaque_or_none(
    targets: list[Any], frames: Sequence[types.FrameType], named: Sequence[NamedRoot]
) -> dict[int, HolderPath]:
    try:
        return _paths_through_opaque_holders(targets, frames, named)
    except Exception:  # what cannot be read stays "held from C++"
        return {}


def _finish(groups: list[TensorGroup]) -> list[TensorGroup]:
    """The groups diagnosed, largest first."""
    # Gradients with graphs of their own (backward(create_graph=True)) keep the graphs they were
    # made by, through a cycle with their parameters: the graphs nothing in Python holds are theirs.
    if any(group.grad_graph for group in groups):
        for group in groups:
            if group.kind == "graph" and group.holders and all(path.opaque for path in group.holders):
                group.grad_graph = True
    for group in groups:
        if group.kind == "graph":
            group.bytes = group.graph_bytes
        group.sort_sites()
        if KEEPS_ITS_OUTPUT in group.graph_hooks and group.held_from_cpp_alone:
            group.holders = [own_graph_path(user_hooks(group), through_checkpoint(group))]
        elif group.held_from_cpp_alone and (functions := saved_views_of_outputs(group)):
            group.holders = [own_view_path(functions)]
        group.diagnoses = diagnose(group)
    return sorted(groups, key=lambda g: -g.total_bytes)


def _has_graph(tensor: Any) -> bool:
    """Whether a tensor has a grad_fn, read without running code of a tensor subclass."""
    return bool(_grad_fn_name(tensor))


def _grad_fn_name(tensor: Any) -> str:
    """The class of a tensor's grad_fn (``CopySlices``), read without running code of a tensor
    subclass; empty where it has none."""
    torch = _torch()
    try:
        with torch._C.DisableTorchFunction():
            grad_fn = torch._C.TensorBase.grad_fn.__get__(tensor)
    except Exception:
        return ""
    return "" if grad_fn is None else type(grad_fn).__name__


def held_in_cpp_groups(tensors: Sequence[Any], refs: Sequence[Any]) -> list[TensorGroup] | None:
    """The groups of ``tensors`` (each with its storage's ``refs`` entry: ``pointer``, ``device``,
    ``nbytes``) where nothing in Python reaches any of them: no holder gc sees, no numpy array over
    one of them, no autograd node Python holds; None where anything does. Cheaper than
    :func:`describe`, which names holders of every kind. (Not looked for here: a graph of an
    older tensor Python holds that saved one of them; the caller's tensors are all new, made by
    torch's own code, with no holder gc sees.)"""
    unheld = without_python_holders(tensors, exclude_types=_RECORDS)
    if len(unheld) != len({id(tensor) for tensor in tensors}):
        return None
    if any(path is not None for path in holder_paths(tensors, exclude_types=_RECORDS, collect=False)):
        return None
    if _paths_through_graph_nodes(list(tensors), (), ()):
        return None
    groups: dict[tuple[Any, ...], TensorGroup] = {}
    for tensor, ref in zip(tensors, refs, strict=False):
        dtype, shape, where = tensor_key(tensor)
        cls = tensor_class(tensor)
        group = groups.setdefault(
            (dtype, shape, where, cls),
            TensorGroup(dtype, shape, where, cls=cls, holders=[HELD_IN_CPP_PATH]),
        )
        key = (ref.device, ref.pointer)
        if key not in group.keys:
            group.keys.append(key)
            group.bytes += ref.nbytes
            group.count += 1
    for group in groups.values():
        group.diagnoses = diagnose(group)
    return sorted(groups.values(), key=lambda g: -g.bytes)


def merge_parts(groups: Sequence[TensorGroup]) -> list[TensorGroup]:
    """The groups :func:`describe` split by part, joined as if named together: each merged group
    keeps its parts (``parts``), and the chains and sites of the earliest parts first."""
    merged: dict[tuple[Any, ...], TensorGroup] = {}
    for group in sorted(groups, key=lambda g: (g.part is None, g.part if type(g.part) is int else 0)):
        key = group.alike
        whole = merged.get(key)
        if whole is None:
            whole = merged[key] = TensorGroup(
                group.dtype,
                group.shape,
                group.device,
                kind=group.kind,
                cls=group.cls,
                made_inside_library=group.made_inside_library,
            )
        elif group.made_inside_library is not None:
            whole.made_inside_library = group.made_inside_library and whole.made_inside_library is not False
        whole.parts.append(group)
        whole.bytes += group.bytes
        whole.count += group.count
        whole.viewed += group.viewed
        whole.grad_fn = whole.grad_fn or group.grad_fn
        whole.graph_bytes += group.graph_bytes
        whole.graph_tensors += group.graph_tensors
        whole.graph_of_other_parts += group.graph_of_other_parts
        whole.with_graph += group.with_graph
        whole.graph_hooks |= group.graph_hooks
        whole.keys += group.keys
        whole.hook = whole.hook or group.hook
        whole.grad_graph = whole.grad_graph or group.grad_graph
        for path in group.holders:
            if len(whole.holders) < MAX_CHAINS_PER_GROUP:
                whole.add_holder(path)
        for site in group.allocated_at:
            if site not in whole.allocated_at and len(whole.allocated_at) < MAX_CHAINS_PER_GROUP:
                whole.allocated_at.append(site)
        for site, nbytes in group.site_bytes.items():
            whole.site_bytes[site] = whole.site_bytes.get(site, 0) + nbytes
        whole.sites_not_looked_up += group.sites_not_looked_up
    for whole in merged.values():
        whole.sort_sites()
        whole.diagnoses = diagnose(whole)
    return sorted(merged.values(), key=lambda g: -g.total_bytes)


CYCLE_DIAGNOSIS = (
    "these tensors lived on a reference cycle: Python frees them only when its cycle collector next runs, so "
    "their memory stays allocated for as long as that takes (on a GPU, until a collection the test does not "
    "control): break the cycle (hold the back reference through weakref.ref, or set it to None when done)"
)


def describe_cycle_garbage(
    garbage: Sequence[Any], keys: set[StorageKey] | None, *, sites: SiteSource | None = None
) -> list[TensorGroup]:
    """The tensors among a collection's garbage (``gc.DEBUG_SAVEALL``) whose storages are ``keys``
    (None: all), grouped, each with the reference cycle that kept it: what the cycle collector
    alone freed."""
    seen: set[StorageKey] = set()
    groups: dict[tuple[Any, ...], TensorGroup] = {}
    for obj in garbage:
        if not is_tensor_type(type(obj)):
            continue
        found = storage_key(obj)
        if found is None or (keys is not None and found[0] not in keys) or found[0] in seen:
            continue
        key, nbytes = found
        seen.add(key)  # a storage is counted once, whichever tensor of it comes first
        dtype, shape, where = tensor_key(obj)
        path = cycle_holding(garbage, obj) or HELD_IN_CPP_PATH
        group = groups.setdefault(
            (dtype, shape, where, tensor_class(obj), path), TensorGroup(dtype, shape, where, cls=tensor_class(obj))
        )
        group.bytes += nbytes
        group.count += 1
        group.keys.append(key)
        group.add_holder(path)
        storages = tensor_storages(obj)
        site = sites.site_of(obj, storages[0]) if sites is not None and storages else None
        if site and (text := describe_stack(site)) not in group.allocated_at:
            group.allocated_at.append(text)
    for group in groups.values():
        group.diagnoses = [_cycle_diagnosis(group)]
    return sorted(groups.values(), key=lambda group: -group.bytes)


def _cycle_diagnosis(group: TensorGroup) -> str:
    """Why a group lived on a reference cycle, and how to break it: a class made while the test ran
    keeps what its attributes hold on a cycle no code can break (its ``__mro__`` starts with itself)."""
    path = group.holders[0] if group.holders else None
    loop = (path.cycle or ()) if path is not None else ()
    if len(loop) >= 2 and loop[0].kind == "attribute" and loop[0].name == "grad_fn" and loop[1].kind == "attribute":
        stored = (
            f"stored its output on ctx (ctx.{loop[1].name})"
            if len(loop) == 2
            else f"keeps ctx.{loop[1].name}, which leads back to its output ({''.join(e.text() for e in loop[1:])})"
        )
        return (
            f"these tensors lived on a reference cycle: a custom autograd.Function's forward {stored}, and ctx is the "
            f"output's grad_fn ({loop[0].type_name}), so the output and ctx keep each other until Python's cycle "
            "collector runs: save tensors with ctx.save_for_backward(...) instead (what it saves keeps no cycle), "
            "and keep on ctx nothing that leads back to the output"
        )
    if path is None or path.root.kind != "cycle" or path.root.type_name not in ("type", "ABCMeta"):
        return CYCLE_DIAGNOSIS
    return (
        f"these tensors lived on a reference cycle: {path.root.label} is a class made while the test ran (a class "
        "defined in a function, one per call), and a class always lies on a cycle of its own (its __mro__ starts "
        "with itself), so what its attributes hold waits for Python's cycle collector (on a GPU, a collection the "
        "test does not control): keep the tensor or model on an instance instead of the class, hold it through "
        "weakref.ref, or define the class once, outside the function"
    )

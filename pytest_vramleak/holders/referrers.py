"""Name what keeps an object alive: the chain of references from a root, every edge named.

The search walks gc's referrer graph backwards, one level at a time, from all targets at once:
one ``gc.get_referrers(*frontier)`` call per level, so its cost is one heap traversal per level in C
rather than one per node visited (objgraph's ``find_backref_chain`` calls it per node).

Roots are modules in ``sys.modules`` (``objgraph.is_proper_module``), frames still on the stack, and
objects nothing in gc refers to (kept alive from C, e.g. a registered hook). Edge names come from
exact-type checks and C-level descriptors, never from ``repr``, ``__getattr__`` or ``__eq__`` of the
objects on the way: naming a holder must not run the user's code.
"""

from __future__ import annotations

import collections
import itertools
import operator
import sys
import threading
import types
from collections.abc import Sequence
from typing import Any

import objgraph

from ..tracking import gc_functions as gc
from ..tracking.census import frozen_by_the_suite, is_tensor_type, whole_heap
from ..tracking.sites import code_folders, frame_kind_of_file, is_loaded_standard_library
from .edges import (
    _MODULE_NAMESPACE,
    FrameLocal,
    NamedRoot,
    SearchStopped,
    frame_locals,
    holder_path,
    instance_dict,
    is_ndarray,
    key_text,
    type_name,
)
from .paths import CHANGED, CHANGED_PATH, HolderPath, Root

__all__ = [
    "CHANGED",
    "FrameLocal",
    "HolderPath",
    "NamedRoot",
    "chain_text",
    "cycle_holding",
    "find_chains",
    "holder_paths",
    "key_text",
    "name_holders",
    "traceback_frames",
    "type_name",
    "untracked_referents",
    "without_python_holders",
]

_PACKAGE_DIR = __file__.rsplit("/", 2)[0]  # the package, every layer of it


def _own_frames() -> set[int]:
    """Ids of this package's frames on the stack, which hold the targets while searching."""
    ids: set[int] = set()
    # From the caller on: this function's frame is gone once it returns, and its id may then be
    # another frame's.
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename.startswith(_PACKAGE_DIR):
            ids.add(id(frame))
        frame = frame.f_back
    return ids


def _frames_not_ours(own: set[int]) -> list[types.FrameType]:
    """The frames on the stack, innermost first, less this package's own."""
    stack: list[types.FrameType] = []
    # From the caller on: this function's own frame (not in ``own``, made after it) in the list it
    # returns would make a cycle that keeps its caller's frame, and every object that frame's
    # locals refer to, alive until the next collection.
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None:
        if id(frame) not in own:
            stack.append(frame)
        frame = frame.f_back
    return stack


def _other_threads_frames() -> list[tuple[str, int, types.FrameType]]:
    """``(thread name, thread ident, frame)`` for every frame running in another thread, innermost first."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    running = sys._current_frames()
    # This thread's entry is this very frame: kept in a local, it would make a reference cycle
    # that keeps every frame of the search, and what their locals hold, alive until collected.
    del running[threading.get_ident()]
    found = []
    for ident, frame in running.items():
        name = names.get(ident, str(ident))
        current_frame: types.FrameType | None = frame
        while current_frame is not None:
            found.append((name, ident, current_frame))
            current_frame = current_frame.f_back
    return found


def traceback_frames(error: BaseException | None) -> list[tuple[types.FrameType, int]]:
    """Each frame of ``error``'s traceback, outermost first, with the line it was at (none where
    there is no error): the frames of a failure, whose locals are named as such. The caller drops
    the list once it is done: it keeps the frames, and what their locals hold, alive."""
    frames = []
    traceback = error.__traceback__ if error is not None else None
    while traceback is not None:
        frames.append((traceback.tb_frame, traceback.tb_lineno))
        traceback = traceback.tb_next
    return frames


def _running_locals(frames: Sequence[types.FrameType], thread: str = "", thread_id: int = 0) -> dict[int, FrameLocal]:
    found: dict[int, FrameLocal] = {}
    for frame in frames:
        try:
            local_values = frame_locals(frame)
        except Exception:
            continue
        if type(local_values) is not dict or local_values is frame.f_globals:
            continue  # a module's top level: the module itself is the root
        for name, value in dict.items(local_values):
            found.setdefault(id(value), FrameLocal(frame, name, value, thread, thread_id))
    return found


def is_module_root(obj: Any) -> bool:
    """A module in ``sys.modules``: objgraph's notion of a gc root, asked only of real modules."""
    return issubclass(type(obj), types.ModuleType) and objgraph.is_proper_module(obj)


SMALL_FRONTIER = 256
"""Up to this many objects a level asks ``gc.get_referrers``, whose cost grows with heap size times
the number of objects asked about; above it one pass over the heap with a set lookup is cheaper
(measured on a pytest process of 175,000 objects: 27 ms for 32 objects, 92 ms for 300, against
about 105 ms for the pass whatever their number)."""


def _referrers(frontier: tuple[Any, ...], frontier_ids: set[int]) -> list[Any]:
    if len(frontier) <= SMALL_FRONTIER:
        # Splatting an exact tuple passes that same tuple as the arguments, so the only extra
        # referrer the call sees is ``frontier`` itself, which the caller ignores.
        found = gc.get_referrers(*frontier)
        return found + _tasks_holding(frontier_ids, {id(obj) for obj in found}) if _TASKS_HIDE_REFERENTS else found
    referents, unrelated = gc.get_referents, frontier_ids.isdisjoint
    return [obj for obj in gc.get_objects() if not unrelated(map(id, referents(obj)))]


_TASKS_HIDE_REFERENTS = sys.version_info < (3, 12)
"""Before Python 3.12 the traverse function of asyncio's C ``Task`` drops the answer of its future
part's: ``gc.get_referrers`` never names a task as holding its result, its exception, its
callbacks or its attributes (``gc.get_referents`` lists them)."""


def _tasks_holding(ids: set[int], known: set[int]) -> list[Any]:
    """The live asyncio tasks (asyncio keeps a weak set of them) that refer to an object of ``ids``,
    less those in ``known``: what ``gc.get_referrers`` misses of them before Python 3.12."""
    tasks = getattr(sys.modules.get("asyncio.tasks"), "_all_tasks", None)
    if not tasks:
        return []
    unrelated = ids.isdisjoint
    return [task for task in list(tasks) if id(task) not in known and not unrelated(map(id, gc.get_referents(task)))]


BACKWARD_LEVELS = 8
"""Levels searched backwards from the targets, one heap traversal each, before the search turns
around: a forward walk from the roots (the user's modules first, then every module), bounded by
``FORWARD_LIMIT`` objects each, meets it where it stopped, so the cost never grows as heap size
times chain length."""


def _referents(node: Any, by_storage: dict[int, Any]) -> list[Any]:
    """What ``node`` refers to. A numpy array made by ``tensor.numpy()`` is invisible to gc, and
    so is the tensor it keeps (its ``base``): where that tensor shares a target's storage, the
    array counts as referring to the target."""
    if is_ndarray(node):
        base = type(node).base.__get__(node)  # the C attribute: no code of the array's runs
        if base is None:
            return []
        for storage_id in _storage_ids(base):
            target = by_storage.get(storage_id)
            if target is not None:
                return [target]
        return [base]
    return gc.get_referents(node)


UNTRACKED_LEVELS = 4
"""Levels of containers gc does not track (a tuple or dict of numpy arrays) looked through below
the objects it does."""

_UNTRACKED_CONTAINERS = frozenset({dict, list, tuple, set, frozenset})
"""Containers gc may not track (a tuple or a dict while it holds only objects gc does not track)."""


def untracked_referents(sources: Sequence[Any], kinds: set[Any]) -> tuple[list[Any], list[Any]]:
    """What ``sources`` (gc's listing of the heap) refer to that gc does not track: the objects of
    ``kinds`` (a numpy array, a capsule), and the tuples and dicts gc stopped tracking because they
    hold only such objects, a few levels of them. One pass over the heap in C, whatever its size:
    what holds an object gc does not see is found without a walk that gives up on a big heap.
    Clear both lists once done."""
    picked: dict[int, Any] = {}
    containers: dict[int, Any] = {}
    wanted = frozenset(kinds) | _UNTRACKED_CONTAINERS
    level = sources
    for _ in range(UNTRACKED_LEVELS):
        # (picked by exact type and gc.is_tracked, in C: no object's code runs)
        referents = gc.get_referents(*level)
        untracked = list(
            itertools.filterfalse(
                gc.is_tracked, itertools.compress(referents, map(wanted.__contains__, map(type, referents)))
            )
        )
        del referents
        found = list(itertools.compress(untracked, map(kinds.__contains__, map(type, untracked))))
        picked.update(zip(map(id, found), found, strict=True))
        found = list(itertools.compress(untracked, map(_UNTRACKED_CONTAINERS.__contains__, map(type, untracked))))
        untracked.clear()
        new = dict(zip(map(id, found), found, strict=True))
        found.clear()
        for seen in new.keys() & containers.keys():
            del new[seen]
        level = list(new.values())
        containers.update(new)
        new.clear()
        if not level:
            break
    objects, untracked = list(picked.values()), list(containers.values())
    picked.clear()
    containers.clear()
    return objects, untracked


def _storage_ids(obj: Any) -> list[int]:
    from ..tracking.census import _torch, tensor_storages

    if not is_tensor_type(type(obj)):
        return []
    torch = _torch()
    with torch._C.DisableTorchFunction():
        return [id(storage) for storage in tensor_storages(obj)]


FORWARD_LIMIT = 200_000
"""Objects the forward search visits at most (a few tenths of a second). It looks for where the
backward search stopped, found within a few levels of the roots."""


def _search_forward(
    wanted: set[int],
    roots: Sequence[Any],
    ignore: set[int],
    exclude_types: tuple[type, ...],
    by_storage: dict[int, Any] | None = None,
    limit: int = FORWARD_LIMIT,
    covers: dict[int, int] | None = None,
    needed: int = 0,
) -> dict[int, list[Any]]:
    """Shortest chains from ``roots`` to the wanted ids, breadth first along ``gc.get_referents``,
    visiting at most ``limit`` objects. With ``covers`` (what each wanted id leads to, as bits) the
    search stops once the chains found cover ``needed``.

    Level by level: the referents of a whole level are listed by C-level calls, and each new
    object costs a set lookup and its parent's note."""
    by_storage = by_storage or {}
    remaining = set(wanted)
    covered = 0
    found: dict[int, list[Any]] = {}
    excluded = frozenset(exclude_types)
    parent: dict[int, Any] = {id(root): None for root in roots}  # also what was seen: one table, not two
    level = list(roots)
    visited = len(level)
    while level and remaining and visited < limit:
        following: list[Any] = []
        note = following.append
        for node, children in zip(level, map(gc.get_referents, level), strict=False):
            if is_ndarray(node):  # it keeps its base tensor without telling gc
                children = _referents(node, by_storage)
            elif type(node) in (FrameLocal, NamedRoot):
                # a root that a record of this package's stands for: what it holds is the value
                # it names, not the record's own class (a walk on from there would reach the
                # whole plugin, and chains that start at a local the frame does not have)
                children = [node.value]
            for child in children:
                ident = id(child)
                if ident in parent or ident in ignore or type(child) in excluded:
                    continue
                parent[ident] = node
                note(child)
                if ident in remaining:
                    remaining.discard(ident)
                    chain = [child]
                    while parent[id(chain[-1])] is not None:
                        chain.append(parent[id(chain[-1])])
                    found[ident] = chain[::-1]
                    if covers is not None:
                        covered |= covers.get(ident, 0)
                        if covered & needed == needed:
                            remaining.clear()
        visited += len(following)
        level = following
    parent.clear()
    return found


def _users_modules(modules: Sequence[Any]) -> list[Any]:
    """The modules loaded from files outside the standard library, installed packages, torch and
    this plugin (the folders allocation sites leave out too)."""
    library, _, standard, installed = code_folders()
    libraries = (*library, *standard, *installed)
    users = []
    for module in modules:
        path = module.__dict__.get("__file__")
        if (path is None and module.__name__ == "__main__") or (
            isinstance(path, str) and not path.startswith(libraries) and not is_loaded_standard_library(path)
        ):
            users.append(module)
    return users


def _covered(found: dict[int, list[Any]], covers: dict[int, int]) -> int:
    bits = 0
    for ident in found:
        bits |= covers.get(ident, 0)
    return bits


def find_chains(
    targets: Sequence[Any],
    *,
    max_depth: int = BACKWARD_LEVELS,
    max_frontier: int = 5_000,
    exclude_types: tuple[type, ...] = (),
    frames: Sequence[types.FrameType] = (),
    named: Sequence[NamedRoot] = (),
    collect: bool = True,
    known: tuple[set[int], list[Any]] | None = None,
) -> list[list[Any]]:
    """For each target, a shortest chain ``[root, ..., target]`` of objects holding it.

    The search stops as soon as every target has a root, and only keeps expanding the holders
    of targets still without one. Where no root is found within ``max_depth`` levels the chain
    starts at the farthest holder reached, or is ``[target]`` alone when nothing in gc holds it.
    Objects of ``exclude_types`` (the caller's own records) never count as holders. The returned
    chains hold strong references: drop them once named.

    Garbage (reference cycles not yet collected) never lies on a chain from a root: nothing
    reachable refers to it. It can only stand at the start of a chain that found no root, where
    the search stopped at its limits with garbage in its last level; so the heap is collected
    (one pass over all of it) only where a target found no root, and searched again only where
    the search met its limits. ``collect=False`` where the caller has just collected every
    generation.

    ``known``: the ids of some objects, and a list of every gc-tracked object that referred to any
    of them when it was made (:func:`without_python_holders`' ``keep``, moments before, with no
    code of the user's run since): where the targets are among those objects, the first level
    reads that list instead of the heap. The search clears the list.
    """

    def search(first: list[Any] | None) -> tuple[list[list[Any]], bool, bool, bool]:
        return _search_chains(
            targets,
            max_depth=max_depth,
            max_frontier=max_frontier,
            exclude_types=exclude_types,
            frames=frames,
            named=named,
            first=first,
        )

    first = known[1] if known is not None and all(id(target) in known[0] for target in targets) else None
    try:
        chains, rooted, limited, cycled = search(first)
    finally:
        if known is not None:
            known[1].clear()  # (what it keeps alive may be garbage: gone before a collection)
    if rooted or not collect:
        return chains
    if limited or cycled:  # (a cycle nothing found reaches may be garbage)
        chains.clear()
        gc.collect()
        return search(None)[0]
    # Nothing the search found can be garbage (the objects it ended at have no holder at all),
    # but what a caller looks through next for the targets left (autograd nodes, every object)
    # must not find garbage either.
    gc.collect()
    return chains


def _search_chains(
    targets: Sequence[Any],
    *,
    max_depth: int,
    max_frontier: int,
    exclude_types: tuple[type, ...],
    frames: Sequence[types.FrameType],
    named: Sequence[NamedRoot],
    first: list[Any] | None,
) -> tuple[list[list[Any]], bool, bool, bool]:
    """:func:`find_chains`' search over the heap as it is: the chains, whether each starts at a
    root, whether the backward search stopped at ``max_depth`` or left holders out of a level
    longer than ``max_frontier``, and whether a chain starts on a cycle of holders nothing found
    refers to (see :func:`_kept_cycle_chains`). ``first``: a list that holds every gc-tracked
    referrer of the targets (and maybe more), read in place of the first level's pass over the heap."""
    own = _own_frames()
    stack = _frames_not_ours(own)
    search = _Backward(targets, _roots_in_frames(named, [*frames, *stack]), own, exclude_types, max_frontier)
    search.ignore.add(id(stack))
    search.on_stack.update(id(f) for f in stack)
    frontier: tuple[Any, ...] = tuple(targets)
    depth = 0
    while frontier and search.unrooted and depth < max_depth:
        depth += 1
        if not search.root_locals(frontier):
            break  # every target has a root now: a holder found at this level would make no shorter chain
        frontier = search.level(frontier, first if depth == 1 and first is not None else None)
    search.limited = search.limited or bool(frontier and search.unrooted)
    frontier = search.tidy(frontier)
    chains_by_target: dict[int, list[Any]] = {}
    wanted = {id(t) for t in targets}
    search.ignore.update((id(chains_by_target), id(wanted)))
    chains_by_target.update(_walk_down(list(search.roots.values()), search.held_by, wanted))
    if search.unrooted:
        _meet_forward(search, targets, frontier, chains_by_target, exclude_types)
    starts = list(search.runner_roots.values())  # pytest's own frames, where nothing else was found
    chains_by_target.update(_walk_down(starts, search.held_by, wanted - chains_by_target.keys()))
    # a real root beats a dead end: the farthest holder reached that nothing in Python holds
    chains_by_target.update(_dead_end_chains(search, wanted - chains_by_target.keys(), max_depth))
    cycled = _kept_cycle_chains(search.held_by, [t for t in targets if id(t) not in chains_by_target])
    chains_by_target.update(cycled)
    chains = [chains_by_target.get(id(target), [target]) for target in targets]
    rooted = not cycled and all(len(chain) > 1 and _is_root(chain[0]) for chain in chains)
    search.clear()
    chains_by_target.clear()
    return chains, rooted, search.limited, bool(cycled)


def _dead_end_chains(search: _Backward, wanted: set[int], levels: int) -> dict[int, list[Any]]:
    """The chains of the ``wanted`` targets from the farthest holders the search reached: those of
    its last level, where it stopped at its depth (``levels``), start at a :class:`SearchStopped`."""
    stopped = search.stopped
    starts = list(search.dead_ends.values())
    try:
        down = _walk_down(starts, search.held_by, wanted)
    finally:
        starts.clear()
    return {
        ident: [SearchStopped(objects[0], levels), *objects] if id(objects[0]) in stopped else objects
        for ident, objects in down.items()
    }


_NOT_OWNERS: tuple[type, ...] = (dict, list, tuple, set, frozenset, collections.deque, types.CellType)
_NOT_OWNERS += (types.MethodType, types.FunctionType, types.FrameType, types.TracebackType)
"""Holders that are not what a user would call the owner of what they hold: containers, and what
functions are made of."""


def _kept_cycle_chains(held_by: dict[int, list[Any]], targets: list[Any]) -> dict[int, list[Any]]:
    """Chains for ``targets`` whose holders the search found, none rooted nor a dead end: they
    lie on a reference cycle nothing it found refers to, which something outside gc keeps (the
    Python methods of a module ``torch.jit.script`` compiled keep it, and TorchScript keeps them).
    Each starts at the nearest holder that is an object of its own (a ``Metric``, not its
    ``__dict__`` or a closure's cell), else the nearest holder, named as a root of kind ``kept cycle``."""
    if not targets:
        return {}
    objects: dict[int, Any] = {}
    holders_of: dict[int, list[int]] = {}
    for holder, held in held_by.items():
        for obj in held:
            objects[id(obj)] = obj
            holders_of.setdefault(id(obj), []).append(holder)
    found: dict[int, list[Any]] = {}
    # (where the suite froze the heap, the cycle may be garbage frozen with it: no collection examines it)
    frozen = frozen_by_the_suite()
    kept = (
        "frozen with the heap (gc.freeze()), or kept from outside Python's gc"
        if frozen
        else "kept from outside Python's gc"
    )
    for target in targets:
        start = _nearest_owner(id(target), holders_of, objects)
        if start is None:
            continue
        chain = _walk_down([start], held_by, {id(target)}).get(id(target))
        if chain is not None:
            label = f"<{type(start).__qualname__} on a reference cycle {kept}>"
            found[id(target)] = [NamedRoot(label, start, role="frozen cycle" if frozen else "kept cycle"), *chain]
    objects.clear()
    holders_of.clear()
    return found


def _nearest_owner(target: int, holders_of: dict[int, list[int]], objects: dict[int, Any]) -> Any:
    """Of the holders above ``target`` (breadth first), the nearest that is an object of its own
    (see :data:`_NOT_OWNERS`), else the nearest; None where it has none, or where one of them has no
    holder in turn: a dead end, or what only this package's records hold, not a cycle."""
    seen = {target}
    level = [target]
    owner = nearest = None
    while level:
        above = [holder for ident in level for holder in holders_of.get(ident, ()) if holder not in seen]
        seen.update(above)
        for ident in above:
            obj = objects.get(ident)
            if obj is None or not holders_of.get(ident):
                return None
            if owner is None and not issubclass(type(obj), _NOT_OWNERS):
                owner = obj
            if nearest is None:
                nearest = obj
        level = above
    return owner if owner is not None else nearest


def _in_runner(root: Any) -> bool:
    """Whether a root is a local of a frame of pytest's or pluggy's own code."""
    return type(root) is FrameLocal and frame_kind_of_file(root.frame.f_code.co_filename) == "runner"


def _roots_in_frames(named: Sequence[NamedRoot], frames: Sequence[types.FrameType]) -> dict[int, Any]:
    """The values the caller names, and the locals of ``frames`` (those of an error being reported,
    and this thread's running ones) and of every other thread's running frames, by their ids."""
    running_locals: dict[int, Any] = {id(root.value): root for root in named}
    for ident, frame_local in _running_locals(frames).items():
        running_locals.setdefault(ident, frame_local)
    # Other threads' running frames are roots too: a background thread's local is no C++ holder.
    for thread_name, thread_id, frame in _other_threads_frames():
        for ident, frame_local in _running_locals([frame], thread_name, thread_id).items():
            running_locals.setdefault(ident, frame_local)
    return running_locals


def _array_holders(ndarray: type, arrays: list[Any], tensors: list[Any]) -> list[tuple[Any, list[Any]]]:
    """Which of ``arrays`` hold which of ``tensors``: as their base, or through a base tensor that
    shares a tensor's storage."""
    ids = {id(tensor) for tensor in tensors}
    by_storage = {storage: tensor for tensor in tensors for storage in _storage_ids(tensor)}
    found = []
    for array in arrays:
        base = ndarray.base.__get__(array)  # type: ignore[attr-defined]  # the C attribute: no code of the array's runs
        if id(base) in ids:
            found.append((array, [base]))
            continue
        shared = [by_storage[storage] for storage in _storage_ids(base) if storage in by_storage]
        if shared:
            found.append((array, shared[:1]))
    by_storage.clear()
    return found


def _object_array_holders(ndarray: type, arrays: list[Any], unheld: list[Any]) -> list[tuple[Any, list[Any]]]:
    """Which of ``arrays`` of Python objects (``dtype=object``) hold which of ``unheld``: numpy does
    not show their items to gc. Read through ndarray's C attributes: no code of an array's runs."""
    ids = {id(obj) for obj in unheld}
    found = []
    for array in arrays:
        try:
            if not ndarray.dtype.__get__(array).hasobject:  # type: ignore[attr-defined]
                continue
            held = [item for item in ndarray.ravel(array) if id(item) in ids]  # type: ignore[attr-defined]
        except Exception:  # (a structured dtype's records, an array numpy will not flatten)
            continue
        if held:
            found.append((array, held))
    return found


class _Backward:
    """The state of the backward search, level by level from the targets. It keeps the objects
    it meets only in its own containers, whose ids the search ignores: none is taken for a holder."""

    __slots__ = (
        "held_by",
        "origins",
        "unrooted",
        "roots",
        "dead_ends",
        "stopped",
        "running_locals",
        "ignore",
        "on_stack",
        "exclude_types",
        "max_frontier",
        "limited",
        "untracked",
        "runner_roots",
    )

    def __init__(
        self,
        targets: Sequence[Any],
        running_locals: dict[int, Any],
        own: set[int],
        exclude_types: tuple[type, ...],
        max_frontier: int,
    ) -> None:
        self.held_by: dict[int, list[Any]] = {}  # id(holder) -> the objects it holds one level nearer a target
        self.origins: dict[int, int] = {id(t): 1 << i for i, t in enumerate(targets)}  # bit i: leads to targets[i]
        self.unrooted = (1 << len(targets)) - 1
        self.roots: dict[int, Any] = {}
        self.dead_ends: dict[int, Any] = {}
        self.stopped: set[int] = set()
        """Ids of the last level where the search stopped at its depth (see :meth:`tidy`)."""
        self.running_locals = running_locals
        self.on_stack: set[int] = set()
        self.exclude_types = exclude_types
        self.max_frontier = max_frontier
        self.limited = False
        self.untracked: tuple[list[Any], list[Any]] | None = None  # numpy arrays, containers gc does not track
        self.runner_roots: dict[int, Any] = {}
        """Locals of pytest's and pluggy's running frames met: roots taken only where the search
        finds no other (what a hook wrapper's frame holds for a moment is also reachable from
        where it lives, a logger reached from ``logging``)."""
        self.ignore = own | {
            id(self),
            id(self.held_by),
            id(self.origins),
            id(targets),
            id(running_locals),
            id(self.roots),
            id(self.dead_ends),
            id(self.runner_roots),
        }

    def root_locals(self, frontier: tuple[Any, ...]) -> bool:
        """Root what in ``frontier`` is a running frame's local or a named value; whether a target is left without a root."""
        for obj in frontier:
            local = self.running_locals.get(id(obj))
            if local is not None and _in_runner(local):
                self.runner_roots[id(local)] = local
                self.held_by[id(local)] = [obj]
            elif local is not None:
                self.roots[id(local)] = local
                self.held_by[id(local)] = [obj]
                self.unrooted &= ~self.origins[id(obj)]
        return bool(self.unrooted)

    def level(self, frontier: tuple[Any, ...], referrers: list[Any] | None) -> tuple[Any, ...]:
        """Record the holders of ``frontier`` (from ``referrers``, or a pass over the heap), root the
        modules among them, and return the next level: the holders that lead to a target still without a root."""
        self.ignore.add(id(frontier))
        frontier_ids = {id(o) for o in frontier}
        has_holder = {id(obj) for obj in frontier if id(obj) in self.running_locals}
        if referrers is None:
            referrers = _referrers(frontier, frontier_ids)
        self.ignore.add(id(referrers))
        next_level: list[Any] = []
        for holder in referrers:
            held = self._held(holder, frontier_ids)
            if held:
                has_holder.update(id(h) for h in held)
                self._record(holder, held, next_level)
        del referrers
        unheld = [obj for obj in frontier if id(obj) not in has_holder]
        for holder, held in self._untracked_holders(unheld):
            has_holder.update(id(h) for h in held)
            self._record(holder, held, next_level)
        unheld.clear()
        for obj in frontier:
            if id(obj) not in has_holder:
                self.dead_ends[id(obj)] = obj
        # Holders that lead only to targets already rooted need not be followed further.
        return tuple(h for h in next_level if self.origins[id(h)] & self.unrooted)

    def _held(self, holder: Any, frontier_ids: set[int]) -> list[Any]:
        """What of the level ``holder`` holds, where it counts as a holder."""
        if id(holder) in self.ignore or id(holder) in self.on_stack or type(holder) in self.exclude_types:
            return []
        if type(holder) is dict and _anomaly_metadata(holder):
            return []
        held = [r for r in gc.get_referents(holder) if id(r) in frontier_ids]
        if held and is_module_root(holder):
            # what a C module keeps in its state (``_pickle``'s copy of copyreg.dispatch_table)
            # is reached from its Python owner, by a name the user knows
            namespace = _MODULE_NAMESPACE.__get__(holder)
            held = [h for h in held if h is namespace]
        return held

    def _untracked_holders(self, unheld: list[Any]) -> list[tuple[Any, list[Any]]]:
        """The holders gc does not see of the objects in ``unheld`` (nothing gc tracks refers to
        them): a numpy array whose base is a tensor among them or shares its memory, and a tuple or
        dict gc does not track that holds such an array. The heap is listed for them once per
        search, and only where numpy is loaded."""
        ndarray = getattr(sys.modules.get("numpy"), "ndarray", None)
        tensors = [obj for obj in unheld if is_tensor_type(type(obj))]
        # (a tuple or dict gc does not track holds only objects gc does not track either)
        others = {id(obj) for obj in unheld if type(obj) is ndarray or not gc.is_tracked(obj)}
        if ndarray is None or not unheld:
            return []
        if self.untracked is None:
            with whole_heap():
                everything = gc.get_objects()
            everything += [local.value for local in self.running_locals.values()]
            self.untracked = untracked_referents(everything, {ndarray})
            everything.clear()
            self.ignore.update(id(found) for found in self.untracked)
        arrays, containers = self.untracked
        found = _array_holders(ndarray, arrays, tensors) if tensors else []
        found += _object_array_holders(ndarray, arrays, unheld)
        for container in containers if others else ():
            held = [obj for obj in gc.get_referents(container) if id(obj) in others]
            if held:
                found.append((container, held))
        tensors.clear()
        return found

    def _record(self, holder: Any, held: list[Any], next_level: list[Any]) -> None:
        self.held_by.setdefault(id(holder), []).extend(held)
        leads_to = 0
        for h in held:
            leads_to |= self.origins[id(h)]
        if id(holder) in self.origins:
            self.origins[id(holder)] |= leads_to
            return
        self.origins[id(holder)] = leads_to
        if is_module_root(holder):
            self.roots[id(holder)] = holder
            self.unrooted &= ~leads_to
        elif len(next_level) < self.max_frontier:
            next_level.append(holder)
        else:
            self.limited = True

    def tidy(self, frontier: tuple[Any, ...]) -> tuple[Any, ...]:
        """The last level less this package's own records, which join the dead ends otherwise."""
        # This package's own lists and tables (the tensors it is naming, the autograd nodes it looks
        # through) refer to what they list, and nothing in gc refers to them: its running frames do.
        # They hold nothing of the user's.
        records = _own_records()
        frontier = tuple(obj for obj in frontier if id(obj) not in records)
        if self.unrooted:  # (where the search stopped at its depth: not known to be held outside gc)
            self.stopped = {id(obj) for obj in frontier}
        self.ignore.add(id(frontier))
        for ident in records.intersection(self.dead_ends):
            del self.dead_ends[ident]
        for obj in frontier:
            self.dead_ends.setdefault(id(obj), obj)
        return frontier

    def clear(self) -> None:
        for found in self.untracked or ():
            found.clear()
        self.held_by.clear()
        self.roots.clear()
        self.runner_roots.clear()
        self.dead_ends.clear()
        self.running_locals.clear()


def _meet_forward(
    search: _Backward,
    targets: Sequence[Any],
    frontier: tuple[Any, ...],
    chains_by_target: dict[int, list[Any]],
    exclude_types: tuple[type, ...],
) -> None:
    """Forward from the roots to where the backward search stopped, then down its edges: the
    chains of the targets it left without a root, added to ``chains_by_target``. Where it stopped
    at no holder (nothing in Python, seen by gc or not, holds the targets) there is nothing to meet."""
    ignore, unrooted = search.ignore, search.unrooted
    wanted = {id(t) for t in targets}
    remaining = wanted - chains_by_target.keys()
    # where the backward search stopped: its last level, and the holders nothing in gc holds
    # (an object C code keeps, reached from a module through one gc does not track)
    meeting = {
        id(holder): holder
        for holder in (*frontier, *search.dead_ends.values())
        if id(holder) not in wanted and search.origins.get(id(holder), 0) & unrooted
    }
    if not meeting:
        return
    module_roots = [m for m in list(sys.modules.values()) if is_module_root(m)]
    plain_locals: list[Any] = []
    runner_locals: list[Any] = []
    for local in search.running_locals.values():
        (runner_locals if _in_runner(local) else plain_locals).append(local)
    starts = module_roots + plain_locals
    everything = starts + runner_locals
    covers = {ident: search.origins.get(ident, 0) for ident in (*remaining, *meeting)}
    ignore.update((id(module_roots), id(starts), id(wanted), id(remaining), id(meeting), id(covers)))
    ignore.update((id(everything), id(plain_locals), id(runner_locals)))
    by_storage = {storage: target for target in targets if id(target) in remaining for storage in _storage_ids(target)}
    forward: dict[int, list[Any]] = {}
    # The user's modules first (tests, conftest, the project's own source): torch.compile's
    # graphs and most caches hang from them, a few levels down, where a walk from every module
    # in the process would give up first.
    # A walk from some modules does not pass through the others: they are roots of their own
    # (sys.last_value is sys's, not that of a module that imports sys).
    # Nor through their namespaces, which their functions' __globals__ reach.
    users = _users_modules(module_roots)
    others = _with_namespaces(module_roots) - _with_namespaces(users)
    users += plain_locals
    # Then the figures pyplot keeps open, walked without passing into any module: an artist of
    # one (a tick locator's array over a tensor) is a dozen levels from the module that keeps
    # them, beyond the backward search, and a walk from every module gives up before.
    figures = pyplot_figures()
    ignore.update((id(users), id(others), id(by_storage), id(figures), id(forward)))
    groups = [(users, ignore | others), (starts, ignore), (everything, ignore)]
    if figures:
        groups.insert(1, (figures, ignore | _with_namespaces(module_roots)))
    # pytest's and pluggy's running frames last: what a hook wrapper holds for a moment is also
    # reachable from where it lives (a logger from logging), by the name the user knows. Each walk
    # looks for what the walks before it did not reach, and keeps what they did.
    for group, skip in groups:
        reached = _search_forward(
            (remaining | meeting.keys()) - forward.keys(),
            group,
            skip,
            exclude_types,
            by_storage,
            covers=covers,
            needed=unrooted & ~_covered(forward, covers),
        )
        forward.update(reached)
        reached.clear()
        if _covered(forward, covers) & unrooted == unrooted:
            break
    _join(forward, remaining, meeting, search.held_by, chains_by_target)
    forward.clear()
    meeting.clear()
    for found in (module_roots, starts, users, everything, plain_locals, runner_locals, figures):
        found.clear()
    by_storage.clear()


def pyplot_figures() -> list[NamedRoot]:
    """The figures pyplot keeps open (``matplotlib._pylab_helpers.Gcf.figs``, each a manager whose
    canvas holds the figure), as roots named by their number; none where pyplot was not used.
    Read through C-level attributes and exact types: no code of matplotlib's runs."""
    helpers = sys.modules.get("matplotlib._pylab_helpers")
    gcf = (instance_dict(helpers) or {}).get("Gcf") if helpers is not None else None
    figs = vars(gcf).get("figs") if type(gcf) is type else None
    if not isinstance(figs, dict):
        return []
    roots = []
    for number, manager in list(dict.items(figs)):
        canvas = (instance_dict(manager) or {}).get("canvas")
        figure = (instance_dict(canvas) or {}).get("figure") if canvas is not None else None
        if figure is not None:
            label = f"pyplot figure {number}" if type(number) is int else "a pyplot figure"
            roots.append(NamedRoot(f"{label} (open)", figure, role="pyplot figure"))
    return roots


_ANOMALY_KEYS = frozenset({"traceback_", "parent_"})


def _anomaly_metadata(holder: dict[Any, Any]) -> bool:
    """Whether a dict is an autograd node's anomaly-mode metadata with a ``parent_`` entry: under
    anomaly mode (the run that records sites turns it on), a node made during backward keeps there
    the node whose backward made it. That is the graph's own bookkeeping, held from C++ by the node,
    not a holder to name (the same graph keeps the same tensors without it)."""
    if dict.__len__(holder) > len(_ANOMALY_KEYS):
        return False
    keys = list(dict.keys(holder))
    # (the types first: comparing a key of the user's class would run its __eq__)
    return all(type(key) is str for key in keys) and "parent_" in keys and _ANOMALY_KEYS.issuperset(keys)


def signal_handlers() -> list[NamedRoot]:
    """The Python handlers ``signal.signal`` was given (functions, bound methods, any callable object
    of Python's), which the signal module keeps outside gc until another replaces them, as roots
    named by their signal. Read with ``signal.getsignal``, which runs no code of the handler's."""
    signal = sys.modules.get("signal")
    if signal is None:
        return []
    roots = []
    for number in sorted(signal.valid_signals()):
        try:
            handler = signal.getsignal(number)
            name = signal.Signals(number).name
        except (ValueError, OSError):  # (a real-time signal without a name)
            continue
        if handler is None or isinstance(handler, (int, types.BuiltinFunctionType)):
            continue  # SIG_DFL, SIG_IGN, Python's own default_int_handler
        if type(handler) is types.MethodType:
            label = f"{type_name(handler.__self__)}.{getattr(handler.__func__, '__name__', '?')}"
        elif isinstance(handler, types.FunctionType):
            label = handler.__qualname__
        else:
            label = f"a {type_name(handler)}"
        roots.append(NamedRoot(f"the {name} handler ({label})", handler, role="signal handler"))
    return roots


def torch_modes() -> list[tuple[str, int, Any]]:
    """The modes on torch's ``TorchFunctionMode`` and ``TorchDispatchMode`` stacks (entered, and
    not exited yet), each with its stack's kind and its place on it; none where torch is not
    imported. Read with torch's own getters: no code of a mode's runs."""
    torch = sys.modules.get("torch")
    C = getattr(torch, "_C", None)
    modes = []
    for what, length, get in (
        ("TorchFunctionMode", "_len_torch_function_stack", "_get_function_stack_at"),
        ("TorchDispatchMode", "_len_torch_dispatch_stack", "_get_dispatch_stack_at"),
    ):
        try:
            modes += [(what, index, getattr(C, get)(index)) for index in range(getattr(C, length)())]
        except Exception:  # (a torch without these getters)
            continue
    return modes


def torch_mode_stacks() -> list[NamedRoot]:
    """The modes of :func:`torch_modes`, which torch keeps in C++ outside gc, as roots named by
    their place on their stack."""
    roots = []
    for what, index, mode in torch_modes():
        label = f"{what} stack[{index}] ({type_name(mode)}, entered and not exited)"
        roots.append(NamedRoot(f"torch's {label}", mode, role="mode stack"))
    return roots


def _join(
    forward: dict[int, list[Any]],
    remaining: set[int],
    meeting: dict[int, Any],
    held_by: dict[int, list[Any]],
    chains_by_target: dict[int, list[Any]],
) -> None:
    """Add the chains the forward walk found: to a target, or to where the backward search
    stopped, then down the backward search's edges to the targets."""
    for ident, chain in forward.items():
        if ident in remaining:
            chains_by_target.setdefault(ident, chain)
    for ident, chain in sorted(forward.items(), key=lambda item: len(item[1])):
        if ident not in meeting:
            continue
        down = _walk_down([meeting[ident]], held_by, remaining - chains_by_target.keys())
        for target_id, rest in down.items():
            chains_by_target[target_id] = chain + rest[1:]


def _with_namespaces(modules: Sequence[Any]) -> set[int]:
    """The ids of ``modules`` and of their namespaces."""
    return {ident for module in modules for ident in (id(module), id(_MODULE_NAMESPACE.__get__(module)))}


_RECORD_TYPES = frozenset({list, dict, tuple, set, frozenset, collections.deque})
_CO_OPTIMIZED = 0x1


def _own_records() -> set[int]:
    """Ids of the containers that this package's running functions (other than this module's,
    whose lists the search ignores by id) have as locals: the records its callers keep of what
    they name. A running frame's locals are invisible to gc: they are read from the frame, and
    the snapshot of them that this makes is emptied again, so that it keeps nothing alive."""
    records: set[int] = set()
    frames: list[types.FrameType] = []
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_filename.startswith(_PACKAGE_DIR) and code.co_filename != __file__ and code.co_flags & _CO_OPTIMIZED:
            frames.append(frame)
        frame = frame.f_back
    for frame in frames:
        try:
            # a snapshot (a dict, which is refreshed before any tracer reads it) or, from Python
            # 3.13 on, a view of the frame itself
            local_values = frame.f_locals
            values = list(dict.values(local_values) if type(local_values) is dict else local_values.values())
        except Exception:
            continue
        records.update(id(value) for value in values if type(value) in _RECORD_TYPES)
        if type(local_values) is dict:
            local_values.clear()
        del local_values, values
    frames.clear()
    return records


def _is_root(obj: Any) -> bool:
    """A root the search starts chains at: a running frame's local, a named value, a module."""
    return type(obj) in (FrameLocal, NamedRoot) or is_module_root(obj)


def _walk_down(starts: list[Any], held_by: dict[int, list[Any]], wanted: set[int]) -> dict[int, list[Any]]:
    """Shortest chains from ``starts`` down the recorded edges to each wanted target."""
    previous: dict[int, Any] = {id(s): None for s in starts}
    objects: dict[int, Any] = {id(s): s for s in starts}
    found: dict[int, list[Any]] = {}
    level = list(starts)
    while level and len(found) < len(wanted):
        next_level = []
        for obj in level:
            if id(obj) in wanted and id(obj) not in found:
                chain = [obj]
                while previous[id(chain[-1])] is not None:
                    chain.append(previous[id(chain[-1])])
                found[id(obj)] = chain[::-1]
            for child in held_by.get(id(obj), ()):
                if id(child) not in previous:
                    previous[id(child)] = obj
                    objects[id(child)] = child
                    next_level.append(child)
        level = next_level
    previous.clear()
    objects.clear()
    return found


def chain_text(chain: Sequence[Any]) -> str:
    """Render ``[root, ..., target]`` as one line, e.g. ``tests.test_cache.CACHE['user-42']``."""
    return holder_path(chain).render()


def holder_paths(
    targets: Sequence[Any],
    *,
    max_depth: int = BACKWARD_LEVELS,
    exclude_types: tuple[type, ...] = (),
    frames: Sequence[types.FrameType] = (),
    named: Sequence[NamedRoot] = (),
    collect: bool = True,
    known: tuple[set[int], list[Any]] | None = None,
) -> list[HolderPath | None]:
    """Per target, the :class:`~.paths.HolderPath` of the chain of references that keeps it alive.

    None for a target that nothing visible to gc refers to: it is held from C++ (an autograd
    graph, a registry in an extension). ``known``: see :func:`find_chains`.
    """
    with whole_heap():
        chains = find_chains(
            targets,
            max_depth=max_depth,
            exclude_types=exclude_types,
            frames=frames,
            named=named,
            collect=collect,
            known=known,
        )
    try:
        return [
            (holder_path(chain) if still_holds(chain) else CHANGED_PATH) if len(chain) > 1 else None for chain in chains
        ]
    finally:
        chains.clear()


def still_holds(chain: Sequence[Any]) -> bool:
    """Whether each object of ``[root, ..., target]`` still refers to the next one: a chain found
    while another thread changed what it passes through is not shown as if it held."""
    for parent, child in zip(chain, chain[1:], strict=False):
        if type(parent) in (FrameLocal, NamedRoot, SearchStopped):
            if parent.value is not child:
                return False
        elif is_ndarray(parent):
            continue  # followed by storage, not by reference
        elif not _refers_to(parent, child):
            return False
    return True


def _holds(items: Any, child: Any) -> bool:
    """Whether ``child`` is one of ``items``, compared by identity in C (a table of 10^6 entries)."""
    return any(map(operator.is_, items, itertools.repeat(child)))


def _refers_to(parent: Any, child: Any) -> bool:
    referents = gc.get_referents(parent)
    if _holds(referents, child):
        return True
    # An object's attributes may have moved into a __dict__ since (naming edges reads __dict__).
    return any(type(referent) is dict and _holds(dict.values(referent), child) for referent in referents)


def name_holders(
    targets: Sequence[Any],
    *,
    max_depth: int = BACKWARD_LEVELS,
    exclude_types: tuple[type, ...] = (),
    frames: Sequence[types.FrameType] = (),
) -> list[str | None]:
    """One line per target naming the chain of references that keeps it alive (see :func:`holder_paths`)."""
    paths = holder_paths(targets, max_depth=max_depth, exclude_types=exclude_types, frames=frames)
    return [path.render() if path is not None else None for path in paths]


def _python_holders(
    objects: Sequence[Any], wanted_ids: set[int], exclude_types: tuple[type, ...] = (), ignore: Sequence[Any] = ()
) -> tuple[set[int], list[Any]]:
    """Who in Python holds any of ``objects``: the ids of those a running frame (not this
    package's) has as a local, and the gc-tracked objects that refer to any of them, less this
    package's frames, the caller's own list and the objects in ``ignore`` (the caller's other
    records). The caller clears the list it gets."""
    own = _own_frames()
    own.update(id(record) for record in ignore)
    wanted = tuple(objects)
    in_frames = {ident for ident in _running_locals(_frames_not_ours(own)) if ident in wanted_ids}
    with whole_heap():
        referrers = _referrers(wanted, wanted_ids)
    try:
        holders = [
            h
            for h in referrers
            if id(h) not in own and type(h) not in exclude_types and h is not objects and h is not wanted
        ]
    finally:
        del referrers
    return in_frames, holders


def without_python_holders(
    objects: Sequence[Any],
    *,
    exclude_types: tuple[type, ...] = (),
    keep: list[Any] | None = None,
    ignore: Sequence[Any] = (),
) -> set[int]:
    """Ids of the objects that nothing in Python refers to (no gc-tracked object, no running frame).

    ``ignore``: the caller's own records that refer to some of them. With ``keep``, the
    gc-tracked objects found referring to any of them are added to it: a search for their holders
    (:func:`find_chains`' ``known``) then need not list them again."""
    wanted_ids = {id(o) for o in objects}
    held, holders = _python_holders(objects, wanted_ids, exclude_types, ignore)
    for holder in holders:
        held.update(id(r) for r in gc.get_referents(holder) if id(r) in wanted_ids)
    if keep is not None:
        keep += holders
    holders.clear()
    return wanted_ids - held


INSIDE_LIMIT = 200_000
"""Objects :func:`held_only_inside` walks from its values before it gives up (and says no)."""


def held_only_inside(objects: Sequence[Any], values: Sequence[Any]) -> bool:
    """Whether every one of ``objects`` is reached from ``values`` (through their attributes and
    containers: never through a module, a class or a function's globals) and every gc-visible
    holder of each of them is itself reached so: nothing else in Python (a module's list, a frame
    still running) holds any of them. Two walks: ``values``' own objects, then the heap once."""
    wanted_ids = {id(o) for o in objects}
    inside: set[int] = set()
    stack: list[Any] = list(values)
    skip = (types.ModuleType, type, types.FunctionType, types.FrameType, types.CodeType)
    while stack:
        obj = stack.pop()
        if id(obj) in inside or issubclass(type(obj), skip):
            continue
        inside.add(id(obj))
        if len(inside) > INSIDE_LIMIT:
            return False
        stack += gc.get_referents(obj)
    stack.clear()
    if not objects or not wanted_ids <= inside:
        return False
    in_frames, holders = _python_holders(objects, wanted_ids)
    try:
        return not in_frames and all(id(holder) in inside for holder in holders)
    finally:
        holders.clear()


_HOOK_ATTRIBUTES = (
    "_forward_hooks",
    "_forward_pre_hooks",
    "_backward_hooks",
    "_backward_pre_hooks",
    "_state_dict_hooks",
)


def module_types() -> list[type]:
    """``torch.nn.Module`` and every subclass of it defined so far (none where torch.nn is not loaded)."""
    nn = sys.modules.get("torch.nn")
    if nn is None:
        return []
    found: list[type] = []
    pending: list[type] = [nn.Module]
    seen: set[int] = set()
    while pending:
        cls = pending.pop()
        if id(cls) not in seen:
            seen.add(id(cls))
            found.append(cls)
            pending.extend(type.__subclasses__(cls))
    return found


_MODULE_TABLES = frozenset({"_parameters", "_buffers", "_modules"})
"""An ``nn.Module``'s own tables (exact dicts): what they hold is the module's, not what a hook kept."""
_FILLED_TYPES = (list, dict, collections.deque)


def hook_holdings(modules: Sequence[Any]) -> dict[int, str]:
    """Ids of the objects that a module hook may be keeping, each with what says so: the items
    of a container (a list, dict or deque) that a hook function's closure holds ("a forward hook
    of a Linear, capture(), appends to what holds these tensors"), and the items of a container
    that is an attribute of a module with hooks ("... is registered on the module whose
    .activations holds these tensors"): what a hook that stores what it sees keeps. Ids only:
    nothing is kept alive.

    From each of ``modules`` (``nn.Module`` instances) down through its hook dicts, the cells of
    each hook function's closure and the containers in them, and its own attributes: all read
    through C-level attributes and exact types, so no code of a module, a hook or a container runs."""
    held: dict[int, str] = {}
    for module in modules:
        namespace = instance_dict(module) or {}
        hooks = [
            (f"a {kind} hook of a {type_name(module)}, {_function_label(function)}", function)
            for kind, function in _module_hooks(namespace)
        ]
        for hook, function in hooks:
            for container in _closure_containers(function):
                for item in gc.get_referents(container):
                    held.setdefault(id(item), f"{hook}, appends to what holds these tensors")
        if not hooks:
            continue
        first = hooks[0][0]
        for attribute, container in _container_attributes(namespace):
            for item in gc.get_referents(container):
                held.setdefault(
                    id(item), f"{first}, is registered on the module whose .{attribute} holds these tensors"
                )
    return held


def _module_hooks(namespace: dict[str, Any]) -> list[tuple[str, types.FunctionType]]:
    """Each Python function in a module's hook dicts, with the kind of hook (``forward``)."""
    found: list[tuple[str, types.FunctionType]] = []
    for attribute in _HOOK_ATTRIBUTES:
        hooks: Any = namespace.get(attribute)
        if not issubclass(type(hooks), dict):
            continue
        kind = attribute.strip("_").removesuffix("_hooks").replace("_", " ")
        found.extend((kind, function) for function in dict.values(hooks) if type(function) is types.FunctionType)
    return found


def _function_label(function: types.FunctionType) -> str:
    """``capture()``, ``Probe.record()``, ``a lambda in test_it()``: a function's qualified name
    (its ``<locals>`` left out), read from its C attribute."""
    qualname = vars(types.FunctionType)["__qualname__"].__get__(function)
    if type(qualname) is not str:
        return "a function"
    parts = qualname.replace(".<locals>", "").split(".")
    if parts[-1] != "<lambda>":
        return ".".join(parts) + "()"
    return "a lambda" + (f" in {'.'.join(parts[:-1])}()" if len(parts) > 1 else "")


def _closure_containers(function: types.FunctionType) -> list[Any]:
    """The containers (lists, dicts, deques) in the cells of an exact function's closure."""
    found: list[Any] = []
    for cell in function.__closure__ or ():  # an exact function: its C attribute
        try:
            contents = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if type(contents) in _FILLED_TYPES:
            found.append(contents)
    return found


def _container_attributes(namespace: dict[str, Any]) -> list[tuple[str, Any]]:
    """The containers (lists, dicts, deques) that are a module's own attributes, by name."""
    return [
        (name, value)
        for name, value in dict.items(namespace)
        if type(name) is str and name not in _MODULE_TABLES and type(value) in _FILLED_TYPES
    ]


MAX_CYCLE_CANDIDATES = 64
"""How many holders of a tensor, nearest first, are tried as a point of its reference cycle."""


def _class_qualname(obj: Any) -> str | None:
    """The qualified name of ``obj`` where it is a class, read from C; else None."""
    if not issubclass(type(obj), type):
        return None
    name = type.__dict__["__qualname__"].__get__(obj)
    return name if type(name) is str else None


def cycle_holding(garbage: Sequence[Any], target: Any) -> HolderPath | None:
    """How a reference cycle kept ``target`` until a collection freed it, read from that collection's
    garbage (``gc.DEBUG_SAVEALL``): the path from the nearest object on a cycle to the target, as
    :func:`~.edges.holder_path` gives it with that object's class as its root (``Node.t``), and the cycle
    itself (``Node.me``, which leads back to the same ``Node``). None where no cycle of the garbage
    holds the target."""
    members = {id(obj) for obj in garbage}
    members.add(id(target))
    children: dict[int, list[Any]] = {}
    parents: dict[int, list[Any]] = collections.defaultdict(list)
    for obj in [*garbage, target]:
        inside = [referent for referent in gc.get_referents(obj) if id(referent) in members]
        children[id(obj)] = inside
        for referent in inside:
            parents[id(referent)].append(obj)

    def loop_through(start: Any) -> list[Any] | None:
        came_from: dict[int, Any] = {id(start): None}
        queue = collections.deque([start])
        while queue:
            node = queue.popleft()
            for child in children.get(id(node), ()):
                if child is start:
                    loop = [node]
                    while loop[-1] is not start:
                        loop.append(came_from[id(loop[-1])])
                    return [*reversed(loop), start]
                if id(child) not in came_from:
                    came_from[id(child)] = node
                    queue.append(child)
        return None

    seen = {id(target)}
    paths = collections.deque([[target]])
    tried = 0
    while paths and tried < MAX_CYCLE_CANDIDATES:
        path = paths.popleft()
        namespace = any(instance_dict(parent) is path[0] for parent in parents.get(id(path[0]), ()))
        tried += 1
        loop = None if namespace else loop_through(path[0])  # an object's __dict__ is named as the object
        if loop is not None:
            kind = type_name(path[0])
            name = _class_qualname(path[0]) or kind  # (a class is named as itself: a class is on a cycle of its own)
            return HolderPath(Root("cycle", name, kind), holder_path(path).edges, holder_path(loop).edges)
        for parent in parents.get(id(path[0]), ()):
            if id(parent) not in seen:
                seen.add(id(parent))
                paths.append([parent, *path])
    return None

"""The index of known tensors and storages: what each held when last read, and each one's death.

Every tensor read is indexed as an :class:`Entry`, a weak reference with what was read of it:
its storages, its gradient and its version counter when read; the storages its autograd graph
saved are indexed too. Every storage is indexed under a weak reference (:class:`StorageRef`) whose
callback reports its death, with its size, device and address when last read, the clock it was
first seen at (``born``), and the tensors that used it. The index keeps the bytes of the known
live storages per device; the :class:`~pytest_vramleak.tracking.ledger.Ledger` is told of every birth,
change of size and death.

**Why an entry stays true.** What a tensor holds changes when one of its storages dies (``set_``,
``.data =``, ``swap_tensors``, its gradient freed): the storage's callback names the tensors that
used it (:meth:`Index.process_dead`), which are read again; a tensor is among the users of its
gradient's storages, so a replaced gradient is such a death too. The other changes (a gradient
written by backward, growth in place, a graph given by an in-place operation) are found by the
comparisons of :mod:`pytest_vramleak.tracking.watches`, which keep the lists this index sorts tensors into:
leaves that can take a gradient (``capable``), tensors that retain theirs (``retainers``), and
older tensors that can take none (``plain``). Reading runs no code of the user's: torch's own
getters are called under ``DisableTorchFunction``.
"""

from __future__ import annotations

import functools
import operator
import weakref
from collections import Counter
from typing import Any

from . import gc_functions as gc
from .census import (
    _graph_tensors,
    _torch,
    collections_paused,
    is_tensor_type,
    storage_facts,
    tensor_storages,
    tensor_types,
    untyped_storage_types,
)
from .ledger import Ledger
from .refs import NO_GRAD, Entry, StorageRef, call, new_entry, sole_storage, storages_of
from .torch_api import objects_referring_to


def grad_fn_reader() -> Any:
    """``TensorBase``'s own ``grad_fn`` getter."""
    return _torch()._C.TensorBase.grad_fn.__get__


@functools.lru_cache(maxsize=1)
def version_reader() -> Any:
    """``TensorBase``'s own ``_version`` getter: no subclass's code runs."""
    return _torch()._C.TensorBase._version.__get__


@functools.lru_cache(maxsize=1)
def storage_readers() -> tuple[Any, Any]:
    """``TensorBase``'s own ``untyped_storage`` and ``is_nested`` getter: no subclass's code runs."""
    base = _torch()._C.TensorBase
    return base.untyped_storage, base.is_nested.__get__


_ENTRY_GRAD = operator.attrgetter("grad")
_ENTRY_VERSION = operator.attrgetter("version")


class Kinds:
    """The index's tensors sorted by what can change them unseen, with the lists a watch compares
    at C speed (made again after a change)."""

    def __init__(self) -> None:
        self.capable: dict[int, Entry] = {}
        self.capable_new: dict[int, Entry] = {}
        """Leaves that require grad indexed since the current test began: few, and they come and go."""
        self.retainers: dict[int, Entry] = {}
        """Tensors that are not leaves but retain their gradient: backward writes theirs without
        an ``AccumulateGrad`` node, so each backward pass compares them all (they are few)."""
        self.plain: dict[int, Entry] = {}
        """Older tensors that can take no gradient: an in-place operation can give them a graph."""
        self._grad_lists: tuple[list[Entry], list[int]] | None = None
        self._plain_lists: tuple[list[Entry], list[int]] | None = None

    def gradient_lists(self) -> tuple[list[Entry], list[int]]:
        """The references of the leaves in ``capable`` and the ids of their gradients when last read."""
        if self._grad_lists is None:
            entries = list(self.capable.values())
            self._grad_lists = (
                entries,
                list(map(id, map(call, map(_ENTRY_GRAD, entries)))),
            )
        return self._grad_lists

    def version_lists(self) -> tuple[list[Entry], list[int]]:
        """The references of the tensors in ``plain`` and their version counters when last read."""
        if self._plain_lists is None:
            entries = list(self.plain.values())
            self._plain_lists = entries, list(map(_ENTRY_VERSION, entries))
        return self._plain_lists

    def lists_changed(self, *, gradients: bool = False, versions: bool = False) -> None:
        """What was read changed: the lists are made again when next asked for."""
        if gradients:
            self._grad_lists = None
        if versions:
            self._plain_lists = None

    def join_capable(self) -> None:
        """Leaves that outlived the test that made them join the kept list."""
        if self.capable_new:
            self.capable.update(self.capable_new)
            self.capable_new.clear()
            self._grad_lists = None

    def make_plain(self, entries: list[Entry], indexed: dict[int, Entry]) -> None:
        """Tensors the last test made that outlive it (still ``indexed``) and take no gradient
        become older ones."""
        for entry in entries:
            ident = entry.ident
            if not entry.capable and entry() is not None and indexed.get(ident) is entry:
                self.plain[ident] = entry
                self._plain_lists = None

    def clear(self) -> None:
        """Forget every tensor."""
        for kept in (self.capable, self.capable_new, self.retainers, self.plain):
            kept.clear()
        self._grad_lists = self._plain_lists = None

    def sort(self, ident: int, entry: Entry, fresh: bool, leaf: bool, begun: bool) -> None:
        """Put a tensor just read in the lists the watches compare."""
        if entry.capable:
            if self.capable.get(ident) is not entry and self.capable_new.get(ident) is not entry:
                self.capable_new[ident] = entry
            if self.plain.pop(ident, None) is not None:
                self._plain_lists = None
        elif not begun and self.plain.get(ident) is not entry:
            self.plain[ident] = entry  # indexed between tests: older than the next test
            self._plain_lists = None
        if not entry.capable and not fresh:
            self.capable_new.pop(ident, None)
            if self.capable.pop(ident, None) is not None:
                self._grad_lists = None
        if entry.capable and not leaf:
            self.retainers[ident] = entry
        elif self.retainers:
            self.retainers.pop(ident, None)

    def forget(self, ident: int, entry: Entry) -> None:
        """Take a tensor that died off the lists."""
        if self.capable.get(ident) is entry:
            del self.capable[ident]
            self._grad_lists = None
        if self.capable_new.get(ident) is entry:
            del self.capable_new[ident]
        if self.retainers.get(ident) is entry:
            del self.retainers[ident]
        if self.plain.get(ident) is entry:
            del self.plain[ident]
            self._plain_lists = None


class Index:
    """Weak references to the known tensors and storages, with what each held when last read."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.entries: dict[int, Entry] = {}
        self.storages: dict[int, StorageRef] = {}
        self.opaque: set[int] = set()
        """Idents of the storages that are opaque tensors standing for their own storage
        (``to_mkldnn()``: see :func:`~pytest_vramleak.tracking.census.storage_facts`)."""
        self.totals: Counter[str] = Counter()
        """Bytes of the known live storages, by device."""
        self.kinds = Kinds()
        self._dead: list[StorageRef] = []
        self._dead_tensors: list[Entry] = []
        # Bound once (indexing makes a reference per storage and tensor), and in C: a callback runs
        # wherever an object dies, in any thread, and a Python function there is where a pending
        # Ctrl-C would be raised, and then lost as an exception ignored in a weakref callback.
        self._storage_died = self._dead.append
        self._tensor_died = self._dead_tensors.append

    # -- reading --------------------------------------------------------------------------------

    def scan(self, markers: tuple[type, ...] = ()) -> list[Any]:
        """Read every tensor and storage object in the unfrozen generations; return the objects
        of the ``markers`` classes among them."""
        torch = _torch()
        tensor_classes = tensor_types()
        storage_classes = untyped_storage_types()
        found = objects_referring_to((*tensor_classes, *storage_classes, *markers))
        tensors = set(tensor_classes)
        storages = set(storage_classes)
        marked = set(markers)
        seen: list[Any] = []
        visited: set[int] = set()
        keep: list[Any] = []
        try:
            with torch._C.DisableTorchFunction(), collections_paused():
                for obj in found:
                    kind = type(obj)
                    if kind in tensors:
                        self.read_tensor(obj, visited, keep)
                    elif kind in storages:
                        self.register(obj, None)
                    elif kind in marked:
                        seen.append(obj)
        finally:
            found.clear()
            keep.clear()
        return seen

    def read_generations(self, generations: tuple[int, ...]) -> None:
        """Read the tensors and storages of these gc generations (what was made since the last check)."""
        torch = _torch()
        tensor_classes = set(tensor_types())
        storage_classes = set(untyped_storage_types())
        visited: set[int] = set()
        keep: list[Any] = []
        with torch._C.DisableTorchFunction(), collections_paused():
            for generation in generations:
                for obj in gc.get_objects(generation):
                    kind = type(obj)
                    if kind in tensor_classes:
                        self.read_tensor(obj, visited, keep)
                    elif kind in storage_classes:
                        self.register(obj, None)
        keep.clear()

    def read_all(self) -> None:
        """Read every indexed tensor and storage again."""
        with _torch()._C.DisableTorchFunction():
            for ident, entry in list(self.entries.items()):
                tensor = entry()
                if tensor is None:
                    self.forget(ident, entry)
                    continue
                self.read_tensor(tensor, set(), [])
            for ref in list(self.storages.values()):
                storage = ref()
                if storage is not None:
                    self.register(storage, None)

    def reread(self, tensors: list[Any]) -> None:
        """Read these tensors again, in full."""
        with _torch()._C.DisableTorchFunction():
            for tensor in tensors:
                self.read_tensor(tensor, set(), [])

    def read_tensor(self, tensor: Any, visited: set[int], keep: list[Any]) -> None:
        """Read a tensor whole: its storages, its gradient, the tensors its autograd graph saved.

        Most tensors are read once, when first found (a scan reads 10^5 of them where a test keeps
        them), and hold one strided storage not indexed yet: such a tensor's entry is made here,
        and its storage indexed at once (:meth:`_index_storage`), without the calls and lookups of
        the general way (:meth:`_read_storages`, :meth:`register`), which could find nothing for
        it. Its gradient and graph are read (:meth:`_read_links`) only where it has or had one."""
        ident = id(tensor)
        entry = self.entries.get(ident)
        if entry is not None and entry() is tensor:
            fresh = False
            entry.storages = self._read_storages(tensor, ident)
        else:
            fresh = True
            born = self.ledger.born
            try:
                entry = new_entry(tensor, self._tensor_died, born)
            except TypeError:
                return  # it takes no weak reference: nothing of it is indexed
            self.entries[ident] = entry
            self.ledger.tensor_seen(entry)
            untyped_storage, is_nested = storage_readers()
            try:
                storage = None if is_nested(tensor) else untyped_storage(tensor)
            except Exception:  # opaque, sparse, or a wrapper without a storage: the general way reads it
                storage = None
            if storage is None:
                entry.storages = self._read_storages(tensor, ident)
            else:  # (one indexed already, a view's, may have grown and gains a user: register() notes both)
                storage_ident = id(storage)
                ref = (
                    self._index_storage(storage, storage_ident, ident, born)
                    if storage_ident not in self.storages
                    else self.register(storage, ident)
                )
                entry.storages = ref if ref is not None else ()
        try:
            entry.version = version_reader()(tensor)
        except Exception:
            entry.version = -2  # no version counter to read
        try:
            leaf = tensor.is_leaf
            retains = tensor.retains_grad
            entry.capable = (leaf and tensor.requires_grad) or retains
            grad = tensor._grad if (leaf or retains) else None
            grad_fn = tensor.grad_fn
        except Exception:
            return
        self.kinds.sort(ident, entry, fresh, leaf, self.ledger.begun)
        if grad is not None or grad_fn is not None or entry.grad is not NO_GRAD:
            self._read_links(ident, entry, grad, grad_fn, visited, keep)

    def _read_links(
        self, ident: int, entry: Entry, grad: Any, grad_fn: Any, visited: set[int], keep: list[Any]
    ) -> None:
        """Read a tensor's gradient (None where it has none) and the tensors its autograd graph
        (under ``grad_fn``) saved."""
        if grad is not None and is_tensor_type(type(grad)):
            self._read_gradient(ident, entry, grad, visited, keep)
        elif entry.grad is not NO_GRAD:
            if ident in self.kinds.capable:
                self.kinds.lists_changed(gradients=True)
            entry.grad = NO_GRAD
        if grad_fn is not None:
            for saved in _graph_tensors(grad_fn, visited, keep):
                for storage in tensor_storages(saved):
                    self.register(storage, None)

    def _read_storages(self, tensor: Any, ident: int) -> StorageRef | tuple[StorageRef, ...]:
        """Index the storages a tensor uses, with the tensor as their user; return their references
        (the one reference itself where there is one: see :attr:`Entry.storages`)."""
        untyped_storage, is_nested = storage_readers()
        try:  # the common case, one strided storage, without the general function's calls
            storages: Any = (untyped_storage(tensor),) if not is_nested(tensor) else tensor_storages(tensor)
        except Exception:
            storages = tensor_storages(tensor)
        refs: list[StorageRef] = []
        for storage in storages:
            ref = self.register(storage, ident)
            if ref is not None:
                refs.append(ref)
        return refs[0] if len(refs) == 1 else tuple(refs)

    def _read_gradient(self, ident: int, entry: Entry, grad: Any, visited: set[int], keep: list[Any]) -> None:
        """Note a tensor's gradient and read it whole; the tensor becomes a user of the gradient's storages."""
        if entry.grad() is not grad:
            entry.grad = weakref.ref(grad)
            if ident in self.kinds.capable:
                self.kinds.lists_changed(gradients=True)
        if id(grad) not in visited:
            visited.add(id(grad))
            keep.append(grad)
            self.read_tensor(grad, visited, keep)
        grad_entry = self.entries.get(id(grad))
        for ref in storages_of(grad_entry) if grad_entry is not None else ():
            if ident not in ref.users:
                ref.users += (ident,)  # its gradient's death is this tensor's change too

    def register(self, storage: Any, user: int | None) -> StorageRef | None:
        """Index a storage (``user``: the id of the tensor that uses it), or note its new size."""
        ident = id(storage)
        ref = self.storages.get(ident)
        same = ref is not None and ref() is storage
        if ref is not None and same:
            try:
                nbytes = storage.nbytes()
            except Exception:
                return ref
            if nbytes != ref.nbytes:  # resized in place
                delta = nbytes - ref.nbytes
                ref.nbytes = nbytes
                self.totals[ref.device] += delta
                facts = storage_facts(storage)
                ref.pointer = facts[1] if facts is not None else 0
                self.ledger.resized(ref, delta)
            if user is not None and user not in ref.users:
                ref.users += (user,)
            return ref
        return self._index_storage(storage, ident, user, self.ledger.born)

    def _index_storage(self, storage: Any, ident: int, user: int | None, born: int) -> StorageRef | None:
        """Index a storage not indexed yet (``ident``: its id), first seen at clock ``born``; None
        where it holds no memory (see :func:`~pytest_vramleak.tracking.census.storage_facts`)."""
        facts = storage_facts(storage, empty=True)  # an empty storage can still grow in place
        if facts is None:
            return None
        device, pointer, nbytes = facts
        ref = StorageRef(storage, self._storage_died)
        ref.ident, ref.nbytes, ref.device, ref.pointer, ref.born = ident, nbytes, device, pointer, born
        ref.adopted = False
        ref.users = (user,) if user is not None else ()
        self.storages[ident] = ref
        if user == ident:  # an opaque tensor, standing for its own storage
            self.opaque.add(ident)
        self.totals[device] += nbytes
        self.ledger.seen(ref)
        return ref

    def forget(self, ident: int, entry: Entry) -> None:
        """Forget a tensor that died."""
        if self.entries.get(ident) is entry:
            del self.entries[ident]
        self.kinds.forget(ident, entry)

    def forget_dead(self, entries: dict[int, Entry]) -> None:
        """Forget the entries of ``entries`` whose tensor died."""
        for ident, entry in list(entries.items()):
            if entry() is None:
                self.forget(ident, entry)

    def clear(self) -> None:
        """Forget every tensor (storages stay: their callbacks keep the totals true)."""
        self.entries.clear()
        self.kinds.clear()

    def close(self) -> None:
        """Forget every tensor and storage: the session is over, and no total is read again."""
        self.clear()
        self.storages.clear()
        self.opaque.clear()

    def process_dead(self, *, offsets: bool = True, deaths: list[tuple[int, int, str]] | None = None) -> None:
        """Note the deaths the callbacks reported: forget dead tensors, take dead storages off the
        totals and tell the ledger, and read again the tensors that used them."""
        while self._dead_tensors:
            ident = self._dead_tensors.pop().ident
            entry = self.entries.get(ident)
            if entry is not None and entry() is None:
                self.forget(ident, entry)
        while self._dead:
            dead = self._dead[:]
            del self._dead[: len(dead)]  # the callback appends to this very list, from any thread
            reread: list[Any] = []
            for ref in dead:
                if self.storages.get(ref.ident) is ref:
                    del self.storages[ref.ident]
                    self.opaque.discard(ref.ident)
                self.totals[ref.device] -= ref.nbytes
                if deaths is not None:
                    deaths.append((ref.born, ref.nbytes, ref.device))
                self.ledger.died(ref, offsets=offsets)
                for ident in ref.users:  # their storage changed under them
                    entry = self.entries.get(ident)
                    tensor = entry() if entry is not None else None
                    if tensor is not None:
                        reread.append(tensor)
            if reread:
                self.reread(reread)
                reread.clear()
        self.ledger.trim()

    # -- what the index tells -----------------------------------------------------------------

    def users(self, refs: list[StorageRef]) -> list[Any]:
        """The live indexed tensors that used these storages when last read (strong references)."""
        found = []
        seen: set[int] = set()
        entries = self.entries
        for ref in refs:
            for ident in ref.users:
                if ident in seen:
                    continue
                entry = entries.get(ident)
                tensor = entry() if entry is not None else None
                if tensor is not None:
                    seen.add(ident)
                    found.append(tensor)
        return found

    def users_of_each(self, refs: list[StorageRef], tensors: list[Any]) -> list[StorageRef] | None:
        """Append to ``tensors`` the live indexed tensors that used each of ``refs`` (as
        :meth:`users` of that one alone), and return each one's storage; None where a storage has
        no such tensor."""
        owners: list[StorageRef] = []
        entries = self.entries
        for ref in refs:
            if len(ref.users) == 1:  # the common case, without a list and a set per storage
                entry = entries.get(ref.users[0])
                tensor = entry() if entry is not None else None
                if tensor is None:
                    return None
                tensors.append(tensor)
                owners.append(ref)
                continue
            found = self.users([ref])
            if not found:
                return None
            tensors += found
            owners += [ref] * len(found)
        return owners

    def sole_users(self, refs: list[StorageRef]) -> list[Any]:
        """For each storage, the live indexed tensor that alone used it, and used no other storage,
        when last read; None where there is no such tensor (strong references)."""
        found: list[Any] = []
        entries = self.entries
        for ref in refs:
            users = ref.users
            entry = entries.get(users[0]) if len(users) == 1 else None
            found.append(entry() if entry is not None and sole_storage(entry) is not None else None)
        return found

    def pairs(self, refs: list[StorageRef]) -> list[tuple[Any, Any]]:
        """``(tensor, storage)`` for each live indexed tensor that used one of these storages when last read."""
        found = []
        entries = self.entries
        with collections_paused():  # a pair per storage: no collection of the heap every few hundred
            for ref in refs:
                storage = ref()
                if storage is None:
                    continue
                if len(ref.users) == 1:  # the common case, without a list and a set per storage
                    entry = entries.get(ref.users[0])
                    tensor = entry() if entry is not None else None
                    if tensor is not None:
                        found.append((tensor, storage))
                else:
                    found += [(tensor, storage) for tensor in self.users([ref])]
        return found

    def pairs_since(self, refs: list[StorageRef], clock: int) -> list[tuple[Any, Any]]:
        """As :meth:`pairs`, followed by ``(storage, storage)`` for each live storage object, for
        the tensors and storage objects first read at ``clock`` or later. Reads only the index's
        own numbers (no ``id()`` per tensor): made while tracemalloc traces, each new number
        would be traced."""
        with collections_paused():
            return self._pairs_since(refs, clock)

    def _pairs_since(self, refs: list[StorageRef], clock: int) -> list[tuple[Any, Any]]:
        later: list[tuple[Any, Any]] = []
        entries = self.entries
        for ref in refs:
            storage = ref()
            if storage is None:
                continue
            for ident in ref.users if len(ref.users) == 1 else [id(tensor) for tensor in self.users([ref])]:
                entry = entries.get(ident)
                tensor = entry() if entry is not None else None
                if tensor is not None and entry.born >= clock:  # type: ignore[union-attr]
                    later.append((tensor, storage))
        later += [(storage, storage) for ref in refs if ref.born >= clock and (storage := ref()) is not None]
        return later

    def first_gradients(self, refs: list[StorageRef], clock: int) -> bool:
        """Whether each of ``refs`` is the storage of a gradient read at ``clock`` or later, without
        autograd history, of a leaf read before ``clock``, and used by no other tensor: backward
        accumulates into such a gradient in place, whatever runs next."""
        entries, grad_fn = self.entries, grad_fn_reader()
        with _torch()._C.DisableTorchFunction():
            for ref in refs:
                owned = False
                for ident in ref.users:
                    entry = entries.get(ident)
                    tensor = entry() if entry is not None else None
                    if entry is None or tensor is None:
                        return False
                    grad = entry.grad()
                    grad_entry = entries.get(id(grad)) if grad is not None else None
                    if grad_entry is not None and entry.born < clock and sole_storage(grad_entry) is ref:
                        if grad_fn(grad) is not None or grad_entry.born < clock:
                            return False
                        owned = True
                    elif not any(other.grad() is tensor for other in map(entries.get, ref.users) if other):
                        return False  # neither a gradient nor a leaf of the storage's
                if not owned:
                    return False
        return bool(refs)

    def entries_born_since(self, clock: int) -> list[Entry]:
        """Live indexed tensors first read at ``clock`` or later (a walk of the index: for a leak)."""
        return [entry for entry in self.entries.values() if entry.born >= clock and entry() is not None]

    def alive_since(self, device: str, clock: int, before: int | None = None) -> list[StorageRef]:
        """Live storages on ``device`` first seen at ``clock`` or later (and before ``before``), less
        those fixtures of a wider scope made (a walk of the index: for a leak)."""
        return [
            ref
            for ref in self.storages.values()
            if ref.born >= clock
            and (before is None or ref.born < before)
            and ref.device == device
            and not ref.adopted
            and ref() is not None
        ]

"""Cheap per-test accounting of tensor storages: an index of known tensors and gc.freeze().

The full census (:mod:`pytest_vramleak.census`) walks every object in the heap: with torch and
pytest loaded that is ~10^5 objects and tens of milliseconds, too slow to run twice per test.
The tracker gets the same answer from far less work:

- an index of weak references to every tensor known to be alive, built by one full heap walk the
  first time it is needed and kept up to date after that;
- ``gc.freeze()`` when a test's setup starts, so that afterwards ``gc.get_objects()`` and
  ``gc.collect()`` only see objects created since: a scan costs what the test allocated, not what
  the process holds;
- at each measurement, the storages (and gradients, and tensors saved by autograd graphs) of the
  indexed tensors plus those of any tensor created since the freeze, which then joins the index.

Why this cannot miss a leak that the full census would see. A storage the full census counts is
reached from a Python tensor object T (directly, as T's gradient, or through T's autograd graph).
Either T existed when the test's setup started, and then it is in the index (the index holds
every tensor alive at the previous tracked moment, and a tensor created between two tracked
moments is created while the heap is frozen, so it is not frozen itself and the scan finds it);
or T was created later, and then T is not frozen and the young scan finds it. Either way T's
storage is read at the measurement. Storages are compared by identity (a weak reference to the
storage object, which torch keeps while the storage lives), so a new storage at an address freed
by an older one is still new, and a storage that grew in place (``resize_``) counts its growth.
Between tests nothing is frozen: the index is rebuilt with a full walk whenever tracking stops
for a while (untracked tests ran in between), and when anyone else froze the heap.

Ages. :meth:`Tracker.begin` also notes which storages are alive as the test's setup starts (the
previous checked test's last view, when nothing untracked ran since; else a view then), so a view
marks each storage ``young`` (made since) or not. A leak on CPU is growth: new storages less
older ones the test freed (a replaced gradient, an evicted cache entry). Young storages that die
(what a function-scoped fixture made in setup and frees at teardown) never offset anything, and
neither can garbage older than the test, which stays frozen, and so alive, while it runs. Where
the tracker did not freeze the heap itself, every storage counts as young: no offsets at all.

Before freezing, the young generations are collected (well under a millisecond): garbage that
earlier tests left in reference cycles goes then instead of staying in memory through the test.
Objects frozen during a test are not collected until it ends; older cyclic garbage is collected
after it, by Python's own schedule.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .census import FREEZERS, StorageKey, _graph_tensors, _torch, live_tensors


class Record(NamedTuple):
    """One storage: a weak reference to its object, its size, and its key (device, address).

    A named tuple: a view makes one per live storage, and a tuple is several times cheaper to
    build than a frozen dataclass.
    """

    ref: weakref.ref[Any]
    nbytes: int
    key: StorageKey
    young: bool = False
    """Not alive when :meth:`Tracker.begin` froze the heap: made during the test's setup, body or teardown."""


@dataclass
class View:
    """The storages alive on a device at one moment, by ``id`` of the storage object."""

    device: str
    storages: dict[int, Record] = field(default_factory=dict)


class Tracker:
    """Tracks tensor storages on one device across a test; see the module docstring."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.stale = True
        """Set when code ran untracked since :meth:`end`: the next :meth:`begin` rebuilds the index."""
        self._index: dict[int, weakref.ref[Any]] = {}
        self._at_begin: dict[int, Record] = {}
        """The storages alive on the device when :meth:`begin` froze the heap: those older than the test."""
        self._last_view: View | None = None
        """The latest view of the tracker's device; weak references only."""
        self._froze = False
        self._begun = False

    def begin(self) -> None:
        """Freeze the heap (as a test's setup starts), after rebuilding the index if it is stale.

        Where the heap is frozen already (the test suite froze it itself), nothing is frozen and
        each view walks the whole heap: slower, never wrong.
        """
        # get_freeze_count() walks the frozen objects: cheap here, where normally none are.
        frozen_by_others = gc.get_freeze_count() > 0
        if not frozen_by_others:
            # Young garbage (what earlier tests dropped in reference cycles) goes now, cheaply,
            # rather than staying frozen, and in memory, for the whole test.
            gc.collect(1)
        rebuilt = self.stale or frozen_by_others
        if rebuilt:
            self._rebuild()
        self._begun = True
        if not frozen_by_others:
            gc.freeze()
            self._froze = True
            FREEZERS.add(self)
            # What the storages were as the test began: the last view, taken as the previous
            # checked test ended, when only tracked code ran since (a storage made after it counts
            # as young, which only ever keeps it from offsetting); else a view now.
            last = None if rebuilt else self._last_view
            self._at_begin = (last if last is not None else self._read(self.device)).storages

    def end(self) -> None:
        """Unfreeze the heap; what the test left is indexed and stays tracked."""
        self._begun = False
        self._at_begin = {}
        FREEZERS.discard(self)
        if self._froze:
            self._froze = False
            self.stale = False
            gc.unfreeze()
        else:
            self.stale = True

    @property
    def knows_age(self) -> bool:
        """Whether views tell storages made since :meth:`begin` (``Record.young``) from older ones.

        Only while the heap is frozen by this tracker: otherwise every view rebuilds the index.
        """
        return self._begun and self._froze

    @property
    def active(self) -> bool:
        """Whether a test's tracking is under way (between :meth:`begin` and :meth:`end`)."""
        return self._begun

    def index_young(self) -> None:
        """Index the tensors created since the freeze (before someone unfreezes the heap)."""
        if self._froze:
            self._add_live()

    @contextmanager
    def unfrozen(self) -> Iterator[None]:
        """Unfreeze the heap for a while (a holder search needs all of it), then freeze it again.

        The young tensors join the index first, so the next view still finds every tensor.
        """
        if not self._froze:
            yield
            return
        self._add_live()
        gc.unfreeze()
        try:
            yield
        finally:
            gc.freeze()

    def _rebuild(self) -> None:
        self._index.clear()
        self._add_live()
        self.stale = False

    def _add_live(self) -> None:
        """Index the tensors in the unfrozen generations: all of them, or those created since the freeze."""
        index = self._index
        for tensor in live_tensors():
            ref = index.get(id(tensor))
            if ref is None or ref() is not tensor:
                index[id(tensor)] = weakref.ref(tensor)

    def view(self, *, collect: bool = True, device: str | None = None) -> View:
        """Read every tracked storage on the device, after collecting garbage unless told not to.

        The index holds tensors of every device: ``device`` reads another one than the tracker's
        (the other GPUs of a process) at the same cost.
        """
        if collect:
            gc.collect()  # while frozen, the young generations only: frozen objects are not examined
        if self._froze:
            self._add_live()
        else:  # the heap was frozen by someone else: walk all of it
            self._rebuild()
        return self._read(device or self.device)

    def _read(self, device_name: str) -> View:
        torch = _torch()
        view = View(device_name)
        storages = view.storages
        want_type, _, want_index = device_name.partition(":")
        index_number = int(want_index) if want_index else None
        untyped_storage = torch._C.TensorBase.untyped_storage
        graph_roots: list[Any] = []
        dead: list[int] = []

        at_begin = self._at_begin if self._froze else {}
        names: dict[Any, str] = {}  # str(torch.device) costs more than the rest of a record

        def record(tensor: Any) -> None:
            try:
                storage = untyped_storage(tensor)
                device = storage.device
                if device.type != want_type or (index_number is not None and device.index != index_number):
                    return
                nbytes = storage.nbytes()
                pointer = storage.data_ptr()
            except Exception:  # sparse, meta and wrapper tensors have no storage to read
                return
            if pointer and nbytes and id(storage) not in storages:
                before = at_begin.get(id(storage))  # young unless this very storage was alive at begin
                young = before is None or before.ref() is not storage
                name = names.get(device)
                if name is None:
                    name = names[device] = str(device)
                storages[id(storage)] = Record(weakref.ref(storage), nbytes, (name, pointer), young)

        with torch._C.DisableTorchFunctionSubclass():
            for ident, ref in self._index.items():
                tensor = ref()
                if tensor is None:
                    dead.append(ident)
                    continue
                record(tensor)
                try:
                    grad = tensor._grad if (tensor.is_leaf or tensor.retains_grad) else None
                    grad_fn = tensor.grad_fn
                except Exception:
                    continue
                if grad is not None:
                    record(grad)
                if grad_fn is not None:
                    graph_roots.append(grad_fn)
            visited: set[int] = set()
            keep: list[Any] = []
            for grad_fn in graph_roots:
                for saved in _graph_tensors(grad_fn, visited, keep):
                    record(saved)
            keep.clear()
            graph_roots.clear()
        for ident in dead:
            del self._index[ident]
        if device_name == self.device:
            self._last_view = view
        return view

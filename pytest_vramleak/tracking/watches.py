"""Changes to older tensors that no young object shows: gradients, growth in place, new graphs.

A tensor older than the test is in the :class:`~pytest_vramleak.tracking.index.Index` with what it held when
last read. Besides the deaths of its storages (which the index hears of), what it holds can change
in only these ways, each watched for here:

- **backward writes a gradient into it.** A backward pass writes ``.grad`` only into the leaves its
  graph reaches and the tensors it is given as ``inputs``: every backward pass run through
  ``torch.autograd`` while a check runs is watched, on any thread and whenever its graph was built
  (:mod:`pytest_vramleak.tracking.backward`), and those tensors are read again where their gradient changed.
  Tensors that retain their gradient without being leaves are few: each backward pass compares
  them all. A backward pass that does not go through ``torch.autograd`` (the C++ engine called
  directly, TorchScript) still needs a graph, whose nodes take this thread's autograd sequence
  numbers: when that counter moved, the gradients of every indexed leaf that requires grad are
  compared with what was read, at C speed, in a process that holds up to
  :data:`COMPARED_PER_CHECK` of them; beyond that, between checks (:meth:`Watches.drift`).
- **it grows in place** (``resize_``, an ``out=`` argument that resizes, ``storage.resize_``): the
  sizes of all indexed storages are compared with what was read, in one pass at C speed (about
  0.07 microseconds a storage), the only reading as costly as the process's storages are many: at
  each check up to :data:`COMPARED_PER_CHECK` storages, beyond that between checks.
- **an in-place operation gives it an autograd graph** (``total += loss`` on a tensor that takes
  no gradient): its version counter moves. Where the thread built graphs, the version counters of
  the older tensors that take no gradient are compared, at C speed, and those changed are read
  again in full (their graph keeps what it saved and every node before it).

:meth:`Watches.drift` runs between tests as often as keeps its cost to :data:`DRIFT_SHARE` of the
run, and once as the session ends: what it finds is reported, charged to no test. What stays
unseen: a tensor older than the test given a new storage while its old one lives on (``set_`` on
one of two views of a buffer), and a gradient that an unwatched backward pass on another thread
writes into an older leaf, in a process that holds no more than :data:`COMPARED_PER_CHECK` leaves
(beyond that, :meth:`Watches.drift` finds it).
"""

from __future__ import annotations

import functools
import itertools
import operator
import time
import weakref
from typing import Any

from .backward import BackwardWatch
from .census import _torch
from .exit_callbacks import ExitCallbacks
from .index import Index, grad_fn_reader, storage_readers, version_reader
from .refs import Entry, StorageRef, call, sole_storage
from .saved_hooks import SavedTensorHooks

COMPARED_PER_CHECK = 2_000
"""Up to this many indexed storages (or leaves that can take a gradient), each check compares all
their sizes (or gradients) with what was read: about a tenth of a millisecond. With more, the
check relies on what it watched (the leaves each backward pass reached), and the exhaustive
comparison waits for :meth:`Watches.drift`, which the pytest layer calls between tests, as often
as keeps its cost under :data:`DRIFT_SHARE` of the run."""

DRIFT_SHARE = 0.05
"""The share of the run's time the comparisons between checks may take (see :meth:`Watches.drift_due`)."""

_KNOWN_SIZE = operator.attrgetter("nbytes")
_GRAD = operator.attrgetter("_grad")


class _Unreadable:
    pass


@functools.lru_cache(maxsize=1)
def _nbytes() -> Any:
    return _torch().UntypedStorage.nbytes


class Watches:
    """Finds the changes to older tensors; see the module docstring."""

    def __init__(self, index: Index, *, defer: bool) -> None:
        self.index = index
        self.defer = defer
        """Whether a check may leave the comparison of many older tensors to :meth:`drift`."""
        self.deferred = False
        """Set when a check left an exhaustive comparison (sizes, gradients) to :meth:`drift`."""
        self.grad_reads = 0
        """How many times the gradients of every indexed leaf were compared."""
        self.backward = BackwardWatch(self._backward_noted)
        self.exit_callbacks = ExitCallbacks()
        """Notes the callbacks registered with ``atexit``, which gc does not see, for naming holders."""
        self.saved_tensor_hooks = SavedTensorHooks()
        """Notes the pack hooks of ``saved_tensors_hooks``, for naming what they store."""
        self._touched: dict[int, Entry] = {}
        """Indexed tensors a backward pass may have given a gradient since the last observation."""
        self._touched_new: list[weakref.ref[Any]] = []
        """The same, not indexed when noted."""
        self._backward_ran = False
        self._last_drift = (0.0, 0.0)
        """When the last :meth:`drift` ended, and what it cost (seconds)."""

    def start(self) -> None:
        self.backward.start()
        self.exit_callbacks.start()
        self.saved_tensor_hooks.start()

    def stop(self) -> None:
        self.backward.stop()
        self.exit_callbacks.stop()
        self.saved_tensor_hooks.stop()
        self._touched.clear()
        self._touched_new.clear()
        self._backward_ran = False

    def _backward_noted(self, tensors: list[Any]) -> None:
        """A backward pass is about to run (on any thread) and may write the gradients of these."""
        self._backward_ran = True
        entries = self.index.entries
        for tensor in tensors:
            entry = entries.get(id(tensor))
            if entry is not None and entry() is tensor:
                self._touched[id(tensor)] = entry
            else:
                self._touched_new.append(weakref.ref(tensor))

    def look(self, built_graphs: bool) -> None:
        """Look for changes to older tensors since the last observation, at the cost of what the
        test did where the process holds many (``built_graphs``: this thread made autograd nodes)."""
        backward_ran = self._backward_ran
        self._backward_ran = False
        if self._touched or self._touched_new:
            self._read_touched()
        if backward_ran and self.index.kinds.retainers:
            self._read_changed_gradients(self.index.kinds.retainers)
        every = not self.defer
        if built_graphs:
            if (
                every
                or len(self.index.kinds.capable) <= COMPARED_PER_CHECK
                or self.backward.failed
                or not self.backward.watching
            ):
                self.compare_gradients()  # small enough, or a backward pass may have gone unwatched
            else:
                self.deferred = True  # a backward that did not go through torch.autograd: see drift()
            if every or len(self.index.kinds.plain) <= COMPARED_PER_CHECK:
                self.compare_versions()
            else:
                self.deferred = True
        if every or len(self.index.storages) <= COMPARED_PER_CHECK:
            self.compare_sizes()
        else:
            self.deferred = True

    def drift_due(self) -> bool:
        """Whether :meth:`drift` should run now: a check deferred a comparison, and the time since
        the last one is long enough that comparing now keeps their cost under :data:`DRIFT_SHARE`."""
        ended, cost = self._last_drift
        return self.deferred and time.perf_counter() - ended >= cost / DRIFT_SHARE

    def drift(self) -> list[tuple[StorageRef, int]]:
        """Compare every storage's size and every leaf's gradient now, between checks: the older
        storages that grew in place since they were last compared, with their growth, and the
        gradients given to older tensors by a backward pass no check watched, with their bytes."""
        started = time.perf_counter()
        self.deferred = False
        ledger = self.index.ledger
        ledger.drift, ledger.drift_new = [], []
        try:
            self.index.process_dead()
            self.compare_gradients()
            self.compare_versions()
            self.compare_sizes()
            found = [(ref, delta) for ref, delta in ledger.drift if ref() is not None and delta > 0]
            found += [(ref, ref.nbytes) for ref in ledger.drift_new if ref() is not None and ref.nbytes > 0]
        finally:
            ledger.drift, ledger.drift_new = None, []
            ended = time.perf_counter()
            self._last_drift = (ended, ended - started)
        return found

    def catch_up(self) -> None:
        """Code ran untracked: compare every older tensor now, as :meth:`drift` does, and charge
        what changed to no test; also read again the tensors given a new storage while the one
        they were read with lives on (``.data =``, ``set_``), which no comparison at C speed shows."""
        self.drift()
        untyped_storage, _ = storage_readers()
        moved = []
        with _torch()._C.DisableTorchFunction():
            for entry in list(self.index.entries.values()):
                tensor = entry()
                storage = sole_storage(entry)
                if tensor is None or storage is None:
                    continue  # dead (drift() forgot it), or nested or opaque: read again as a storage dies
                try:
                    if untyped_storage(tensor) is not storage():
                        moved.append(tensor)
                except Exception:
                    continue
        self.index.reread(moved)
        moved.clear()

    def _live(self, lists: Any, kept: dict[int, Entry]) -> tuple[list[Any], list[int]]:
        """The tensors of a comparison list and what was read of them; where some died since,
        forget those (their entries leave the list, which is then made again)."""
        refs, known = lists()
        tensors = list(map(call, refs))
        if any(map(operator.is_, tensors, itertools.repeat(None))):
            self.index.forget_dead(kept)
            refs, known = lists()
            tensors = list(map(call, refs))
        return tensors, known

    def compare_versions(self) -> None:
        """Compare the version counter of every older tensor that takes no gradient with what was
        read, at C speed; read again, in full, those that changed in place and have a graph now."""
        index = self.index
        tensors, known = self._live(index.kinds.version_lists, index.kinds.plain)
        try:
            versions = list(map(version_reader(), tensors))
        except Exception:  # a tensor that will not say: read each in full
            versions = [-2] * len(tensors)
        if versions != known:
            grad_fn = grad_fn_reader()
            with _torch()._C.DisableTorchFunction():
                for tensor, now, before in zip(tensors, versions, known, strict=False):
                    if now == before:
                        continue
                    entry = index.entries.get(id(tensor))
                    if grad_fn(tensor) is None and entry is not None:
                        entry.version = now  # changed in place without autograd: nothing new to read
                        continue
                    index.read_tensor(tensor, set(), [])
                    if index.ledger.begun and entry is not None:
                        index.ledger.inplace[id(tensor)] = entry
            index.kinds.lists_changed(versions=True)
        tensors.clear()

    def compare_sizes(self) -> None:
        """Compare the size of every indexed storage with what was read, at C speed."""
        refs = list(self.index.storages.values())
        if self.index.opaque:  # an opaque tensor's size is fixed, and it has no storage to read
            refs = [ref for ref in refs if ref.ident not in self.index.opaque]
        try:
            storages = list(map(call, refs))
            sizes = list(map(_nbytes(), storages))
        except TypeError:  # a storage died meanwhile (on another thread): go one by one
            storages = [ref() for ref in refs]
            sizes = [
                ref.nbytes if storage is None else storage.nbytes()
                for ref, storage in zip(refs, storages, strict=False)
            ]
        if sizes != list(map(_KNOWN_SIZE, refs)):
            with _torch()._C.DisableTorchFunction():
                for ref, storage, size in zip(refs, storages, sizes, strict=False):
                    if storage is not None and size != ref.nbytes:
                        self.index.register(storage, None)
        storages.clear()

    def compare_gradients(self) -> None:
        """Compare the gradient of every indexed leaf that requires grad with what was read, at C
        speed; read again, in full, the tensors whose gradient changed. (A gradient that grew in
        place is a storage whose size changed. One that was replaced died, and a tensor is among
        the users of its gradient's storages, so a gradient object's id that an earlier one had
        cannot hide a change.) The leaves indexed before the test began are compared from lists
        kept between calls; those indexed since, few and short-lived, one by one."""
        self.grad_reads += 1
        index = self.index
        with _torch()._C.DisableTorchFunction():
            self._read_changed_gradients(index.kinds.capable_new)
            tensors, known = self._live(index.kinds.gradient_lists, index.kinds.capable)
            try:
                grads = list(map(_GRAD, tensors))
            except Exception:  # a tensor that will not say: read each in full
                grads = [_Unreadable] * len(tensors)
            ids = list(map(id, grads))
            grads.clear()
            if ids != known:
                for tensor, now, before in zip(tensors, ids, known, strict=False):
                    if now != before:
                        index.read_tensor(tensor, set(), [])
                index.kinds.lists_changed(gradients=True)
        tensors.clear()

    def _read_touched(self) -> None:
        """Read again the tensors a backward pass may have given a gradient, where it changed."""
        touched, self._touched = self._touched, {}
        new, self._touched_new = self._touched_new, []
        tensors = [tensor for tensor in map(call, list(new)) if tensor is not None]
        self.index.reread(tensors)
        tensors.clear()
        self._read_changed_gradients(touched)  # it copies the dict first: a backward on another thread may still add

    def _read_changed_gradients(self, entries: dict[int, Entry]) -> None:
        """Read again, in full, those of these tensors whose gradient is not the one last read
        (one by one: for the few); forget those that died."""
        changed = []
        with _torch()._C.DisableTorchFunction():
            for ident, entry in list(entries.items()):
                tensor = entry()
                if tensor is None:
                    self.index.forget(ident, entry)
                elif _GRAD(tensor) is not entry.grad():
                    changed.append(tensor)
        self.index.reread(changed)
        changed.clear()

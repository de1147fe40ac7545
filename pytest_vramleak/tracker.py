"""Per-test accounting of tensor storages at the cost of what the test did, not of what the process holds.

A census (:mod:`pytest_vramleak.census`) walks every object of the heap; with torch loaded that is
10^5 objects or more, and reading every live tensor costs about two microseconds each. A check
around every test cannot afford either. The tracker keeps, across tests:

- an index of every known tensor (a weak reference, and the storages, gradient and graph it had
  when last read) and of every known storage (a weak reference whose callback reports the
  storage's death, its size, device and address, and the moment it was first seen: ``born``);
- a running total of the bytes of known live storages per device.

Around a test, ``gc.freeze()`` (taken when its setup starts) makes scans and collections see only
the objects made since, so each observation costs what the test made: the young Python tensors
and storage objects are read, what died is known from the callbacks, and the totals follow.

**What the ledger says.** On CPU a test leaked the bytes of storages first seen since its setup
began that are still alive, plus the growth in place of older storages, less the bytes of older
storages that died during the test (a replaced gradient, an evicted cache entry): what the CPU
allocator's own counter would show if it had one, as on accelerators. Storages made since the
setup began never offset (what a fixture makes and frees at teardown hides nothing), and garbage
older than the test is frozen, so it cannot be collected during the test and offset a leak.

**Why it sees what a census would see.** A storage a census counts is reached from a Python
tensor or storage object T, directly, as T's gradient, or through T's autograd graph.

1. T was made since the last freeze: T is not frozen, so the scan of each observation finds it
   and reads it whole (storages, gradient, graph). Objects made between two checked tests are in
   the young generations when the next test begins, and are indexed then.
2. T is older: it is in the index, with what it held when last read. What an older tensor holds
   can change only in these ways, each watched for:

   a. one of its storages dies (``set_``, ``.data =``, ``swap_tensors``, freeing its gradient):
      the storage's callback names the tensors that used it, which are read again;
   b. backward writes a new gradient into it. A backward pass writes ``.grad`` only into the
      leaves its graph reaches and the tensors it is given as ``inputs``; the check watches
      every backward pass run through ``torch.autograd`` while it runs, on any thread and
      whenever its graph was built (:mod:`pytest_vramleak.backward`), and reads those tensors
      again where their gradient changed. Tensors that retain their gradient without being
      leaves are few: each backward pass compares all of them. A backward pass that does not
      go through ``torch.autograd`` (the C++ engine called directly, TorchScript) still needs
      a graph, whose nodes take this thread's autograd sequence numbers: when the counter
      moved during the test, the gradients of every indexed leaf that requires grad are
      compared with what was read, at C speed, in a process that holds up to
      :data:`COMPARED_PER_CHECK` of them; beyond that, between checks (:meth:`Tracker.drift`);
   c. it grows in place (``resize_``, an ``out=`` argument that resizes, ``storage.resize_``):
      the sizes of all indexed storages are compared with what was read, in one pass at C
      speed (about 0.07 microseconds a storage), the only reading as costly as the process's
      storages are many. So it is done at each check only up to :data:`COMPARED_PER_CHECK`
      storages; in a process that holds more, between checks (:meth:`Tracker.drift`).

   :meth:`Tracker.drift` runs between tests as often as keeps its cost to :data:`DRIFT_SHARE`
   of the run, and once as the session ends: what it finds is reported, charged to no test.
   What stays unseen: a tensor older than the test given a new storage while its old one
   lives on (``set_`` on one of two views of a buffer), and a gradient that an unwatched
   backward pass on another thread writes into an older leaf, in a process that holds no more
   than :data:`COMPARED_PER_CHECK` leaves (beyond that, :meth:`Tracker.drift` finds it).

Where the heap is frozen by someone else (a conftest that froze it, or a test that freezes it),
nothing is frozen by the tracker: it notices (a young sentinel object made at each freeze goes
missing from its scans, or the freeze count is not zero when a test begins), indexes the whole
heap once, and from then on each scan walks every unfrozen object: correct, and slower. Where a
test unfreezes the heap, an old sentinel frozen with it shows up in the next scan: older garbage
may then be collected, so from there on what older storages free offsets nothing (it is reported
as older garbage freed).

Accelerators have allocator counters (see :mod:`pytest_vramleak.devices`); there the tracker is
asked only to name what leaked, and reads every indexed tensor on that device then.
"""

from __future__ import annotations

import functools
import gc
import itertools
import operator
import sys
import time
import weakref
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

from .backward import BackwardWatch
from .census import (
    FREEZERS,
    _graph_tensors,
    _torch,
    graph_nodes,
    collections_paused,
    is_tensor_type,
    storage_facts,
    tensor_storages,
    tensor_types,
    untyped_storage_types,
    whole_heap,
)


_KNOWN_SIZE = operator.attrgetter("nbytes")


@functools.lru_cache(maxsize=1)
def _nbytes() -> Any:
    return _torch().UntypedStorage.nbytes


def graph_clock(torch: Any) -> int | None:
    """This thread's autograd sequence counter, or None where torch does not say it.

    Every autograd node takes its thread's next number when it is made, so a counter that moved
    means the thread built graphs; where it cannot be read, every observation compares the
    gradients (2b of the module docstring)."""
    peek = getattr(torch._C._autograd, "_get_sequence_nr", None)
    try:
        return int(peek()) if peek is not None else None
    except Exception:
        return None


COMPARED_PER_CHECK = 2_000
"""Up to this many indexed storages (or leaves that can take a gradient), each check compares all
their sizes (or gradients) with what was read: about a tenth of a millisecond. With more, the
check relies on what it watched (the leaves each backward pass reached), and the exhaustive
comparison waits for :meth:`Tracker.drift`, which the pytest layer calls between tests, as often
as keeps its cost under :data:`DRIFT_SHARE` of the run."""

DRIFT_SHARE = 0.05
"""The share of the run's time the comparisons between checks may take (see :meth:`Tracker.drift_due`)."""

REFREEZE_AFTER_SECONDS = 0.002
"""An observation that spent longer than this collecting and scanning young objects (a step
that imported modules, a set-up that built much) freezes them, so later observations skip them."""


class _Sentinel:
    """Made right after each freeze: a scan that does not find it means someone else froze the heap."""


class _OldSentinel:
    """Frozen with the heap as a test begins: finding it means someone else unfroze the heap."""


class StorageRef(weakref.ref):  # type: ignore[type-arg]
    """A weak reference to a storage object, with what the tracker knows of the storage."""

    __slots__ = ("ident", "nbytes", "device", "pointer", "born", "users", "adopted")
    ident: int
    nbytes: int
    device: str
    pointer: int
    born: int
    """The tracker's clock when the storage was first seen."""
    users: list[int]
    """Ids of the indexed tensors that used the storage when last read."""
    adopted: bool
    """Made while a test set up, by a fixture of a wider scope: the fixture's, never the test's."""


class TensorRef(weakref.ref):  # type: ignore[type-arg]
    """A weak reference to an indexed tensor; its callback lets the index forget the tensor."""

    __slots__ = ("ident",)
    ident: int


class _Nothing:
    pass


_NO_GRAD: weakref.ref[Any] = weakref.ref(_Nothing())  # dead at once: calling it gives None
_ENTRY_REF = operator.attrgetter("ref")
_ENTRY_GRAD = operator.attrgetter("grad")
_ENTRY_VERSION = operator.attrgetter("version")
_GRAD = operator.attrgetter("_grad")


def _tracing_tensor_types() -> tuple[type, ...]:
    """The tensors torch.compile traces with (fake and functional tensors), where torch loaded
    them: they hold no memory, and the autograd nodes they keep are the compiler's caches'. (Read
    each time, not cached: a torch that loads them later than the first check has them then.)"""
    found = []
    for module_name, class_name in (("torch._subclasses.fake_tensor", "FakeTensor"), ("torch._subclasses.functional_tensor", "FunctionalTensor")):
        module = sys.modules.get(module_name)
        kind = getattr(module, class_name, None) if module is not None else None
        if isinstance(kind, type):
            found.append(kind)
    return tuple(found)


def _grad_fn_reader() -> Any:
    """``TensorBase``'s own ``grad_fn`` getter."""
    return _torch()._C.TensorBase.grad_fn.__get__


@functools.lru_cache(maxsize=1)
def _version_reader() -> Any:
    """``TensorBase``'s own ``_version`` getter: no subclass's code runs."""
    return _torch()._C.TensorBase._version.__get__


@functools.lru_cache(maxsize=1)
def _storage_readers() -> tuple[Any, Any]:
    """``TensorBase``'s own ``untyped_storage`` and ``is_nested`` getter: no subclass's code runs."""
    base = _torch()._C.TensorBase
    return base.untyped_storage, base.is_nested.__get__


class Entry:
    """What the tracker last read of one tensor."""

    __slots__ = ("ref", "storages", "grad", "capable", "version", "born")

    def __init__(self, ref: weakref.ref[Any], born: int = 0) -> None:
        self.ref = ref
        self.born = born
        """The tracker's clock when the tensor was first read."""
        self.version = -1
        """The tensor's version counter when last read: an in-place operation moves it (2d)."""
        self.storages: tuple[StorageRef, ...] = ()
        self.grad: weakref.ref[Any] = _NO_GRAD
        """The gradient last read; a reference that is always dead where there was none."""
        self.capable = False
        """A leaf that requires grad, or a tensor that retains its gradient: backward can give it one."""


class Mark(NamedTuple):
    """One observation: the tracker's clock, and autograd's counter for the next one to compare with."""

    clock: int
    graphs: int | None
    """This thread's autograd sequence counter right after the observation."""


NODE_BYTES = 700
"""Host memory an autograd node keeps once backward has freed what it saved, about: measured with
glibc's ``mallinfo2`` on a two-layer MLP step (4.9 KB for 7 nodes). Nodes are C++ objects that no
allocator statistic counts; this turns their number into a size a person can weigh."""

MAX_GRAPH_ROOTS = 3
"""Tensors kept as the holders of a kept autograd history (the ones that keep the most nodes)."""


class KeptGraph(NamedTuple):
    """Autograd nodes a test made that tensors alive after it keep: how many, and which tensors
    keep most of them (weak references, with their node counts)."""

    nodes: int
    roots: list[tuple[weakref.ref[Any], int]]

    @property
    def estimated_bytes(self) -> int:
        return self.nodes * NODE_BYTES


def count_nodes(node: Any, threshold: int, visited: set[int], keep: list[Any], before: int | None = None) -> int:
    """Nodes under ``node`` numbered ``threshold`` or later (made since then on this thread), each
    counted once overall; older nodes are neither counted nor followed (their inputs are older
    still). ``AccumulateGrad`` nodes belong to their leaves and are not counted. With ``before``,
    nodes numbered from it on are followed but not counted (a step check's current step)."""
    accumulate = _torch()._C._functions.AccumulateGrad
    end = 1 << 63 if before is None else before

    def number(current: Any) -> int:
        return -1 if type(current) is accumulate else _sequence_number(current)

    def made_since(current: Any) -> bool:
        return threshold <= number(current) < 1 << 63

    return sum(threshold <= number(current) < end for current in graph_nodes([node], visited, keep, follow=made_since))


def _sequence_number(node: Any) -> int:
    try:
        number: int = node._sequence_nr()
    except Exception:
        return -1
    return number


class Tracker:
    """Indexes tensors and storages of every device; see the module docstring."""

    def __init__(self, device: str | None = None, *, defer: bool = False) -> None:
        self.device = device
        """The device the tracker's owner measures (the tracker itself indexes every device)."""
        self.defer = defer
        """Whether observations may leave the comparison of many older tensors (more than
        :data:`COMPARED_PER_CHECK`) to :meth:`drift` between checks: the plugin's tracker, whose
        owner runs that between tests. A tracker made for one check in a script compares them at
        every observation: nothing else would."""
        self.stale = True
        """Set when code ran untracked since :meth:`end`: the next :meth:`begin` indexes the whole heap."""
        self.unindexed = False
        """Set when a check ended that never observed (its allocator counted): what it kept is not indexed."""
        self._observed = False
        self._entries: dict[int, Entry] = {}
        self._capable: dict[int, Entry] = {}
        self._capable_new: dict[int, Entry] = {}
        """Leaves that require grad indexed since the current test began: few, and they come and go."""
        self._grad_refs: list[TensorRef] | None = None
        """The references of the entries in ``_capable``, in one list, and the ids of their
        gradients when last read: what :meth:`_read_gradients` compares (rebuilt on a change)."""
        self._grad_known: list[int] = []
        self._retainers: dict[int, Entry] = {}
        """Tensors that are not leaves but retain their gradient: backward writes theirs without
        an ``AccumulateGrad`` node, so each backward pass compares them all (they are few)."""
        self._touched: dict[int, Entry] = {}
        """Indexed tensors a backward pass may have given a gradient since the last observation."""
        self._touched_new: list[weakref.ref[Any]] = []
        """The same, not indexed when noted."""
        self._backward_ran = False
        self._watch = BackwardWatch(self._backward_noted)
        self._storage_died = self._on_death  # bound once: indexing makes a reference per storage
        self._tensor_died = self._on_tensor_death
        self._storages: dict[int, StorageRef] = {}
        self._opaque: set[int] = set()
        """Idents of the entries of ``_storages`` that are opaque tensors standing for their own
        storage (``to_mkldnn()``: see :func:`~pytest_vramleak.census.storage_facts`)."""
        self._dead: list[StorageRef] = []
        self._dead_tensors: list[int] = []
        self._young_dead = 0
        self._older_garbage: Counter[str] = Counter()
        self._totals: Counter[str] = Counter()
        self.clock = 0
        self.begin_clock = 0
        self._young: list[StorageRef] = []
        self._young_tensors: list[Entry] = []
        self._young_tensors_alive = 0
        """Tensors first read since the current test began (what may keep its autograd history)."""
        self._plain: dict[int, Entry] = {}
        """Older tensors that can take no gradient (not leaves that require grad): an in-place
        operation can give them an autograd graph (2d of the module docstring)."""
        self._plain_refs: list[TensorRef] | None = None
        self._plain_versions: list[int] = []
        self._inplace: dict[int, Entry] = {}
        """Older tensors found changed in place during the current test."""
        self.begin_graphs: int | None = None
        """This thread's autograd sequence counter as the current test began: nodes numbered from
        it on were made by the test."""
        self._freed: list[tuple[int, StorageRef]] = []
        self._grown: list[tuple[int, StorageRef, int]] = []
        self._froze = False
        self._foreign = False
        """Someone else froze the heap: the tracker freezes nothing and scans every unfrozen object."""
        self._begun = False
        self._sentinel: _Sentinel | None = None
        self._old_sentinel: _OldSentinel | None = None
        self._offsets_open = True
        self._born_override: int | None = None
        self._drift: list[tuple[StorageRef, int]] | None = None
        self._drift_new: list[StorageRef] = []
        self.deferred = False
        """Set when a check left an exhaustive comparison (sizes, gradients) to :meth:`drift`."""
        self.settled: list[tuple[int, int, str]] = []
        """What the last :meth:`settle` freed: when each storage was first seen, its bytes and device."""
        self._last_drift = (0.0, 0.0)
        """When the last :meth:`drift` ended, and what it cost (seconds)."""
        self.full_reads = 0
        """How many times every indexed tensor was read again (for tests and benchmarks)."""
        self.grad_reads = 0
        """How many times the gradients of every indexed leaf were compared."""

    # -- the protocol around a test -------------------------------------------------------------

    def begin(self, *, index: bool = True) -> None:
        """A checked test's setup starts: index what is new, collect young garbage, freeze the heap.

        ``index=False`` where an allocator counts the memory: nothing is read unless a leak must
        be named (see :meth:`catch_up`).
        """
        frozen_by_others = not self._froze and gc.get_freeze_count() > 0  # walks the frozen list: empty unless someone froze
        if frozen_by_others and not self._foreign:
            self._foreign = True
            self.stale = True
        if index and (self.stale or self.unindexed):
            self._rebuild()
        elif self._foreign:
            gc.collect()  # older garbage goes before the test, so it cannot offset what the test leaks
            if index:
                self._scan()
        else:
            if index:
                self._index_between_tests()
            gc.collect(1)  # young garbage earlier tests left in cycles goes now, not after this test
        self._process_dead()  # storages that died before the test: not the test's doing
        if self._capable_new:  # leaves that outlived the test that made them join the kept lists
            self._capable.update(self._capable_new)
            self._capable_new.clear()
            self._grad_refs = None
        self._adopt_young_tensors()
        self.clock += 1
        self.begin_clock = self.clock
        self.begin_graphs = graph_clock(_torch()) if index else None
        self._young, self._freed, self._grown = [], [], []
        self._young_tensors_alive = 0
        self._inplace = {}
        self._young_dead = 0
        self._begun = True
        self._observed = False
        self._offsets_open = True
        self._watch.start()
        if not self._foreign:
            self._old_sentinel = _OldSentinel()  # frozen with the heap: found again only if someone unfreezes it
            gc.freeze()
            self._froze = True
            FREEZERS.add(self)
            self._sentinel = _Sentinel()

    def end(self) -> None:
        """The test is over: unfreeze the heap (older cycles are collected by Python's own schedule)."""
        self._process_dead()
        if self._begun and not self._observed and self._froze:
            # A test that ended before its check observed anything (skipped by a marker as its
            # set-up began, a set-up error): what it made and kept is young, so reading it now
            # costs what it did, where indexing the heap again before the next test costs the heap.
            self._scan()
        elif self._begun and not self._observed:
            self.unindexed = True  # what this test made and kept is not indexed
        self._begun = False
        self._watch.stop()
        self._touched.clear()
        self._touched_new.clear()
        self._backward_ran = False
        self._sentinel = self._old_sentinel = None
        FREEZERS.discard(self)
        if self._froze:
            self._froze = False
            gc.unfreeze()

    def _adopt_young_tensors(self) -> None:
        """The tensors the last test made that outlive it become older ones: those that take no
        gradient join the tensors whose version counters are compared (2d)."""
        young, self._young_tensors = self._young_tensors, []
        for entry in young:
            if not entry.capable and entry.ref() is not None and self._entries.get(entry.ref.ident) is entry:  # type: ignore[attr-defined]
                self._plain[entry.ref.ident] = entry  # type: ignore[attr-defined]
                self._plain_refs = None

    @property
    def active(self) -> bool:
        """Whether a test's tracking is under way (between :meth:`begin` and :meth:`end`)."""
        return self._begun

    # -- observing ------------------------------------------------------------------------------

    def observe(self, *, collect: bool = True, since: Mark | None = None, watch: bool = True, generations: int = 2) -> Mark:
        """Collect young garbage, note what died, read what is young, and return the moment.

        With ``since`` (an earlier observation of the same test) and ``watch``, also look at
        what is older for changes since then (2b and 2c of the module docstring). Leave
        ``watch`` off where an allocator counts the memory. ``generations=1`` collects the
        youngest two of the unfrozen generations only: where garbage left in the oldest is frozen
        next and cannot die before the measurements that follow (a step loop's baseline).
        """
        started = time.perf_counter()
        offsets_before = len(self._freed)
        if collect:
            gc.collect(generations)  # while frozen: what was made since the freeze only
        graphs = graph_clock(_torch()) if watch else None
        self.clock += 1
        self._observed = True
        self._process_dead()
        if self._scan(thaw=self._old_sentinel is not None):
            self._someone_thawed(offsets_before)
        scanned = time.perf_counter() - started
        if watch and since is not None:
            self._watch_older(graphs is None or since.graphs is None or graphs != since.graphs)
        # (only just after a collection: young garbage not yet collected would be frozen with the
        # rest, kept as if alive and out of the collections that follow: a cycle the body left)
        if self._froze and collect and scanned > REFREEZE_AFTER_SECONDS:
            self._refreeze()
        return Mark(self.clock, graphs)

    def _watch_older(self, built_graphs: bool) -> None:
        """Look for changes to older tensors since the last observation (2b and 2c of the module
        docstring), at the cost of what the test did where the process holds many."""
        backward_ran = self._backward_ran
        self._backward_ran = False
        if self._touched or self._touched_new:
            self._read_touched()
        if backward_ran and self._retainers:
            self._read_changed_gradients(self._retainers)
        every = not self.defer
        if built_graphs:
            if every or len(self._capable) <= COMPARED_PER_CHECK or self._watch.failed or not self._watch.watching:
                self._read_gradients()  # small enough, or a backward pass may have gone unwatched
            else:
                self.deferred = True  # a backward that did not go through torch.autograd: see drift()
            if every or len(self._plain) <= COMPARED_PER_CHECK:
                self._compare_versions()  # an in-place operation may have given an older tensor a graph (2d)
            else:
                self.deferred = True
        if every or len(self._storages) <= COMPARED_PER_CHECK:
            self._compare_sizes()
        else:
            self.deferred = True

    def drift_due(self) -> bool:
        """Whether :meth:`drift` should run now: a check deferred a comparison, and the time since
        the last one is long enough that comparing now keeps their cost under :data:`DRIFT_SHARE`."""
        ended, cost = self._last_drift
        return self.deferred and time.perf_counter() - ended >= cost / DRIFT_SHARE

    def drift(self) -> list[tuple[StorageRef, int]]:
        """Compare every storage's size and every leaf's gradient now, between checks, where checks
        deferred it (more than :data:`COMPARED_PER_CHECK` of them): the older storages that grew
        in place since they were last compared, with their growth, and the gradients given to
        older tensors by a backward pass no check watched, with their bytes, charged to no test."""
        started = time.perf_counter()
        self.deferred = False
        self._drift, self._drift_new = [], []
        try:
            self._process_dead()
            self._read_gradients()
            self._compare_versions()
            self._compare_sizes()
            found = [(ref, delta) for ref, delta in self._drift if ref() is not None and delta > 0]
            found += [(ref, ref.nbytes) for ref in self._drift_new if ref() is not None and ref.nbytes > 0]
        finally:
            self._drift, self._drift_new = None, []
            ended = time.perf_counter()
            self._last_drift = (ended, ended - started)
        return found

    def _compare_versions(self) -> None:
        """Compare the version counter of every older tensor that takes no gradient with what was
        read (2d), at C speed; read again, in full, those that changed in place. An in-place
        operation on a tensor that requires grad (``total += loss``) gives the tensor a new
        autograd graph, which keeps what it saved and every node before it."""
        if self._plain_refs is None:
            entries = list(self._plain.values())
            self._plain_refs = list(map(_ENTRY_REF, entries))
            self._plain_versions = list(map(_ENTRY_VERSION, entries))
        tensors = list(map(operator.call, self._plain_refs))
        if any(map(operator.is_, tensors, itertools.repeat(None))):  # some died since: forget them
            for ident, entry in list(self._plain.items()):
                if entry.ref() is None:
                    self._forget(ident, entry)
            entries = list(self._plain.values())
            self._plain_refs = list(map(_ENTRY_REF, entries))
            self._plain_versions = list(map(_ENTRY_VERSION, entries))
            tensors = list(map(operator.call, self._plain_refs))
        try:
            versions = list(map(_version_reader(), tensors))
        except Exception:  # a tensor that will not say: read each in full
            versions = [-2] * len(tensors)
        if versions != self._plain_versions:
            grad_fn = _grad_fn_reader()
            with _torch()._C.DisableTorchFunction():
                for tensor, now, before in zip(tensors, versions, self._plain_versions):
                    if now == before:
                        continue
                    known = self._entries.get(id(tensor))
                    if grad_fn(tensor) is None and known is not None:
                        known.version = now  # changed in place without autograd: nothing new to read
                        continue
                    self._read_tensor(tensor, set(), [])
                    if self._begun and known is not None:
                        self._inplace[id(tensor)] = known
            self._plain_refs = None
        tensors.clear()

    def _compare_sizes(self) -> None:
        """Compare the size of every indexed storage with what was read (2c), at C speed."""
        refs = list(self._storages.values())
        if self._opaque:  # an opaque tensor's size is fixed, and it has no storage to read
            refs = [ref for ref in refs if ref.ident not in self._opaque]
        try:
            storages = list(map(operator.call, refs))
            sizes = list(map(_nbytes(), storages))
        except TypeError:  # a storage died meanwhile (on another thread): go one by one
            storages = [ref() for ref in refs]
            sizes = [ref.nbytes if storage is None else storage.nbytes() for ref, storage in zip(refs, storages)]
        if sizes != list(map(_KNOWN_SIZE, refs)):
            with _torch()._C.DisableTorchFunction():
                for ref, storage, size in zip(refs, storages, sizes):
                    if storage is not None and size != ref.nbytes:
                        self._register(storage, None)
        storages.clear()

    def index_young(self) -> None:
        """Index what was made since the freeze (before someone unfreezes the heap for a while)."""
        if self._froze:
            self._process_dead()
            self._scan()

    def settle(self) -> Counter[str]:
        """Collect every generation, the frozen ones too (cycles that outlived an observation),
        and note what died. Costs a walk of the whole heap: for confirming a suspected leak.
        Older storages it frees offset nothing (see the module docstring: garbage older than the
        test cannot hide a leak). What died is in :attr:`settled`."""
        self.index_young()
        if self._froze:
            gc.unfreeze()
            try:
                gc.collect()
            finally:
                gc.freeze()
                self.refrozen()
        else:
            gc.collect()
        self.clock += 1
        # Older storages this collection frees were garbage before the test, or made garbage in
        # cycles it could not collect while frozen: either way not what the test freed.
        before: Counter[str] = Counter(self._older_garbage)
        self.settled = []
        self._process_dead(offsets=False, deaths=self.settled)
        freed: Counter[str] = self._older_garbage - before
        return freed

    def refrozen(self) -> None:
        """The heap was unfrozen for a while and frozen again (see :func:`census.whole_heap`)."""
        if self._froze:
            self._sentinel = _Sentinel()

    @contextmanager
    def unfrozen(self) -> Iterator[None]:
        """The whole heap visible for a while (a holder search needs all of it)."""
        with whole_heap():
            yield

    # -- what the ledger says -------------------------------------------------------------------

    def total(self, device: str) -> int:
        """Bytes of the known live storages on ``device``."""
        return self._totals[device]

    def created(self, device: str, *, since: int, before: int | None = None) -> list[StorageRef]:
        """Live storages on ``device`` first seen after clock ``since`` and, with ``before``,
        before that clock."""
        return [
            ref
            for ref in self._young
            if ref.born > since and (before is None or ref.born < before) and ref.device == device and not ref.adopted and ref() is not None
        ]

    def freed_older(self, device: str, *, since: int) -> int:
        """Bytes of storages older than the test (not made since its setup began) that died or
        shrank after clock ``since``: what offsets a leak."""
        freed = sum(ref.nbytes for clock, ref in self._freed if clock > since and ref.born < self.begin_clock and ref.device == device)
        return freed + sum(
            -delta for clock, ref, delta in self._grown if clock > since and delta < 0 and ref.born < self.begin_clock and ref.device == device
        )

    def grown_older(self, device: str, *, since: int) -> list[tuple[StorageRef, int]]:
        """Live storages that existed at clock ``since`` and grew in place after it, with the growth."""
        grown: dict[int, tuple[StorageRef, int]] = {}
        for clock, ref, delta in self._grown:
            if clock > since and ref.born <= since and ref.device == device and ref() is not None:
                previous = grown.get(id(ref), (ref, 0))[1]
                grown[id(ref)] = (ref, previous + delta)
        return [(ref, delta) for ref, delta in grown.values() if delta > 0]

    def is_young(self, ref: StorageRef) -> bool:
        """Whether the storage was first seen since the test began."""
        return ref.born >= self.begin_clock

    def pairs(self, refs: list[StorageRef]) -> list[tuple[Any, Any]]:
        """``(tensor, storage)`` for each live indexed tensor that used one of these storages when last read."""
        found = []
        for ref in refs:
            storage = ref()
            if storage is not None:
                found += [(tensor, storage) for tensor in self.users([ref])]
        return found

    def users(self, refs: list[StorageRef]) -> list[Any]:
        """The live indexed tensors that used these storages when last read (strong references)."""
        found = []
        seen: set[int] = set()
        for ref in refs:
            for ident in ref.users:
                entry = self._entries.get(ident)
                tensor = entry.ref() if entry is not None else None
                if tensor is not None and ident not in seen:
                    seen.add(ident)
                    found.append(tensor)
        return found

    def kept_graph(self, *, threshold: int | None = None, entries: list[Entry] | None = None, before: int | None = None) -> KeptGraph:
        """The autograd nodes made since ``threshold`` (this thread's counter; the test's start by
        default), and before ``before`` where given, that tensors alive now keep: through the
        tensors read since the test began and the older ones it changed in place. Call after an
        observation."""
        threshold = self.begin_graphs if threshold is None else threshold
        if threshold is None:
            return KeptGraph(0, [])
        roots = list(self._young_tensors) + list(self._inplace.values()) if entries is None else entries
        grad_fn = _grad_fn_reader()
        traced = _tracing_tensor_types()
        visited: set[int] = set()
        keep: list[Any] = []
        counted: list[tuple[weakref.ref[Any], int]] = []
        nodes: list[tuple[int, weakref.ref[Any], Any]] = []
        try:
            for entry in roots:
                tensor = entry.ref()
                if tensor is None or (traced and issubclass(type(tensor), traced)):
                    continue
                try:
                    node = grad_fn(tensor)
                except Exception:
                    continue
                if node is not None:
                    nodes.append((_sequence_number(node) if before is not None else 0, entry.ref, node))
                del tensor
            if before is not None:
                # A node shared by several tensors is credited to the first counted. A step's
                # carried state is made after its temporaries (the sum after the loss added to it,
                # the new weight after the loss and gradient that made it): latest first.
                nodes.sort(key=lambda item: -item[0])
            for _, ref, node in nodes:
                found = count_nodes(node, threshold, visited, keep, before)
                if found:
                    counted.append((ref, found))
        finally:
            nodes.clear()
            keep.clear()
        counted.sort(key=lambda item: -item[1])
        return KeptGraph(sum(found for _, found in counted), counted[:MAX_GRAPH_ROOTS])

    def young_graph(self, threshold: int | None, before: int | None = None) -> KeptGraph:
        """:meth:`kept_graph` through the tensors made since the heap was frozen, found by one
        traversal of the young objects without indexing them (an allocator counts the memory)."""
        if threshold is None:
            return KeptGraph(0, [])
        classes = tensor_types()
        exact = set(classes)
        found = gc.get_referrers(*classes)
        entries = []
        try:
            for obj in found:
                if type(obj) in exact:
                    try:
                        ref = TensorRef(obj)
                    except TypeError:
                        continue
                    entries.append(Entry(ref))
        finally:
            found.clear()
        return self.kept_graph(threshold=threshold, entries=entries, before=before)

    def entries_since_run(self, clock: int) -> list[Entry]:
        """The roots :meth:`kept_graph` reads for the runs of a test since ``clock``: the live
        tensors first read since, and the older ones the last run changed in place."""
        return self.entries_born_since(clock) + list(self._inplace.values())

    def entries_born_since(self, clock: int) -> list[Entry]:
        """Live indexed tensors first read at ``clock`` or later (a walk of the index: for a leak)."""
        return [entry for entry in self._entries.values() if entry.born >= clock and entry.ref() is not None]

    def adopt(self, refs: list[StorageRef]) -> None:
        """These storages belong to a fixture of a wider scope set up during the test: never the test's."""
        for ref in refs:
            ref.adopted = True

    def adopted_alive(self, device: str) -> list[StorageRef]:
        """Live storages on ``device`` that fixtures of a wider scope made during the current test."""
        return [ref for ref in self._young if ref.adopted and ref.device == device and ref() is not None]

    def alive_since(self, device: str, clock: int, before: int | None = None) -> list[StorageRef]:
        """Live storages on ``device`` first seen at ``clock`` or later (and before ``before``), less
        those fixtures of a wider scope made (a walk of the index: for a leak)."""
        return [
            ref
            for ref in self._storages.values()
            if ref.born >= clock and (before is None or ref.born < before) and ref.device == device and not ref.adopted and ref() is not None
        ]

    # -- reading --------------------------------------------------------------------------------

    def read_all(self) -> None:
        """Read every indexed tensor and storage again (2c of the module docstring)."""
        self.full_reads += 1
        torch = _torch()
        with torch._C.DisableTorchFunction():
            for ident, entry in list(self._entries.items()):
                tensor = entry.ref()
                if tensor is None:
                    self._forget(ident, entry)
                    continue
                self._read_tensor(tensor, set(), [])
            for ref in list(self._storages.values()):
                storage = ref()
                if storage is not None:
                    self._register(storage, None)

    def _read_gradients(self) -> None:
        """Compare the gradient of every indexed leaf that requires grad with what was read (2b),
        at C speed; read again, in full, the tensors whose gradient changed. (A gradient that grew
        in place is a storage whose size changed: 2c. One that was replaced died: 2a, since a
        tensor is among the users of its gradient's storages, so a gradient object's id that an
        earlier one had cannot hide a change.)

        The leaves indexed before the test began are compared from lists kept between calls;
        those indexed since, few and short-lived, one by one."""
        self.grad_reads += 1
        torch = _torch()
        with torch._C.DisableTorchFunction():
            self._read_changed_gradients(self._capable_new)
            if self._grad_refs is None:
                entries = list(self._capable.values())
                self._grad_refs = list(map(_ENTRY_REF, entries))
                self._grad_known = list(map(id, map(operator.call, map(_ENTRY_GRAD, entries))))
            tensors = list(map(operator.call, self._grad_refs))
            if any(map(operator.is_, tensors, itertools.repeat(None))):  # some died since: forget them
                for ident, entry in list(self._capable.items()):
                    if entry.ref() is None:
                        self._forget(ident, entry)
                entries = list(self._capable.values())
                self._grad_refs = list(map(_ENTRY_REF, entries))
                self._grad_known = list(map(id, map(operator.call, map(_ENTRY_GRAD, entries))))
                tensors = list(map(operator.call, self._grad_refs))
            try:
                grads = list(map(_GRAD, tensors))
            except Exception:  # a tensor that will not say: read each in full
                grads = [_Nothing] * len(tensors)
            ids = list(map(id, grads))
            grads.clear()
            if ids != self._grad_known:
                for tensor, now, before in zip(tensors, ids, self._grad_known):
                    if now != before:
                        self._read_tensor(tensor, set(), [])
                self._grad_refs = None
        tensors.clear()

    def _backward_noted(self, tensors: list[Any]) -> None:
        """A backward pass is about to run (on any thread) and may write the gradients of these."""
        self._backward_ran = True
        entries = self._entries
        for tensor in tensors:
            entry = entries.get(id(tensor))
            if entry is not None and entry.ref() is tensor:
                self._touched[id(tensor)] = entry
            else:
                self._touched_new.append(weakref.ref(tensor))

    def _read_touched(self) -> None:
        """Read again the tensors a backward pass may have given a gradient, where it changed."""
        touched, self._touched = self._touched, {}
        new, self._touched_new = self._touched_new, []
        tensors = [tensor for tensor in map(operator.call, list(new)) if tensor is not None]
        with _torch()._C.DisableTorchFunction():
            for tensor in tensors:
                self._read_tensor(tensor, set(), [])
        tensors.clear()
        self._read_changed_gradients(touched)  # it copies the dict first: a backward on another thread may still add

    def _read_changed_gradients(self, entries: dict[int, Entry]) -> None:
        """Read again, in full, those of these tensors whose gradient is not the one last read
        (one by one: for the few); forget those that died."""
        changed = []
        with _torch()._C.DisableTorchFunction():
            for ident, entry in list(entries.items()):
                tensor = entry.ref()
                if tensor is None:
                    self._forget(ident, entry)
                elif _GRAD(tensor) is not entry.grad():
                    changed.append(tensor)
            for tensor in changed:
                self._read_tensor(tensor, set(), [])
        changed.clear()

    def _forget(self, ident: int, entry: Entry) -> None:
        if self._entries.get(ident) is entry:
            del self._entries[ident]
        if self._capable.get(ident) is entry:
            del self._capable[ident]
            self._grad_refs = None
        if self._capable_new.get(ident) is entry:
            del self._capable_new[ident]
        if self._retainers.get(ident) is entry:
            del self._retainers[ident]
        if self._plain.get(ident) is entry:
            del self._plain[ident]
            self._plain_refs = None

    def _scan(self, *, thaw: bool = False) -> bool:
        """Read every tensor and storage object in the unfrozen generations; with ``thaw``, say
        whether the old sentinel is among them (someone unfroze the heap: see :meth:`begin`)."""
        torch = _torch()
        tensor_classes = tensor_types()
        storage_classes = untyped_storage_types()
        found = gc.get_referrers(*tensor_classes, *storage_classes, _Sentinel, *((_OldSentinel,) if thaw else ()))
        tensors = set(tensor_classes)
        storages = set(storage_classes)
        sentinel = self._sentinel
        saw_sentinel = thawed = False
        visited: set[int] = set()
        keep: list[Any] = []
        try:
            with torch._C.DisableTorchFunction(), collections_paused():
                for obj in found:
                    kind = type(obj)
                    if kind in tensors:
                        self._read_tensor(obj, visited, keep)
                    elif kind in storages:
                        self._register(obj, None)
                    elif obj is sentinel:
                        saw_sentinel = True
                    elif thaw and obj is self._old_sentinel:
                        thawed = True
        finally:
            found.clear()
            keep.clear()
        if self._froze and not saw_sentinel and not thawed:
            self._someone_froze()
        return thawed

    def _someone_froze(self) -> None:
        """The test froze the heap itself: what it made since the tracker's freeze is frozen too.

        Index the whole heap once (what is new is young), and from now on leave freezing to it.
        """
        FREEZERS.discard(self)
        self._froze = False
        self._foreign = True
        self._sentinel = None
        with whole_heap():
            self._scan()

    def freeze_young(self) -> None:
        """Freeze what is young now (as a baseline is taken): later observations read only what
        is made after. Older tensors' changes are watched as ever (2a to 2c)."""
        if self._froze:
            self._refreeze()

    def _someone_thawed(self, offsets_since: int) -> None:
        """The test unfroze the heap: garbage older than the test can now be collected, and what
        older storages die from here on cannot offset a leak (it may be that garbage); nor can
        what died in the observation that found it out (from ``offsets_since`` in the list)."""
        FREEZERS.discard(self)
        self._froze = False
        self._foreign = True
        self._sentinel = self._old_sentinel = None
        self._offsets_open = False
        for _, ref in self._freed[offsets_since:]:
            self._older_garbage[ref.device] += ref.nbytes
        del self._freed[offsets_since:]

    def _refreeze(self) -> None:
        gc.freeze()
        self.refrozen()

    def _index_between_tests(self) -> None:
        """Index the tensors made since the last checked test ended (still in the young generations)."""
        torch = _torch()
        tensor_classes = set(tensor_types())
        storage_classes = set(untyped_storage_types())
        visited: set[int] = set()
        keep: list[Any] = []
        with torch._C.DisableTorchFunction(), collections_paused():
            for generation in (0, 1):
                for obj in gc.get_objects(generation):
                    kind = type(obj)
                    if kind in tensor_classes:
                        self._read_tensor(obj, visited, keep)
                    elif kind in storage_classes:
                        self._register(obj, None)
        keep.clear()

    def _rebuild(self) -> None:
        """Index every tensor and storage of the heap (the first check, and after untracked code ran)."""
        self._entries.clear()
        self._capable.clear()
        self._capable_new.clear()
        self._retainers.clear()
        self._grad_refs = None
        self._plain.clear()
        self._plain_refs = None
        self._young_tensors = []
        with whole_heap():
            # Garbage indexed here (cycles of untracked code) can only die after the test that
            # follows: frozen meanwhile, it offsets nothing.
            self._process_dead()
            self._scan()
        self.stale = self.unindexed = False

    def catch_up(self) -> None:
        """Read everything again before naming a leak the allocator found.

        What the test made is young and read as such; where earlier checks did not index what
        they kept (:attr:`unindexed`), the rest of the heap is indexed as older than the test.
        """
        self._observed = True
        self._process_dead()
        self._scan()
        if self.unindexed or self.stale:
            self._born_override = self.begin_clock - 1
            try:
                with whole_heap():
                    self._scan()
            finally:
                self._born_override = None
            self.unindexed = self.stale = False
        self.read_all()

    def _read_tensor(self, tensor: Any, visited: set[int], keep: list[Any]) -> None:
        """Read a tensor whole: its storages, its gradient, the tensors its autograd graph saved."""
        ident = id(tensor)
        entry = self._entries.get(ident)
        fresh = entry is None or entry.ref() is not tensor
        if fresh:
            try:
                tensor_ref = TensorRef(tensor, self._tensor_died)
            except TypeError:
                return
            tensor_ref.ident = ident
            entry = Entry(tensor_ref, self.clock if self._born_override is None else self._born_override)
            self._entries[ident] = entry
            if self._begun and entry.born >= self.begin_clock:
                self._young_tensors.append(entry)
                if len(self._young_tensors) > 2 * self._young_tensors_alive + 64:  # a long loop's temporaries
                    self._young_tensors = [e for e in self._young_tensors if e.ref() is not None]
                    self._young_tensors_alive = len(self._young_tensors)
        assert entry is not None
        untyped_storage, is_nested = _storage_readers()
        try:  # the common case, one strided storage, without the general function's calls
            storages: Any = (untyped_storage(tensor),) if not is_nested(tensor) else tensor_storages(tensor)
        except Exception:
            storages = tensor_storages(tensor)
        refs: list[StorageRef] = []
        for storage in storages:
            ref = self._register(storage, ident)
            if ref is not None:
                refs.append(ref)
        entry.storages = tuple(refs)
        try:
            entry.version = _version_reader()(tensor)
        except Exception:
            entry.version = -2
        try:
            leaf = tensor.is_leaf
            retains = tensor.retains_grad
            entry.capable = (leaf and tensor.requires_grad) or retains
            grad = tensor._grad if (leaf or retains) else None
            grad_fn = tensor.grad_fn
        except Exception:
            return
        if entry.capable:
            if self._capable.get(ident) is not entry and self._capable_new.get(ident) is not entry:
                self._capable_new[ident] = entry
            if self._plain.pop(ident, None) is not None:
                self._plain_refs = None
        elif not self._begun and self._plain.get(ident) is not entry:
            self._plain[ident] = entry  # indexed between tests: older than the next test
            self._plain_refs = None
        if not entry.capable and not fresh:
            self._capable_new.pop(ident, None)
            if self._capable.pop(ident, None) is not None:
                self._grad_refs = None
        if entry.capable and not leaf:
            self._retainers[ident] = entry
        elif self._retainers:
            self._retainers.pop(ident, None)
        if grad is not None and is_tensor_type(type(grad)):
            if entry.grad() is not grad:
                entry.grad = weakref.ref(grad)
                if ident in self._capable:
                    self._grad_refs = None
            if id(grad) not in visited:
                visited.add(id(grad))
                keep.append(grad)
                self._read_tensor(grad, visited, keep)
            grad_entry = self._entries.get(id(grad))
            for ref in grad_entry.storages if grad_entry is not None else ():
                if ident not in ref.users:
                    ref.users.append(ident)  # its gradient's death is this tensor's change too
        elif entry.grad is not _NO_GRAD:
            if ident in self._capable:
                self._grad_refs = None
            entry.grad = _NO_GRAD
        if grad_fn is not None:
            for saved in _graph_tensors(grad_fn, visited, keep):
                for storage in tensor_storages(saved):
                    self._register(storage, None)

    def _register(self, storage: Any, user: int | None) -> StorageRef | None:
        ident = id(storage)
        ref = self._storages.get(ident)
        same = ref is not None and ref() is storage
        if ref is not None and same:
            try:
                nbytes = storage.nbytes()
            except Exception:
                return ref
            if nbytes != ref.nbytes:  # resized in place
                delta = nbytes - ref.nbytes
                ref.nbytes = nbytes
                self._totals[ref.device] += delta
                facts = storage_facts(storage)
                ref.pointer = facts[1] if facts is not None else 0
                if self._drift is not None:
                    self._drift.append((ref, delta))
                elif self._begun and ref.born < self.clock:
                    self._grown.append((self.clock, ref, delta))
            if user is not None and user not in ref.users:
                ref.users.append(user)
            return ref
        facts = storage_facts(storage, empty=True)  # an empty storage can still grow in place
        if facts is None:
            return None
        device, pointer, nbytes = facts
        ref = StorageRef(storage, self._storage_died)
        born = self.clock if self._born_override is None else self._born_override
        ref.ident, ref.nbytes, ref.device, ref.pointer, ref.born = ident, nbytes, device, pointer, born
        ref.adopted = False
        ref.users = [user] if user is not None else []
        self._storages[ident] = ref
        if user == ident:  # an opaque tensor, standing for its own storage
            self._opaque.add(ident)
        self._totals[device] += nbytes
        if self._begun and born >= self.begin_clock:
            self._young.append(ref)
        elif self._drift is not None:
            self._drift_new.append(ref)
        return ref

    def _on_death(self, ref: StorageRef) -> None:
        # Runs wherever the storage dies, in any thread: note it and nothing else.
        self._dead.append(ref)

    def _on_tensor_death(self, ref: TensorRef) -> None:
        self._dead_tensors.append(ref.ident)

    def _process_dead(self, *, offsets: bool = True, deaths: list[tuple[int, int, str]] | None = None) -> None:
        while self._dead_tensors:
            ident = self._dead_tensors.pop()
            entry = self._entries.get(ident)
            if entry is not None and entry.ref() is None:
                self._forget(ident, entry)
        while self._dead:
            dead, self._dead = self._dead, []
            reread: list[Any] = []
            for ref in dead:
                if self._storages.get(ref.ident) is ref:
                    del self._storages[ref.ident]
                    self._opaque.discard(ref.ident)
                self._totals[ref.device] -= ref.nbytes
                if deaths is not None:
                    deaths.append((ref.born, ref.nbytes, ref.device))
                if self._begun and ref.born < self.begin_clock:
                    if offsets and self._offsets_open:
                        self._freed.append((self.clock, ref))
                    else:
                        self._older_garbage[ref.device] += ref.nbytes
                elif self._begun:
                    self._young_dead += 1
                for ident in ref.users:  # their storage changed under them (2a)
                    entry = self._entries.get(ident)
                    tensor = entry.ref() if entry is not None else None
                    if tensor is not None:
                        reread.append(tensor)
            if reread:
                torch = _torch()
                with torch._C.DisableTorchFunction():
                    for tensor in reread:
                        self._read_tensor(tensor, set(), [])
                reread.clear()
        if self._young_dead * 2 > len(self._young) > 64:  # a long loop's temporaries: keep the list short
            self._young = [ref for ref in self._young if ref() is not None]
            self._young_dead = 0

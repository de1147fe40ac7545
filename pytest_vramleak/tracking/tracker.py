"""Per-test accounting of tensor storages at the cost of what the test did, not of what the process holds.

A census (:mod:`pytest_vramleak.tracking.census`) walks every object of the heap; with torch loaded that is
10^5 objects or more, and reading every live tensor costs about two microseconds each. A check
around every test cannot afford either. The tracker keeps, across tests, four parts:

- the **index** (:mod:`pytest_vramleak.tracking.index`): every known tensor and storage under a weak
  reference, with what it held when last read; storage deaths arrive by callback;
- the **ledger** (:mod:`pytest_vramleak.tracking.ledger`): births, growths and deaths stamped with the
  tracker's clock, and what they say a test leaked, less what older storages freed;
- the **watches** (:mod:`pytest_vramleak.tracking.watches`): the changes to older tensors that no young
  object shows (gradients written by backward, growth in place, graphs given in place), and
  the exhaustive comparisons deferred to between tests (:meth:`Tracker.drift`);
- the **graphs** (:mod:`pytest_vramleak.tracking.graphs`): the autograd history a test left alive.

This module runs them around a test. As its setup starts, ``gc.freeze()`` makes scans and
collections see only the objects made since, so each observation costs what the test made: the
young Python tensors and storage objects are read, what died is known from the callbacks, and
the totals follow.

**Why it sees what a census would see.** A storage a census counts is reached from a Python
tensor or storage object T, directly, as T's gradient, or through T's autograd graph.

1. T was made since the last freeze: T is not frozen, so the scan of each observation finds it
   and reads it whole (storages, gradient, graph). Objects made between two checked tests are in
   the young generations when the next test begins, and are indexed then. So is what a test
   that ran unchecked made, where Python's collector ran no collection of generation 1 or 2
   since the last check ended (nothing made since has left generations 0 and 1); what that code
   changed of older tensors is then compared in full (:meth:`Watches.catch_up`). Where it did
   run one, the whole heap is indexed again.
2. T is older: it is in the index, with what it held when last read. What it holds can change
   only when one of its storages dies (the index reads its users again) or in the ways the
   watches look for, each argued in :mod:`pytest_vramleak.tracking.watches`.

Where the heap is frozen by someone else (a conftest that froze it, or a test that freezes it),
nothing is frozen by the tracker: it notices (a young sentinel object made at each freeze goes
missing from its scans, or the freeze count is not zero when a test begins), indexes the whole
heap once, and from then on each scan walks every unfrozen object: correct, and slower. Where a
test unfreezes the heap, an old sentinel frozen with it shows up in the next scan: older garbage
may then be collected, so from there on what older storages free offsets nothing (it is reported
as older garbage freed: :meth:`~pytest_vramleak.tracking.ledger.Ledger.close_offsets`).

Accelerators have allocator counters (see :mod:`pytest_vramleak.meters.devices`); there the tracker is
asked only to name what leaked, and reads every indexed tensor on that device then.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any, NamedTuple

from . import gc_functions as gc
from .census import _torch, frozen_since_noted, tensor_types, untyped_storage_types, whole_heap
from .freezing import HeapFreeze
from .graphs import NODE_BYTES, KeptGraph, graph_clock, kept_graph, young_graph
from .index import Index
from .ledger import Ledger
from .refs import Entry, StorageRef
from .torch_api import objects_referring_to
from .watches import COMPARED_PER_CHECK, Watches

__all__ = [
    "COLLECTIONS_PER_OBSERVATION",
    "COMPARED_PER_CHECK",
    "NODE_BYTES",
    "REFREEZE_AFTER_SECONDS",
    "Entry",
    "KeptGraph",
    "Mark",
    "StorageRef",
    "Tracker",
    "graph_clock",
]

REFREEZE_AFTER_SECONDS = 0.002
"""An observation that spent longer than this collecting and scanning young objects (a step
that imported modules, a set-up that built much) freezes them, so later observations skip them."""


COLLECTIONS_PER_OBSERVATION = 4
"""At most this many collections in one observation of a frozen heap (see :meth:`Tracker._collect`)."""


class Mark(NamedTuple):
    """One observation: the tracker's clock, and autograd's counter for the next one to compare with."""

    clock: int
    graphs: int | None
    """This thread's autograd sequence counter right after the observation."""


class Tracker:
    """Indexes tensors and storages of every device; see the module docstring."""

    def __init__(self, device: str | None = None, *, defer: bool = False) -> None:
        self.device = device
        """The device the tracker's owner measures (the tracker itself indexes every device)."""
        self.ledger = Ledger()
        self.index = Index(self.ledger)
        self.watches = Watches(self.index, defer=defer)
        """``defer``: whether observations may leave the comparison of many older tensors (more
        than :data:`COMPARED_PER_CHECK`) to :meth:`drift` between checks: the plugin's tracker,
        whose owner runs that between tests. A tracker made for one check in a script compares
        them at every observation: nothing else would."""
        self.stale = True
        """Set when code ran untracked since :meth:`end`: the next :meth:`begin` reads what it made
        and changed, or indexes the whole heap again (see :meth:`_young_since_end`)."""
        self.unindexed = False
        """Set when a check ended that never observed (its allocator counted): what it kept is not indexed."""
        self.begin_graphs: int | None = None
        """This thread's autograd sequence counter as the current test began: nodes numbered from
        it on were made by the test."""
        self.settled: list[tuple[int, int, str]] = []
        """What the last :meth:`settle` freed: when each storage was first seen, its bytes and device."""
        self._settled_at: int | None = None
        self._observed = False
        self._last_scan_seconds = 0.0
        """How long the last observation took, collecting and reading what is young."""
        self.freeze = HeapFreeze(self)
        self._body_freeze: object | None = None
        """The freeze as the current test's body began (see :meth:`made_since_freeze`)."""
        self._collections_at_end: tuple[int, int] | None = None
        """Python's count of collections of generations 1 and 2 as the last check ended."""

    # -- the protocol around a test -------------------------------------------------------------

    def begin(self, *, index: bool = True) -> None:
        """A checked test's setup starts: index what is new, collect young garbage, freeze the heap.

        ``index=False`` where an allocator counts the memory: nothing is read unless a leak must
        be named (see :meth:`catch_up`).
        """
        if self.freeze.frozen_by_others():
            self.stale = True
        if index and self.stale and not self.unindexed and self._young_since_end():
            self._catch_up_untracked()
        elif index and (self.stale or self.unindexed):
            self._rebuild()
        elif self.freeze.foreign:
            gc.collect()  # older garbage goes before the test, so it cannot offset what the test leaks
            # (read where an allocator counts too: with nothing frozen, what the test makes can be
            # told from what was there only by what was read before it began)
            self._scan()
        else:
            if index:
                self.index.read_generations((0, 1))  # made since the last checked test ended
            gc.collect(1)  # young garbage earlier tests left in cycles goes now, not after this test
        self.index.process_dead()  # storages that died before the test: not the test's doing
        self.index.kinds.join_capable()
        self.age_young()
        self.ledger.start()
        self.begin_graphs = graph_clock(_torch()) if index else None
        self._observed = False
        self.watches.start()
        self.freeze.freeze()
        self._body_freeze = self.freeze.last_freeze

    def end(self) -> None:
        """The test is over: unfreeze the heap (older cycles are collected by Python's own schedule)."""
        self.index.process_dead()
        begun = self.ledger.begun
        if begun and not self._observed and (self.freeze.froze or self.freeze.foreign):
            # A test that ended before its check observed anything (skipped by a marker as its
            # set-up began, a set-up error): what it made and kept is young, so reading it now
            # costs what it did, where indexing the heap again before the next test costs the heap.
            self._scan()
        elif begun and not self._observed:
            self.unindexed = True  # what this test made and kept is not indexed
        self.ledger.begun = False
        self.watches.stop()
        self.freeze.thaw()
        self._collections_at_end = gc.older_collections()

    def close(self) -> None:
        """The session is over: forget every tensor and storage read. The index keeps an object
        for each, and every walk of the heap after the session (pytest's last collections, as it
        unconfigures) would pass over them."""
        if self.active:
            self.end()
        self.index.close()
        self.ledger.clear()

    @property
    def active(self) -> bool:
        """Whether a test's tracking is under way (between :meth:`begin` and :meth:`end`)."""
        return self.ledger.begun

    @property
    def clock(self) -> int:
        return self.ledger.clock

    @property
    def begin_clock(self) -> int:
        return self.ledger.begin_clock

    @property
    def deferred(self) -> bool:
        """Set when a check left an exhaustive comparison (sizes, gradients) to :meth:`drift`."""
        return self.watches.deferred

    @property
    def grad_reads(self) -> int:
        """How many times the gradients of every indexed leaf were compared."""
        return self.watches.grad_reads

    # -- observing ------------------------------------------------------------------------------

    def observe(
        self,
        *,
        collect: bool = True,
        since: Mark | None = None,
        watch: bool = True,
        generations: int = 2,
        just_read: bool = False,
    ) -> Mark:
        """Collect young garbage, note what died, read what is young, and return the moment.

        With ``since`` (an earlier observation of the same test) and ``watch``, also look at
        what is older for changes since then (:mod:`pytest_vramleak.tracking.watches`). Leave ``watch``
        off where an allocator counts the memory. ``generations=1`` collects the youngest two of
        the unfrozen generations only: where garbage left in the oldest is frozen next and cannot
        die before the measurements that follow (a step loop's baseline). ``just_read``: the
        observation just before read what is young (without collecting) and nothing ran since, so
        it is read again only where this collection found garbage, whose finalizers and weakref
        callbacks run code that may change it.
        """
        started = time.perf_counter()
        offsets_before = len(self.ledger.freed)
        collected = self._collect(generations) if collect else 0
        graphs = graph_clock(_torch()) if watch else None
        self.ledger.clock += 1
        self._observed = True
        self.index.process_dead()
        read_before = 0.0
        if just_read and collect and not collected:
            read_before = self._last_scan_seconds  # what a scan now would take again, for the freeze below
        elif self._scan(thaw=self.freeze.watching_thaw):
            self._someone_thawed(offsets_before)
        scanned = time.perf_counter() - started + read_before
        self._last_scan_seconds = 0.0 if read_before else scanned
        if watch and since is not None:
            self.watches.look(graphs is None or since.graphs is None or graphs != since.graphs)
        # (only just after a collection: young garbage not yet collected would be frozen with the
        # rest, kept as if alive and out of the collections that follow: a cycle the body left)
        if self.freeze.froze and collect and scanned > REFREEZE_AFTER_SECONDS:
            self.freeze.refreeze()
        return Mark(self.clock, graphs)

    def collect_between_runs(self) -> list[tuple[int, int, str]]:
        """A test is about to run again: collect every generation, and return what died since the
        last run ended (each storage's clock of birth, bytes and device). The last run's garbage on
        reference cycles left the young generations with its teardown; not collected now, it would
        be frozen with the heap through this run and count as kept by both."""
        gc.collect()
        deaths: list[tuple[int, int, str]] = []
        self.index.process_dead(offsets=False, deaths=deaths)
        return deaths

    def drift_due(self) -> bool:
        """Whether :meth:`drift` should run now (see :meth:`Watches.drift_due`)."""
        return self.watches.drift_due()

    def drift(self) -> list[tuple[StorageRef, int]]:
        """What the comparisons deferred to between checks find: see :meth:`Watches.drift`."""
        return self.watches.drift()

    def index_young(self) -> None:
        """Index what was made since the freeze (before someone unfreezes the heap for a while)."""
        if self.freeze.froze:
            self.index.process_dead()
            self._scan()

    def settle(self) -> Counter[str]:
        """Collect every generation, the frozen ones too (cycles that outlived an observation),
        and note what died. Costs a walk of the whole heap: for confirming a suspected leak.
        Older storages it frees offset nothing (garbage older than the test cannot hide a leak:
        :mod:`pytest_vramleak.tracking.ledger`). What died is in :attr:`settled`."""
        self.index_young()
        if self.freeze.froze:
            gc.unfreeze()
            try:
                gc.collect()
            finally:
                self.freeze.refreeze()
        else:
            gc.collect()
        self.ledger.clock += 1
        before: Counter[str] = Counter(self.ledger.older_garbage)
        self.settled = []
        self.index.process_dead(offsets=False, deaths=self.settled)
        self._settled_at = None if self.settled else self.ledger.clock
        freed: Counter[str] = self.ledger.older_garbage - before
        return freed

    def suite_set_up(self, clock: int) -> None:
        """The suite's own set-up hooks ran: older storages born before ``clock`` that they freed
        offset nothing (see :meth:`Ledger.forget_offsets_born_before`)."""
        if self.ledger.begun and self.ledger.offsets_open:
            self.index.process_dead()
            self.ledger.forget_offsets_born_before(clock)

    def settled_already(self) -> bool:
        """Whether the last :meth:`settle` freed no storage and nothing was read since (the clock
        has not moved): a collection now would free no storage either, its garbage holding none."""
        return self._settled_at == self.ledger.clock

    def refrozen(self) -> None:
        """The heap was unfrozen for a while and frozen again (see :func:`census.whole_heap`)."""
        self.freeze.refrozen()

    @contextmanager
    def unfrozen(self) -> Iterator[None]:
        """The whole heap visible for a while (a holder search needs all of it)."""
        with whole_heap():
            yield

    def freeze_young(self) -> None:
        """Freeze what is young now (as a baseline is taken): later observations read only what
        is made after. Older tensors' changes are watched as ever."""
        if self.freeze.froze:
            self.freeze.refreeze()
        self._body_freeze = self.freeze.last_freeze

    def _collect(self, generations: int) -> int:
        """Collect the young generations (while frozen: what was made since the freeze only), and
        where the heap is frozen, again while a collection finds garbage, as many as
        :data:`COLLECTIONS_PER_OBSERVATION` in all. Collecting a tensor's autograd graph makes
        garbage of the Python objects its nodes held from C++ (saved tensors, hooks, their cycles),
        which only the next collection can see; the young heap may be frozen after this
        observation, and what is garbage then would be kept as if alive through the test."""
        found = collected = gc.collect(generations)
        rounds = 1
        while found and self.freeze.froze and rounds < COLLECTIONS_PER_OBSERVATION:
            found = gc.collect(generations)
            collected += found
            rounds += 1
        return collected

    def _scan(self, *, thaw: bool = False) -> bool:
        """Read every tensor and storage object in the unfrozen generations; with ``thaw``, say
        whether the old sentinel is among them (someone unfroze the heap: see :meth:`begin`).
        Where the suite freezes the heap itself, and froze more since it was last read whole,
        the frozen objects are read too: a test that freezes what it keeps would hide it."""
        with whole_heap() if self.freeze.foreign and frozen_since_noted() else nullcontext():
            found = self.index.scan(self.freeze.markers(thaw))
        someone_froze, thawed = self.freeze.read(found, thaw)
        found.clear()
        if someone_froze:
            self._someone_froze()
        return thawed

    def _someone_froze(self) -> None:
        """The test froze the heap itself: what it made since the tracker's freeze is frozen too.

        Index the whole heap once (what is new is young), and from now on leave freezing to it.
        """
        self.freeze.give_up(thawed=False)
        with whole_heap():
            self._scan()

    def _someone_thawed(self, offsets_since: int) -> None:
        """The test unfroze the heap: garbage older than the test can now be collected, and what
        older storages die from here on cannot offset a leak (it may be that garbage); nor can
        what died in the observation that found it out (from ``offsets_since`` in the list)."""
        self.freeze.give_up(thawed=True)
        self.ledger.close_offsets(offsets_since)

    def _rebuild(self) -> None:
        """Index every tensor and storage of the heap (the first check, and after untracked code ran)."""
        self.index.clear()
        self.ledger.young_tensors = []
        with whole_heap():
            # Garbage indexed here (cycles of untracked code) can only die after the test that
            # follows: frozen meanwhile, it offsets nothing.
            self.index.process_dead()
            self._scan()
        self.stale = self.unindexed = False

    def _young_since_end(self) -> bool:
        """Whether all that ran since the last check ended (untracked: another test, a fixture)
        made is still in generations 0 and 1: no collection of generation 1 or 2 ran since, and
        nobody froze the heap. Reading those and comparing the indexed tensors then costs about a
        sixth of a walk of the heap, whatever the number of tensors (each indexed tensor puts objects
        on the heap besides itself: its storage's Python object and the index's records):
        0.7 ms against 32 ms at 10^3 live tensors, 87 ms against 471 ms at 10^5."""
        return (
            self._collections_at_end is not None
            and not self.freeze.foreign
            and gc.older_collections() == self._collections_at_end
        )

    def _catch_up_untracked(self) -> None:
        """Read what untracked code made (generations 0 and 1) and changed of older tensors, instead
        of indexing the whole heap again; what it made is older than the test that begins."""
        self.index.process_dead()
        self.index.read_generations((0, 1))
        self.watches.catch_up()
        self.stale = False

    def catch_up(self, *, after_runs: int | None = None) -> None:
        """Read everything again before naming a leak the allocator found.

        What the test made is young and read as such; where earlier checks did not index what
        they kept (:attr:`unindexed`), the rest of the heap is indexed as older than the test.
        ``after_runs``: the test ran several times, each run's end indexed what it kept (see
        :meth:`end`), and this is the clock as the first began: what was never read is older.
        """
        self._observed = True
        self.index.process_dead()
        if after_runs is None:
            self._scan()
        if self.unindexed or self.stale:
            self.ledger.born_override = (self.begin_clock if after_runs is None else after_runs) - 1
            try:
                with whole_heap():
                    self._scan()
            finally:
                self.ledger.born_override = None
            self.unindexed = self.stale = False
        self.read_all()

    def read_all(self) -> None:
        """Read every indexed tensor and storage again."""
        self.index.read_all()

    # -- what the ledger and the index say -----------------------------------------------------

    def total(self, device: str) -> int:
        """Bytes of the known live storages on ``device``."""
        return self.index.totals[device]

    def created(self, device: str, *, since: int, before: int | None = None) -> list[StorageRef]:
        """Live storages on ``device`` first seen after clock ``since`` (and before ``before``)."""
        return self.ledger.created(device, since=since, before=before)

    def freed_older(self, device: str, *, since: int) -> int:
        """Bytes of storages older than the test that died or shrank after clock ``since``."""
        return self.ledger.freed_older(device, since=since)

    def grown_older(self, device: str, *, since: int) -> list[tuple[StorageRef, int]]:
        """Live storages that existed at clock ``since`` and grew in place after it, with the growth."""
        return self.ledger.grown_older(device, since=since)

    def is_young(self, ref: StorageRef) -> bool:
        """Whether the storage was first seen since the test began."""
        return self.ledger.is_young(ref)

    def adopt(self, refs: list[StorageRef]) -> None:
        """These storages belong to a fixture of a wider scope set up during the test: never the test's."""
        self.ledger.adopt(refs)

    def adopted_alive(self, device: str) -> list[StorageRef]:
        """Live storages on ``device`` that fixtures of a wider scope made during the current test."""
        return self.ledger.adopted_alive(device)

    def alive_since(self, device: str, clock: int, before: int | None = None) -> list[StorageRef]:
        """Live storages on ``device`` first seen at ``clock`` or later (and before ``before``)."""
        return self.index.alive_since(device, clock, before)

    def users(self, refs: list[StorageRef]) -> list[Any]:
        """The live indexed tensors that used these storages when last read (strong references)."""
        return self.index.users(refs)

    def first_gradients(self, refs: list[StorageRef], clock: int) -> bool:
        """Whether these storages are all first gradients of older leaves (see :meth:`Index.first_gradients`)."""
        return self.index.first_gradients(refs, clock)

    def users_of_each(self, refs: list[StorageRef], tensors: list[Any]) -> list[StorageRef] | None:
        """The tensors that used each storage, appended to ``tensors``, and each one's storage (see
        :meth:`Index.users_of_each`)."""
        return self.index.users_of_each(refs, tensors)

    def made_since_freeze(self) -> list[Any] | None:
        """The tensors and storage objects gc tracks that were made since this tracker froze the
        heap as a test's body began (what the body made), or None where it does not hold the heap
        frozen, froze it again since, or someone else froze or thawed it (strong references:
        clear the list)."""
        if not self.freeze.froze or self.freeze.foreign or self.freeze.last_freeze is not self._body_freeze:
            return None  # (frozen again since the body began: a step check's observation, a holder search)
        classes, markers = (*tensor_types(), *untyped_storage_types()), self.freeze.markers(self.freeze.watching_thaw)
        found = objects_referring_to((*classes, *markers))
        wanted, sentinels = set(classes), set(markers)
        try:
            froze, thawed = self.freeze.read(
                [obj for obj in found if type(obj) in sentinels], self.freeze.watching_thaw
            )
            if froze or thawed:  # someone else froze (or thawed) the heap meanwhile: the next scan tells
                return None
            return list(itertools.compress(found, map(wanted.__contains__, map(type, found))))
        finally:
            found.clear()

    def sole_users(self, refs: list[StorageRef]) -> list[Any]:
        """The tensor that alone used each storage, or None (see :meth:`Index.sole_users`)."""
        return self.index.sole_users(refs)

    def pairs(self, refs: list[StorageRef]) -> list[tuple[Any, Any]]:
        """``(tensor, storage)`` for each live indexed tensor that used one of these storages when last read."""
        return self.index.pairs(refs)

    def pairs_since(self, refs: list[StorageRef], clock: int) -> list[tuple[Any, Any]]:
        """The pairs of tensors and storages, and of storage objects with themselves, first read at
        ``clock`` or later (see :meth:`Index.pairs_since`)."""
        return self.index.pairs_since(refs, clock)

    def age_young(self) -> None:
        """The tensors the last test made that outlive it and take no gradient become older ones
        (done as a test begins; the run that records sites asks first, so that tracing, which it
        starts before the test sets up, does not trace the lists this makes)."""
        self.index.kinds.make_plain(self.ledger.take_young_tensors(), self.index.entries)

    def kept_graph(
        self, *, threshold: int | None = None, entries: list[Entry] | None = None, before: int | None = None
    ) -> KeptGraph:
        """The autograd nodes made since ``threshold`` (the test's start by default), and before
        ``before`` where given, that tensors alive now keep: through the tensors read since the
        test began and the older ones it changed in place. Call after an observation."""
        threshold = self.begin_graphs if threshold is None else threshold
        roots = self.ledger.young_tensors + list(self.ledger.inplace.values()) if entries is None else entries
        return kept_graph(roots, threshold, before)

    def young_graph(self, threshold: int | None, before: int | None = None) -> KeptGraph:
        """:func:`graphs.young_graph`: the history kept through tensors made since the freeze."""
        return young_graph(threshold, before)

    def entries_since_run(self, clock: int) -> list[Entry]:
        """The roots :meth:`kept_graph` reads for the runs of a test since ``clock``: the live
        tensors first read since, and the older ones the last run changed in place."""
        return self.index.entries_born_since(clock) + list(self.ledger.inplace.values())

    def entries_born_since(self, clock: int) -> list[Entry]:
        """Live indexed tensors first read at ``clock`` or later (a walk of the index: for a leak)."""
        return self.index.entries_born_since(clock)

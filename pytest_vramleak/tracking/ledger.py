"""The ledger of one checked test: which storages were born, grew and died, and when.

The index (:mod:`pytest_vramleak.tracking.index`) tells the ledger of each storage it sees for the first
time, each size it finds changed, and each death its weak-reference callbacks report; the ledger
stamps them with the tracker's clock (one tick per observation) and answers what a check asks:
what was made since an observation, what older storages freed, what grew in place.

**What the ledger says.** On CPU a test leaked the bytes of storages first seen since its setup
began that are still alive, plus the growth in place of older storages, less the bytes of older
storages that died during the test (a replaced gradient, an evicted cache entry): what the CPU
allocator's own counter would show if it had one, as on accelerators.

**Why no offset hides a leak.** Only storages older than the test offset (``born`` before
:attr:`Ledger.begin_clock`): storages made since the setup began never do, so what a fixture makes
and frees at teardown hides nothing. Garbage older than the test is frozen with the heap
(:mod:`pytest_vramleak.tracking.tracker`), so it cannot be collected during the test and pass for memory the
test freed; where the heap was unfrozen under the tracker (:meth:`Ledger.close_offsets`), or a full
collection runs to confirm a leak (:meth:`Ledger.died` with ``offsets=False``), what older storages
free from then on is counted apart, as older garbage, and offsets nothing.
"""

from __future__ import annotations

from collections import Counter

from .refs import Entry, StorageRef


class Ledger:
    """Births, growths and deaths of storages, stamped with the tracker's clock; see the module docstring."""

    def __init__(self) -> None:
        self.clock = 0
        """One tick per observation: what a storage's ``born`` and the ledger's records count in."""
        self.begin_clock = 0
        """The clock as the current test's setup began: storages born from it on are the test's."""
        self.begun = False
        """Whether a test's tracking is under way."""
        self.born_override: int | None = None
        """Where set, the clock given to what is seen for the first time (the rest of the heap,
        indexed late, is older than the test)."""
        self.young: list[StorageRef] = []
        """Storages first seen since the current test began."""
        self.young_dead = 0
        self.young_tensors: list[Entry] = []
        """Tensors first read since the current test began (what may keep its autograd history)."""
        self.young_tensors_alive = 0
        self.freed: list[tuple[int, StorageRef]] = []
        """Older storages that died during the test, with the clock they were noticed at: offsets."""
        self.grown: list[tuple[int, StorageRef, int]] = []
        """Older storages whose size changed in place during the test, with the change."""
        self.older_garbage: Counter[str] = Counter()
        """Bytes of older storages that died where they may have been garbage older than the test."""
        self.offsets_open = True
        self.inplace: dict[int, Entry] = {}
        """Older tensors found changed in place during the current test."""
        self.drift: list[tuple[StorageRef, int]] | None = None
        """While a comparison between tests runs: the storages it found grown, with their growth."""
        self.drift_new: list[StorageRef] = []
        """While a comparison between tests runs: the storages it saw for the first time."""

    @property
    def born(self) -> int:
        """The clock to stamp what is seen for the first time with."""
        return self.clock if self.born_override is None else self.born_override

    def start(self) -> None:
        """A checked test's setup starts: a new clock tick, and empty records."""
        self.clock += 1
        self.begin_clock = self.clock
        self.young, self.freed, self.grown = [], [], []
        self.young_tensors_alive = 0
        self.inplace = {}
        self.young_dead = 0
        self.begun = True
        self.offsets_open = True

    def clear(self) -> None:
        """Forget the records of the last test (the session is over)."""
        self.young, self.young_tensors, self.freed, self.grown, self.drift_new = [], [], [], [], []
        self.inplace, self.drift = {}, None

    # -- what the index reports ------------------------------------------------------------------

    def seen(self, ref: StorageRef) -> None:
        """A storage seen for the first time."""
        if self.begun and ref.born >= self.begin_clock:
            self.young.append(ref)
        elif self.drift is not None:
            self.drift_new.append(ref)

    def resized(self, ref: StorageRef, delta: int) -> None:
        """A known storage found ``delta`` bytes larger (or smaller) than when last read."""
        if self.drift is not None:
            self.drift.append((ref, delta))
        elif self.begun and ref.born < self.clock:
            self.grown.append((self.clock, ref, delta))

    def died(self, ref: StorageRef, *, offsets: bool) -> None:
        """A storage died; older than the test, it offsets a leak where ``offsets`` and offsets are open."""
        if self.begun and ref.born < self.begin_clock:
            if offsets and self.offsets_open:
                self.freed.append((self.clock, ref))
            else:
                self.older_garbage[ref.device] += ref.nbytes
        elif self.begun:
            self.young_dead += 1

    def trim(self) -> None:
        """Keep the list of young storages short where a long loop's temporaries died."""
        if self.young_dead * 2 > len(self.young) > 64:
            self.young = [ref for ref in self.young if ref() is not None]
            self.young_dead = 0

    def tensor_seen(self, entry: Entry) -> None:
        """A tensor read for the first time."""
        if self.begun and entry.born >= self.begin_clock:
            self.young_tensors.append(entry)
            if len(self.young_tensors) > 2 * self.young_tensors_alive + 64:  # a long loop's temporaries
                self.young_tensors = [e for e in self.young_tensors if e() is not None]
                self.young_tensors_alive = len(self.young_tensors)

    def take_young_tensors(self) -> list[Entry]:
        """The tensors the last test read first, handed over as it ends (they become older)."""
        young, self.young_tensors = self.young_tensors, []
        return young

    def forget_offsets_born_before(self, clock: int) -> None:
        """Older storages born before ``clock`` that died so far offset nothing: the suite's own
        set-up hooks freed them (state a conftest resets as each test sets up), not the test."""
        self.freed = [(at, ref) for at, ref in self.freed if ref.born >= clock]

    def close_offsets(self, since: int) -> None:
        """From now on older storages that die offset nothing, nor did those noted from position
        ``since`` of :attr:`freed` on (see :meth:`Tracker._someone_thawed`)."""
        self.offsets_open = False
        for _, ref in self.freed[since:]:
            self.older_garbage[ref.device] += ref.nbytes
        del self.freed[since:]

    # -- what a check asks ------------------------------------------------------------------------

    def created(self, device: str, *, since: int, before: int | None = None) -> list[StorageRef]:
        """Live storages on ``device`` first seen after clock ``since`` and, with ``before``,
        before that clock."""
        return [
            ref
            for ref in self.young
            if ref.born > since
            and (before is None or ref.born < before)
            and ref.device == device
            and not ref.adopted
            and ref() is not None
        ]

    def freed_older(self, device: str, *, since: int) -> int:
        """Bytes of storages older than the test (not made since its setup began) that died or
        shrank after clock ``since``: what offsets a leak."""
        freed = sum(
            ref.nbytes
            for clock, ref in self.freed
            if clock > since and ref.born < self.begin_clock and ref.device == device
        )
        return freed + sum(
            -delta
            for clock, ref, delta in self.grown
            if clock > since and delta < 0 and ref.born < self.begin_clock and ref.device == device
        )

    def grown_older(self, device: str, *, since: int) -> list[tuple[StorageRef, int]]:
        """Live storages that existed at clock ``since`` and grew in place after it, with the growth."""
        grown: dict[int, tuple[StorageRef, int]] = {}
        for clock, ref, delta in self.grown:
            if clock > since and ref.born <= since and ref.device == device and ref() is not None:
                previous = grown.get(id(ref), (ref, 0))[1]
                grown[id(ref)] = (ref, previous + delta)
        return [(ref, delta) for ref, delta in grown.values() if delta > 0]

    def is_young(self, ref: StorageRef) -> bool:
        """Whether the storage was first seen since the test began."""
        return ref.born >= self.begin_clock

    def adopt(self, refs: list[StorageRef]) -> None:
        """These storages belong to a fixture of a wider scope set up during the test: never the test's."""
        for ref in refs:
            ref.adopted = True

    def adopted_alive(self, device: str) -> list[StorageRef]:
        """Live storages on ``device`` that fixtures of a wider scope made during the current test."""
        return [ref for ref in self.young if ref.adopted and ref.device == device and ref() is not None]

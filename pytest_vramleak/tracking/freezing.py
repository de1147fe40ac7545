"""The heap frozen around a checked test, and whoever else freezes or unfreezes it noticed.

``gc.freeze()`` as a test's setup starts moves every object into a permanent generation that
collections and ``gc.get_referrers`` skip, so each observation reads only what the test made, and
garbage older than the test cannot be collected during it and pass for memory the test freed.

**Why another party's freeze or thaw cannot go unseen.** Two sentinels tell it. A young sentinel is
made right after each freeze: every scan of the unfrozen objects finds it, unless someone else
froze the heap since (a test or a conftest calling ``gc.freeze()``), and then what the test made
is frozen too and a scan of the young objects would miss it. An old sentinel is frozen with the
heap: a scan finds it only if someone unfroze the heap, and then older garbage may be collected
during the test. Either way the tracker gives freezing up (:meth:`HeapFreeze.give_up`): it indexes
the whole heap once and from then on scans every unfrozen object, and where the heap was thawed,
what older storages free offsets nothing (:meth:`~pytest_vramleak.tracking.ledger.Ledger.close_offsets`).
A heap frozen before a test begins is seen from the freeze count.
"""

from __future__ import annotations

from typing import Any

from . import gc_functions as gc
from .census import FREEZERS


class _Sentinel:
    """Made right after each freeze: a scan that does not find it means someone else froze the heap."""


class _OldSentinel:
    """Frozen with the heap as a test begins: finding it means someone else unfroze the heap."""


class HeapFreeze:
    """Freezes the heap for one owner (a tracker, which indexes young objects before a thaw)."""

    def __init__(self, owner: Any) -> None:
        self._owner = owner
        self.froze = False
        """Whether the heap is frozen by this owner now."""
        self.foreign = False
        """Someone else froze the heap: the owner freezes nothing and scans every unfrozen object."""
        self._sentinel: _Sentinel | None = None
        self._old_sentinel: _OldSentinel | None = None

    def frozen_by_others(self) -> bool:
        """Whether the heap was found frozen by someone else, for the first time, as a test begins."""
        if (
            not self.froze and not self.foreign and gc.frozen_by_anyone()
        ):  # walks the frozen list: empty (on Python 3.12, the interpreter's own) unless someone froze
            self.foreign = True
            return True
        return False

    def freeze(self) -> None:
        """Freeze the heap as a test begins, unless someone else freezes it."""
        if not self.foreign:
            self._old_sentinel = _OldSentinel()  # frozen with the heap: found again only if someone unfreezes it
            gc.freeze()
            self.froze = True
            FREEZERS.add(self._owner)
            self._sentinel = _Sentinel()

    def thaw(self) -> None:
        """The test is over: unfreeze the heap."""
        self._sentinel = self._old_sentinel = None
        FREEZERS.discard(self._owner)
        if self.froze:
            self.froze = False
            gc.unfreeze()

    def refreeze(self) -> None:
        """Freeze what is young now too."""
        gc.freeze()
        self.refrozen()

    def refrozen(self) -> None:
        """The heap was frozen again: a new young sentinel."""
        if self.froze:
            self._sentinel = _Sentinel()

    @property
    def last_freeze(self) -> object | None:
        """What stands for the latest freeze (its young sentinel): another one later means the heap
        was frozen again since, what was young then frozen with it."""
        return self._sentinel

    @property
    def watching_thaw(self) -> bool:
        return self._old_sentinel is not None

    @staticmethod
    def markers(thaw: bool) -> tuple[type, ...]:
        """The sentinel classes a scan looks for (the old one's only where ``thaw``)."""
        return (_Sentinel, _OldSentinel) if thaw else (_Sentinel,)

    def read(self, found: list[Any], thaw: bool) -> tuple[bool, bool]:
        """From the sentinels a scan found: whether someone froze the heap, and whether someone thawed it."""
        saw_sentinel = any(obj is self._sentinel for obj in found)
        thawed = thaw and any(obj is self._old_sentinel for obj in found)
        return self.froze and not saw_sentinel and not thawed, thawed

    def give_up(self, *, thawed: bool) -> None:
        """Someone else froze (or, ``thawed``, unfroze) the heap: leave freezing to them from now on."""
        FREEZERS.discard(self._owner)
        self.froze = False
        self.foreign = True
        self._sentinel = None
        if thawed:
            self._old_sentinel = None

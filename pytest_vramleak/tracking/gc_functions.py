"""gc's functions as they were when the plugin was imported, for every use the package makes of gc.

A test may replace one of gc's functions (``gc.get_referrers = ...`` left in place, or
``monkeypatch.setattr(gc, "collect", ...)`` for its own body): the census, the collections and the
holder search that check that test and the tests after it must still see the heap as it is. The
plugin is imported as pytest starts, before any conftest or test, so what is captured here is
Python's own. ``garbage`` is the list the collector itself fills, whatever ``gc.garbage`` is
later bound to. Modules import this one as ``gc``.
"""

from __future__ import annotations

import gc as _gc
import itertools
import operator
import sys
from typing import Any

DEBUG_SAVEALL = _gc.DEBUG_SAVEALL
_collect = _gc.collect
_callbacks = _gc.callbacks
"""The list the collector calls back, whatever ``gc.callbacks`` is later bound to."""


def collect(generation: int = 2) -> int:
    """``gc.collect(generation)``, with ``gc.callbacks`` set aside while it runs: a callback is
    code of the suite's (one that allocates made every later test grow with each of the plugin's
    collections), and the plugin runs none of it while it measures. Callbacks added meanwhile stay."""
    kept = list(_callbacks)
    _callbacks.clear()
    try:
        return _collect(generation)
    finally:
        added = list(_callbacks)
        _callbacks[:] = kept + [callback for callback in added if callback not in kept]


def saving_garbage() -> bool:
    """Whether ``gc.DEBUG_SAVEALL`` is on: the collector then keeps in ``gc.garbage`` what it finds
    unreachable, instead of freeing it."""
    return bool(_gc.get_debug() & DEBUG_SAVEALL)


INTERPRETER_FROZEN = min(_gc.get_freeze_count(), 10_000) if sys.version_info[:2] == (3, 12) else 0
"""Objects in the permanent generation that nobody froze: Python 3.12's collector keeps the
interpreter's immortal objects there (a few hundred tuples of its own modules, from startup on),
so its ``gc.get_freeze_count()`` is not 0 in a process that never called ``gc.freeze()``. (Where a
heap was frozen before the plugin was imported, the cap keeps that freeze from passing for them.)"""


GENERATIONAL = sys.version_info < (3, 14) and getattr(sys, "_is_gil_enabled", lambda: True)()
"""Whether the collector moves what survives generation 0 into 1, and only a collection of
generation 1 or 2 moves anything into 2: Python 3.13 and before, with the GIL (Python 3.14's
collector is incremental, and a build without the GIL has one generation)."""


def older_collections() -> tuple[int, int] | None:
    """How many collections of generations 1 and 2 the collector has run (None where it is not
    :data:`GENERATIONAL`): while neither count moves, whatever was made since sits in generations 0
    and 1."""
    if not GENERATIONAL:
        return None
    stats = _gc.get_stats()
    return stats[1]["collections"], stats[2]["collections"]


def frozen_by_anyone() -> bool:
    """Whether someone froze the heap (``gc.freeze()``) and has not unfrozen it."""
    return _gc.get_freeze_count() > INTERPRETER_FROZEN


TRAVERSES_FREED_MEMORY = (3, 12) <= sys.version_info[:3] < (3, 12, 6)
"""Whether traversing ``_asyncio`` visits freed memory: from Python 3.12.0 to 3.12.5 its module
state's traverse function visits the future iterators on its free list, and ``gc.get_referents``
of the module hands them out as live objects (CPython gh-122695): a double free, or a list that
grows until memory runs out (seen on 3.12.1 once an event loop had run). What else traverses it
(``gc.get_referrers``, the collector) only compares, and is safe."""

_get_referents = _gc.get_referents


def _referents_skipping_asyncio(*objs: Any) -> list[Any]:
    """``gc.get_referents(*objs)`` less the ``_asyncio`` module's: what it keeps in C is asyncio's
    own bookkeeping (its tasks are reached from ``asyncio.tasks``)."""
    module = sys.modules.get("_asyncio")
    if module is not None and any(map(operator.is_, objs, itertools.repeat(module))):
        objs = tuple(obj for obj in objs if obj is not module)
    return _get_referents(*objs)


disable = _gc.disable
enable = _gc.enable
freeze = _gc.freeze
garbage = _gc.garbage
get_debug = _gc.get_debug
get_freeze_count = _gc.get_freeze_count
get_objects = _gc.get_objects
get_referents = _referents_skipping_asyncio if TRAVERSES_FREED_MEMORY else _get_referents
get_referrers = _gc.get_referrers
is_tracked = _gc.is_tracked
isenabled = _gc.isenabled
set_debug = _gc.set_debug
unfreeze = _gc.unfreeze

"""Tensors that only the cycle collector frees, each named with the cycle that held it.

With ``--vramleak-strict-cycles`` a check fails memory its body left to the cycle collector. To
name what held it, one collection keeps its garbage (``gc.DEBUG_SAVEALL``) to be read, and lets it
go after; with ``keep_cycle_garbage``, every collection during the body keeps its garbage until
the body ends (:func:`save_garbage`), so that cycles collected early are named too. Garbage the
user's own debugging saves stays theirs: nothing is read from it, and nothing of it is let go.
"""

from __future__ import annotations

from ..tracking import gc_functions as gc
from ..tracking.refs import StorageRef
from ..tracking.sites import SiteRecorder
from .snapshot import TensorGroup, describe_cycle_garbage


def save_garbage() -> int | None:
    """Keep what collections free from now on; where in ``gc.garbage`` it starts (None where the
    user's own debugging already saves it)."""
    if gc.saving_garbage():
        return None
    start = len(gc.garbage)
    gc.set_debug(gc.get_debug() | gc.DEBUG_SAVEALL)
    return start


def let_go(start: int) -> None:
    """Stop keeping garbage, and let go of what was kept from ``start`` on."""
    gc.set_debug(gc.get_debug() & ~gc.DEBUG_SAVEALL)
    del gc.garbage[start:]


def cycle_garbage(pending: list[StorageRef], saving_since: int | None, sites: SiteRecorder | None) -> list[TensorGroup]:
    """What only the cycle collector frees of ``pending`` (storages the body made, alive as it
    returned), each tensor with its cycle; with ``saving_since``, everything collections saved
    since the body began, named whole (its storages died to the tracker meanwhile)."""
    flags, kept = gc.get_debug(), len(gc.garbage)
    if saving_since is not None:
        kept, flags = saving_since, flags & ~gc.DEBUG_SAVEALL
    elif flags & gc.DEBUG_SAVEALL:
        return []  # the user's own debugging saves the garbage: it is theirs to read
    gc.set_debug(flags | gc.DEBUG_SAVEALL)
    try:
        gc.collect()
    finally:
        gc.set_debug(flags)
    garbage = gc.garbage[kept:]
    del gc.garbage[kept:]  # (what the user's own debugging saved there before stays)
    try:
        keys = {(ref.device, ref.pointer) for ref in pending} if saving_since is None else None
        return describe_cycle_garbage(garbage, keys, sites=sites or SiteRecorder())
    except Exception:  # naming is an aid: the figures stand without it
        return []
    finally:
        garbage.clear()

"""Autocast regions a checked block leaves open.

``torch.autocast`` caches the low-precision cast of each weight that requires grad until the
outermost region exits (pytorch/pytorch#86136); the cast's ``grad_fn`` keeps the weight. A region
entered (``region.__enter__()``) and never exited keeps a cast, and through it the weight, of every
model run under it, held only from C++; and every later test runs under autocast. A check notes
the device types autocast is on for, in its thread, as it begins, and what it finds on as it ends
was left open.
"""

from __future__ import annotations

import os
import sys
import threading
import types
from dataclasses import dataclass
from typing import Any

from ..tracking import gc_functions as gc
from ..tracking.census import whole_heap

_DEVICE_TYPES = ("cpu", "cuda", "xpu", "mps", "hpu", "mtia", "xla")


def autocast_on() -> frozenset[str]:
    """The device types autocast is on for in this thread (none where torch is not imported)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return frozenset()
    try:
        if not torch._C._is_any_autocast_enabled():
            return frozenset()
    except AttributeError:  # (a torch without it: asked per device type below)
        pass
    found = set()
    for device_type in _DEVICE_TYPES:
        try:
            if torch.is_autocast_enabled(device_type):
                found.add(device_type)
        except (RuntimeError, TypeError, ValueError):  # a device type this build does not know
            continue
    return frozenset(found)


def describe_regions(device_types: frozenset[str]) -> str:
    """The block a check's failure shows for autocast regions it left open."""
    devices = ", ".join(sorted(device_types))
    return (
        f"autocast left on for {devices}: a torch.autocast region the test entered is still open (its __enter__() "
        "ran, its __exit__() did not). Every later test runs under it, and its cast cache keeps the low-precision "
        "cast of each weight it casts, and through the cast's grad_fn the weight itself, until the region exits: "
        "enter it with `with torch.autocast(...):`, or call its __exit__(None, None, None) when done"
    )


@dataclass(frozen=True)
class ThreadRegion:
    """An autocast region open in another thread: the thread, and the function that entered it."""

    thread: str
    thread_id: int
    function: str
    """``serve_forever() (server.py)``: the function running inside the region (for a function
    decorated with ``@torch.autocast(...)``, that function)."""
    dtype: str
    """The region's low-precision dtype (``bfloat16``), as the casts it caches have."""


def regions_in_other_threads() -> list[ThreadRegion]:
    """The autocast regions open in threads other than this one. The cast cache is per thread
    (pytorch/pytorch#86136): a region a serving thread holds open around its whole loop keeps a cast
    of every model it is given, and no other thread's exit clears it.

    An entered region's bound ``__exit__`` waits on the stack of the frame inside its ``with``
    block (a ``@torch.autocast`` decorator's frame in torch, or the user's own), where gc does not
    see it: so a region is open wherever an autocast object is referred to by its own bound
    ``__exit__``, and it is in the thread none of whose autocast is this one's, whose frames hold
    the object or name ``autocast`` in their code. Read with ``gc.get_referrers`` and frames'
    locals: no code runs."""
    torch = sys.modules.get("torch")
    autocast = getattr(getattr(torch, "amp", None), "autocast_mode", None)
    region_type = getattr(autocast, "autocast", None)
    if region_type is None or autocast_on():
        return []
    with whole_heap():  # (a frozen heap's objects are not among gc's referrers)
        # (instances of a class defined in Python refer to it)
        regions = [region for region in gc.get_referrers(region_type) if issubclass(type(region), region_type)]
        entered = _entered(regions)
    if not entered:
        return []
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    own = threading.get_ident()
    stacks = [(ident, frame) for ident, frame in sys._current_frames().items() if ident != own]
    # a region a frame holds in a local (a decorator's closure) is that frame's thread's; a region
    # only a `with` block holds is the thread's whose code names autocast, where only one is left
    found: dict[int, ThreadRegion] = {}
    claimed: list[Any] = []
    for ident, frame in stacks:
        for inside, region in _frames_holding(frame, entered, _folder(autocast)):
            found[ident] = _region_of(names.get(ident, str(ident)), ident, inside, region)
            claimed.append(region)
            break
    left = [region for region in entered if not any(region is one for one in claimed)]
    naming = [
        (ident, inside)
        for ident, frame in stacks
        if ident not in found and (inside := _frame_naming_autocast(frame)) is not None
    ]
    if len(left) == 1 and len(naming) == 1:  # (where it is not plain whose region it is, none is named)
        ident, inside = naming[0]
        found[ident] = _region_of(names.get(ident, str(ident)), ident, inside, left[0])
    return list(found.values())


def _region_of(thread: str, ident: int, frame: Any, region: Any) -> ThreadRegion:
    code = frame.f_code
    return ThreadRegion(thread, ident, f"{code.co_name}() ({os.path.basename(code.co_filename)})", _dtype_of(region))


def _entered(regions: list[Any]) -> list[Any]:
    """The regions their own bound ``__exit__`` refers to, found in one pass over the heap."""
    if not regions:
        return []
    waiting = {
        id(holder.__self__)
        for holder in gc.get_referrers(*regions)
        if type(holder) is types.MethodType and holder.__func__.__name__ == "__exit__"
    }
    return [region for region in regions if id(region) in waiting]


def _frames_holding(frame: Any, entered: list[Any], torch_folder: str) -> list[tuple[Any, Any]]:
    """The frames of a thread's stack (newest first) that hold an entered region in a local, each
    with its region: for torch's own decorator frame, the frame it runs inside the region."""
    found = []
    newer = None
    while frame is not None:
        region = next((value for value in _locals(frame) if any(value is one for one in entered)), None)
        if region is not None:
            in_torch = frame.f_code.co_filename.startswith(torch_folder)
            found.append((newer if in_torch and newer is not None else frame, region))
        newer, frame = frame, frame.f_back
    return found


def _frame_naming_autocast(frame: Any) -> Any:
    """The newest frame of a thread's stack whose code names ``autocast`` (``with torch.autocast(...)``)."""
    while frame is not None:
        if "autocast" in frame.f_code.co_names:
            return frame
        frame = frame.f_back
    return None


def _locals(frame: Any) -> list[Any]:
    try:
        return list(frame.f_locals.values())
    except Exception:  # (a frame that ended as it was read)
        return []


def _dtype_of(region: Any) -> str:
    state = getattr(region, "__dict__", None)  # (an autocast object's own dict: no code of a subclass runs)
    dtype = state.get("fast_dtype") if type(state) is dict else None
    return str(dtype).removeprefix("torch.") if dtype is not None else ""


def _folder(module: Any) -> str:
    return os.path.dirname(getattr(module, "__file__", "") or "") + os.sep

"""Autocast regions a checked block leaves open.

``torch.autocast`` caches the low-precision cast of each weight that requires grad until the
outermost region exits (pytorch/pytorch#86136); the cast's ``grad_fn`` keeps the weight. A region
entered (``region.__enter__()``) and never exited keeps a cast, and through it the weight, of every
model run under it, held only from C++; and every later test runs under autocast. A check notes
the device types autocast is on for, in its thread, as it begins, and what it finds on as it ends
was left open.
"""

from __future__ import annotations

import sys

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

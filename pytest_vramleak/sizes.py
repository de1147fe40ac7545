"""Parse and format byte sizes: ``"512 MiB"``, ``"1.5GB"``, ``300kb``, ``4096``."""

from __future__ import annotations

import re

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_SIZE = re.compile(r"^\s*(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(?P<unit>[a-zA-Z]*)\s*$")


class SizeError(ValueError):
    """A size that is not a non-negative byte count."""


def parse_size(value: object) -> int:
    """Return ``value`` as a whole number of bytes.

    Accepts a non-negative ``int`` or a string of a number and an optional unit: ``B``, SI
    (``kB``, ``MB``, ``GB``, ``TB``: powers of 1000) or IEC (``KiB``, ``MiB``, ``GiB``, ``TiB``:
    powers of 1024), in any case, with or without a space. Fractions round down to whole bytes.
    """
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise SizeError(f"expected bytes as an int or a string such as '512 MiB', got {type(value).__name__} {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise SizeError(f"size must not be negative, got {value}")
        return value
    if value.strip().startswith("-"):
        raise SizeError(f"size must not be negative, got {value!r}")
    match = _SIZE.match(value)
    if match is None:
        raise SizeError(f"cannot read {value!r} as a size; write bytes or a number with a unit, e.g. '64 KiB' or '1.5GB'")
    unit = match["unit"].lower()
    if unit not in _UNITS:
        known = ", ".join(u for u in ("B", "kB", "MB", "GB", "TB", "KiB", "MiB", "GiB", "TiB"))
        raise SizeError(f"unknown unit {match['unit']!r} in {value!r}; known units: {known}")
    return int(float(match["number"]) * _UNITS[unit])


def format_size(size: int | float) -> str:
    """Format bytes for people, in IEC units: ``0 B``, ``512 B``, ``64.0 KiB``, ``-4.0 MiB``."""
    sign = "-" if size < 0 else ""
    size = abs(size)
    if size < 1024:
        return f"{sign}{int(size)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        size /= 1024
        if size < 1024 or unit == "TiB":
            return f"{sign}{size:.1f} {unit}"
    raise AssertionError("unreachable")

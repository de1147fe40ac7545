"""Parse and format byte sizes: ``"512 MiB"``, ``"1.5GB"``, ``300kb``, ``4096``."""

from __future__ import annotations

import decimal
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
MAX_SIZE = 2**63 - 1
"""The largest size accepted, 8 EiB less one byte: the largest byte count PyTorch's allocator
statistics (64-bit signed integers) can report. A larger figure is a typing mistake, not a budget."""

_SIZE = re.compile(r"^\s*(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(?P<unit>[a-zA-Z]*)\s*$")


class SizeError(ValueError):
    """A size that is not a non-negative byte count."""


def parse_size(value: object) -> int:
    """Return ``value`` as a whole number of bytes.

    Accepts a non-negative ``int`` or a string of a number and an optional unit: ``B``, SI
    (``kB``, ``MB``, ``GB``, ``TB``: powers of 1000) or IEC (``KiB``, ``MiB``, ``GiB``, ``TiB``:
    powers of 1024), in any case, with or without a space. Fractions round down to whole bytes,
    computed exactly (``"0.1 KiB"`` is 102 bytes). Sizes above :data:`MAX_SIZE` are refused.
    """
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise SizeError(f"expected bytes as an int or a string such as '512 MiB', got {type(value).__name__} {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise SizeError(f"size must not be negative, got {_shown(value)}")
        if value > MAX_SIZE:
            raise SizeError(
                f"too large: {_shown(value)}, more than the largest size a budget can hold, {MAX_SIZE} bytes (8 EiB - 1)"
            )
        return value
    if value.strip().startswith("-"):
        raise SizeError(f"size must not be negative, got {_shown(value)}")
    match = _SIZE.match(value)
    if match is None:
        raise SizeError(
            f"cannot read {_shown(value)} as a size; write bytes or a number with a unit, e.g. '64 KiB' or '1.5GB'"
        )
    unit = match["unit"].lower()
    if unit not in _UNITS:
        known = ", ".join(u for u in ("B", "kB", "MB", "GB", "TB", "KiB", "MiB", "GiB", "TiB"))
        raise SizeError(f"unknown unit {_shown(match['unit'])} in {_shown(value)}; known units: {known}")
    number = match["number"]
    # Decimal, not float: a float loses digits past 2**53 and turns 400 digits into infinity. The
    # precision covers every digit of the number and of the unit, so the product is exact.
    with decimal.localcontext() as context:
        context.prec = len(number) + 20
        context.Emax = context.prec
        size = (decimal.Decimal(number) * _UNITS[unit]).to_integral_value(rounding=decimal.ROUND_FLOOR)
    if size > MAX_SIZE:
        raise SizeError(
            f"too large: {_shown(value)}, more than the largest size a budget can hold, {MAX_SIZE} bytes (8 EiB - 1)"
        )
    return int(size)


def _shown(value: object) -> str:
    """``value`` as an error message quotes it, cut short when it is long (a 400-digit number)."""
    if isinstance(value, int) and value.bit_length() > 128:  # Python refuses to print ints of over 4300 digits
        return f"an int of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:32]}... ({len(str(value))} characters)"


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

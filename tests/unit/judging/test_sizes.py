from __future__ import annotations

import pytest

from pytest_vramleak import SizeError, format_size, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (0, 0),
        (4096, 4096),
        ("4096", 4096),
        ("512 MiB", 512 * 1024**2),
        ("512mib", 512 * 1024**2),
        ("1.5GB", 1_500_000_000),
        ("1.5 gb", 1_500_000_000),
        ("64 KiB", 65536),
        ("300kb", 300_000),
        ("300 KB", 300_000),
        ("2 TiB", 2 * 1024**4),
        ("7B", 7),
        (" 1 MB ", 1_000_000),
        ("0.5 KiB", 512),
        (".5 KiB", 512),
    ],
)
def test_parse_size_reads_units(text: object, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (-1, "must not be negative"),
        ("-1 MiB", "must not be negative"),
        ("12 parsecs", "unknown unit 'parsecs'"),
        ("MiB", "cannot read"),
        ("", "cannot read"),
        ("1.2.3 MB", "cannot read"),
        (1.5, "got float"),
        (True, "got bool"),
        (None, "got NoneType"),
        ([1], "got list"),
    ],
)
def test_parse_size_rejects_bad_input(value: object, message: str) -> None:
    with pytest.raises(SizeError, match=message):
        parse_size(value)


@pytest.mark.parametrize(
    ("size", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (65536, "64.0 KiB"),
        (4 * 1024**2, "4.0 MiB"),
        (-4 * 1024**2, "-4.0 MiB"),
        (3 * 1024**3, "3.0 GiB"),
        (5 * 1024**5, "5120.0 TiB"),
    ],
)
def test_format_size(size: int, text: str) -> None:
    assert format_size(size) == text

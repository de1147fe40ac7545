"""Allocation sites: the function a recorded line belongs to, read from the source."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from pytest_vramleak.sites import enclosing_function, site_text

SOURCE = textwrap.dedent(
    """\
    import torch

    TABLE = torch.zeros(3)


    def outer():
        def inner():
            return torch.ones(2)

        keep = lambda: torch.ones(1)
        return inner(), keep()


    class Model:
        def forward(self):
            return torch.ones(4)
    """
)


@pytest.mark.parametrize(
    ("line", "function"),
    [(3, ""), (6, "outer"), (8, "inner"), (10, "<lambda>"), (11, "outer"), (14, ""), (16, "forward")],
)
def test_a_line_is_named_by_its_innermost_function(tmp_path: Path, line: int, function: str) -> None:
    path = tmp_path / "model.py"
    path.write_text(SOURCE)
    assert enclosing_function(str(path), line) == function


def test_a_site_without_a_function_shows_its_line_only(tmp_path: Path) -> None:
    path = tmp_path / "model.py"
    path.write_text(SOURCE)
    assert site_text((str(path), 3, "")).endswith("model.py:3")
    assert site_text((str(path), 8, "inner")).endswith("model.py:8 in inner()")


def test_a_file_that_is_gone_or_not_python_names_no_function(tmp_path: Path) -> None:
    assert enclosing_function(str(tmp_path / "missing.py"), 1) == ""
    broken = tmp_path / "broken.py"
    broken.write_text("def (:\n")
    assert enclosing_function(str(broken), 1) == ""

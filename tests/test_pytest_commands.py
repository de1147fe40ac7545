"""pytest's own commands keep working wherever the plugin is installed, with or without --vramleak."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pytest_vramleak.options import OPTIONS


@pytest.mark.parametrize(
    "args",
    [["--help"], ["--markers"], ["--fixtures"], ["--co", "-q"], ["--vramleak", "--help"], ["--vramleak", "--co", "-q"]],
    ids=" ".join,
)
def test_pytest_commands_exit_zero(pytester: pytest.Pytester, args: list[str]) -> None:
    pytester.makepyfile(test_plain="def test_a():\n    assert True\n")
    result = pytester.runpytest_subprocess(*args)
    assert result.ret == 0, result.stderr.str()
    result.stderr.no_fnmatch_line("*Traceback*")


def test_help_lists_every_option_with_its_text(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess("--help")
    assert result.ret == 0
    text = " ".join(result.stdout.str().split())
    for option in OPTIONS:
        assert option.cli in text
        assert " ".join(option.help.split()) in text  # a literal '%' is printed as it is written


def test_merge_help_exits_zero() -> None:
    result = subprocess.run([sys.executable, "-m", "pytest_vramleak", "merge", "--help"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "usage: python -m pytest_vramleak merge" in result.stdout

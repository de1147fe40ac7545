"""pytest's own commands keep working wherever the plugin is installed, with or without --vramleak."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pytest_vramleak.plugin.options import OPTIONS


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
    result = subprocess.run(
        [sys.executable, "-m", "pytest_vramleak", "merge", "--help"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert "usage: python -m pytest_vramleak merge" in result.stdout


def test_options_that_act_on_checked_tests_say_so_in_a_run_that_checks_none(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_it="def test_plain():\n    pass\n")
    pytester.makeini("[pytest]\nvramleak_confirm = 2\n")
    result = pytester.runpytest("-p", "no:cacheprovider", "--vramleak-sites=on", "--vramleak-strict-cycles")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "vramleak: no test was checked (no --vramleak, no test marked vram_budget or using the vramleak fixture): "
            "ini option vramleak_confirm, --vramleak-sites, --vramleak-strict-cycles had nothing to act on"
        ]
    )
    # where a test is checked, or nothing was asked of checks, nothing is said
    assert (
        "had nothing to act on"
        not in pytester.runpytest("-p", "no:cacheprovider", "--vramleak", "--vramleak-sites=on").stdout.str()
    )
    pytester.makeini("[pytest]\n")
    assert "had nothing to act on" not in pytester.runpytest("-p", "no:cacheprovider").stdout.str()


def test_the_references_options_table_is_the_plugins_options(pytester: pytest.Pytester) -> None:
    """Every row of the reference's options table (docs/reference.md) names an option pytest
    --help lists, with its ini name and its default, and every option has a row."""
    import re
    from pathlib import Path

    readme = (Path(__file__).parent.parent / "docs" / "reference.md").read_text()
    # (a value's choices are written with escaped bars: `--vramleak-sites=auto\|on\|off`)
    rows = re.findall(
        r"^\| `(--vramleak[a-z-]*)(?:=(?:[^|\\]|\\\|)*)?` \| `(vramleak\w*)[^|]*\| ([^|]*) \|",
        readme,
        flags=re.MULTILINE,
    )
    table = {cli: (ini, default.strip()) for cli, ini, default in rows}
    assert set(table) == {option.cli for option in OPTIONS}
    help_text = " ".join(pytester.runpytest_subprocess("--help").stdout.str().split())
    shown_defaults = {"false": "off", "": "none"}
    # defaults the plugin decides at run time, written as the reference says them
    decided = {
        "vramleak_fail_on": "`significant` unmarked, `any` marked",
        "vramleak_markdown": "`$GITHUB_STEP_SUMMARY`",
        "vramleak_release_above": "off",
    }
    wrong = []
    for option in OPTIONS:
        ini, default = table[option.cli]
        assert ini == option.ini and option.cli in help_text and f"{option.ini} (" in help_text
        expected = decided.get(option.ini, shown_defaults.get(option.default, option.default))
        if default.strip("`") != expected.strip("`"):
            wrong.append((option.cli, default, expected))
    assert wrong == []

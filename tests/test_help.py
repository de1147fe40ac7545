"""What ``pytest --help`` and ``pytest --fixtures`` say of the plugin's options and fixture."""

from __future__ import annotations

import pytest

from pytest_vramleak.plugin.options import OPTIONS


def test_help_types_each_ini_option_as_pytest_reads_it(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("-p", "no:cacheprovider", "--help")
    expected = {option.ini: "bool" if option.flag else "args" if option.repeat else "string" for option in OPTIONS}
    assert expected["vramleak"] == expected["vramleak_strict_cycles"] == "bool"
    for name, kind in expected.items():
        result.stdout.fnmatch_lines([f"  {name} ({kind}):*"])


def test_a_switchs_ini_value_pytest_cannot_read_names_the_option(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nvramleak_strict_cycles = sometimes\n")
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.stderr.fnmatch_lines(["ERROR: ini option vramleak_strict_cycles: expected true or false, got 'sometimes'"])


def test_warmup_help_covers_the_fixtures_steps_and_a_repeated_tests_runs(pytester: pytest.Pytester) -> None:
    text = " ".join(pytester.runpytest("-p", "no:cacheprovider", "--help").stdout.str().split())
    assert "--vramleak-warmup=N warm-up steps of the vramleak fixture, not measured, and warm-up runs of a test" in text
    assert "(--vramleak-repeat, a marker's repeat=), not judged (default 2)" in text


def test_fixtures_lists_steps_and_check(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("-p", "no:cacheprovider", "--fixtures")
    result.stdout.fnmatch_lines(
        [
            "vramleak -- *pytest_vramleak/plugin/__init__.py:*",
            "    Check repeated training or inference steps for memory that keeps growing.",
            "    ``for i in vramleak.steps(n, warmup=k, max_steps=m): train_step()`` runs n steps*",
            "*``vramleak.check(step, steps=10, warmup=k, max_steps=m)`` calls ``step(i)``*",
        ]
    )

"""The marker and the options: usage errors that name their source, ini twins, and what
`pytest --markers` and `pytest --fixtures` show."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    ("marker", "message"),
    [
        (
            "vram_budget(leak=-1)",
            "test_it.py::test_it: @pytest.mark.vram_budget(leak=-1): size must not be negative, got -1",
        ),
        (
            "vram_budget('12 parsecs')",
            "test_it.py::test_it: @pytest.mark.vram_budget(peak='12 parsecs'): unknown unit 'parsecs' in '12 parsecs'*",
        ),
        (
            "vram_budget(leak=1.5)",
            "test_it.py::test_it: @pytest.mark.vram_budget(leak=1.5): expected bytes as an int or a string*got float 1.5",
        ),
        (
            "vram_budget(leek=0)",
            "test_it.py::test_it: @pytest.mark.vram_budget: unknown keyword 'leek'; use peak, leak, device, repeat, reserved or pinned",
        ),
        (
            "vram_budget(1, 2)",
            "test_it.py::test_it: @pytest.mark.vram_budget takes one positional argument (peak), got 2: (1, 2)",
        ),
        (
            "vram_budget(1, peak=2)",
            "test_it.py::test_it: @pytest.mark.vram_budget: peak given both by position and by keyword",
        ),
        (
            "vram_budget(device='tpu')",
            "test_it.py::test_it: @pytest.mark.vram_budget(device='tpu'): unknown device 'tpu'*",
        ),
    ],
)
def test_bad_marker_is_a_usage_error(pytester: pytest.Pytester, marker: str, message: str) -> None:
    pytester.makepyfile(test_it=f"import pytest\n@pytest.mark.{marker}\ndef test_it():\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message.replace('[', '[[]')}"])


@pytest.mark.parametrize(
    ("args", "ini", "message"),
    [
        (["--vramleak-tolerance=lots"], "", "ERROR: --vramleak-tolerance: cannot read 'lots' as a size*"),
        (
            [],
            "vramleak_tolerance = -5 KiB",
            "ERROR: ini option vramleak_tolerance: size must not be negative, got '-5 KiB'",
        ),
        (["--vramleak-warmup=two"], "", "ERROR: --vramleak-warmup: expected a whole number of steps >= 0, got 'two'"),
        (
            [],
            "vramleak_warmup = -1",
            "ERROR: ini option vramleak_warmup: expected a whole number of steps >= 0, got '-1'",
        ),
        (
            ["--vramleak-device=gpu"],
            "",
            "ERROR: --vramleak-device: unknown device 'gpu'; expected auto|cpu|cuda|cuda:N|mps|xpu",
        ),
        ([], "vramleak_device = gpu", "ERROR: ini option vramleak_device: unknown device 'gpu'*"),
    ],
)
def test_bad_option_names_its_source(pytester: pytest.Pytester, args: list[str], ini: str, message: str) -> None:
    pytester.makeini(f"[pytest]\n{ini}\n")
    pytester.makepyfile(test_it="def test_it():\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


@pytest.mark.parametrize(
    ("option", "ini", "header"),
    [
        (
            "--vramleak-device=cpu",
            "vramleak_device = cpu",
            "vramleak: device cpu, checking every test (--vramleak), *, step warm-up 2",
        ),
        (
            "--vramleak-warmup=5",
            "vramleak_warmup = 5",
            "vramleak: device cpu, checking every test (--vramleak), *, step warm-up 5",
        ),
        (
            "--vramleak-report=r.json",
            "vramleak_report = r.json",
            "vramleak: device cpu, checking every test (--vramleak), *, step warm-up 2, report r.json",
        ),
        (
            "--vramleak-confirm=5",
            "vramleak_confirm = 5",
            "vramleak: device cpu, checking every test (--vramleak), a leaking test runs 5 more times, *",
        ),
        (
            "--vramleak-kept-floor=4MiB",
            "vramleak_kept_floor = 4MiB",
            "vramleak: * failing growth or memory kept once from 4.0 MiB *",
        ),
        (
            "--vramleak-fail-on=growth",
            "vramleak_fail_on = growth",
            "vramleak: * a leaking test runs 3 more times, failing growth only, step warm-up 2",
        ),
    ],
)
def test_each_option_has_a_working_ini_twin(pytester: pytest.Pytester, option: str, ini: str, header: str) -> None:
    pytester.makepyfile(test_it="def test_it():\n    pass\n")
    pytester.runpytest("-p", "no:cacheprovider", "--vramleak", option).stdout.fnmatch_lines([header])
    pytester.makeini(f"[pytest]\n{ini}\n")
    pytester.runpytest("-p", "no:cacheprovider", "--vramleak").stdout.fnmatch_lines([header])


def test_tolerance_ini_twin_reaches_the_fixture(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import torch

        def test_it(vramleak):
            kept = []
            for step in vramleak.steps(8):
                kept.append(torch.ones(256))
        """
    )
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(failed=1)
    pytester.runpytest("-p", "no:cacheprovider", "--vramleak-tolerance=4 KiB").assert_outcomes(passed=1)
    pytester.makeini("[pytest]\nvramleak_tolerance = 4 KiB\n")
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--vramleak-compare=nothing"],
            "ERROR: --vramleak-compare: cannot read the saved run 'nothing' at */.vramleak/nothing.json: *",
        ),
        (["--vramleak-max-increase=lots"], "ERROR: --vramleak-max-increase: cannot read 'lots' as a size*"),
        (
            ["--vramleak-max-increase=1%, 2%, 3%"],
            "ERROR: --vramleak-max-increase: expected a percentage, a size or both*",
        ),
    ],
)
def test_bad_compare_options_are_usage_errors(pytester: pytest.Pytester, args: list[str], message: str) -> None:
    pytester.makepyfile(test_it="def test_it():\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("--vramleak-max-increase=nan%",),
            "--vramleak-max-increase: the percentage must be a finite number, got 'nan%'",
        ),
        (
            ("--vramleak-max-increase=inf%",),
            "--vramleak-max-increase: the percentage must be a finite number, got 'inf%'",
        ),
        (
            ("--vramleak-device=cuda:\u00b2",),
            "--vramleak-device: unknown device 'cuda:\u00b2'; expected auto|cpu|cuda|cuda:N|mps|xpu",
        ),
        (
            ("--vramleak-save=../../x",),
            "--vramleak-save: a saved run's name is letters, digits, '_', '-' and '.' (kept in .vramleak/), got '../../x'",
        ),
        (("--vramleak-report=",), "--vramleak-report: the report's path is empty"),
        (("--vramleak-leak=lots",), "--vramleak-leak: cannot read 'lots' as a size*"),
    ],
)
def test_bad_values_are_usage_errors_naming_their_source(
    pytester: pytest.Pytester, args: tuple[str, ...], message: str
) -> None:
    pytester.makepyfile(test_it="def test_it():\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message.replace('[', '[[]')}"])
    assert not (pytester.path.parent / "x.json").exists() and not (pytester.path / ".vramleak").exists()


def test_a_bad_switch_in_the_ini_file_names_its_key(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nvramleak = maybe\n")
    pytester.makepyfile(test_it="def test_it():\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: ini option vramleak: expected true or false, got 'maybe'"])


def test_markers_and_fixture_are_documented(pytester: pytest.Pytester) -> None:
    pytester.runpytest("--markers").stdout.fnmatch_lines(
        [
            "@pytest.mark.vram_budget(peak=None, *, leak=0, device=None, repeat=None, reserved=None, pinned=None): *",
            "@pytest.mark.allow_vram_leak: *",
        ]
    )
    pytester.makepyfile(test_it="def test_it():\n    pass\n")
    pytester.runpytest("--fixtures").stdout.fnmatch_lines(
        ["vramleak -- *", "    Check repeated training or inference steps*"]
    )


def test_the_header_says_what_auto_will_be_where_torch_is_not_imported_yet(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_it="def test_it():\n    pass\n")
    # (a process of its own: this one imported torch long ago)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(
        ["vramleak: device auto (the current accelerator, else cpu, as the first checked test runs), checking *"]
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--vramleak")
    result.stdout.fnmatch_lines(["vramleak: device cpu, checking every test (--vramleak), *"])

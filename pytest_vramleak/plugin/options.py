"""The plugin's options: what each means, its ini twin, and how its value is read and checked.

Plain logic, without pytest: :func:`read_settings` takes a function that returns an option's
value and where it came from (``--vramleak-device`` or ``ini option vramleak_device``), and a
bad value raises :class:`OptionError` naming that source.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..judging.sizes import SizeError, parse_size
from ..judging.verdict import Increase, parse_increase
from ..judging.words import FAIL_ON, KEPT_FLOOR, KEPT_FLOOR_TEXT, FailOn
from ..meters.release import PercentError, parse_percent
from ..reporting.report import output_problem
from ..reporting.schemas import first_problem

DEFAULT_WARMUP = 2
DEFAULT_CONFIRM = 3
DEVICE_SPECS = "auto|cpu|cuda|cuda:N|mps|xpu"


@dataclass(frozen=True)
class Option:
    """One setting: ``--vramleak-x`` on the command line, ``vramleak_x`` in the ini file."""

    ini: str
    help: str
    default: str
    flag: bool = False
    """A switch without a value on the command line (``--vramleak``), true or false in the ini file."""
    metavar: str | None = None
    repeat: bool = False
    """Given several times on the command line, or as several words in the ini file."""

    @property
    def cli(self) -> str:
        return "--" + self.ini.replace("_", "-")

    @property
    def ini_type(self) -> str:
        """The ini option's type, as ``pytest --help`` prints it: ``bool`` for a switch, ``args``
        for several words, else ``string`` (read and checked here, naming the option)."""
        return "bool" if self.flag else "args" if self.repeat else "string"

    @property
    def ini_default(self) -> str | bool | list[str]:
        """The ini option's value where the ini file does not set it, of its :attr:`ini_type`."""
        return self.default.strip().lower() in _TRUE if self.flag else [] if self.repeat else self.default

    @property
    def cli_help(self) -> str:
        """The help text as argparse wants it: argparse formats command-line help with ``%``
        (``%(default)s``), so a literal ``%`` is written ``%%``; ini help is printed as it is."""
        return self.help.replace("%", "%%")


OPTIONS = (
    Option("vramleak", "check every test for leaked tensor memory, as if marked vram_budget()", "false", flag=True),
    Option(
        "vramleak_device",
        f"device to measure: {DEVICE_SPECS} (default auto: the current accelerator, else cpu)",
        "auto",
        metavar="DEVICE",
    ),
    Option(
        "vramleak_leak",
        "leak budget of tests that --vramleak checks and that carry no vram_budget marker of their own, e.g. '64 B' (default 0)",
        "0",
        metavar="SIZE",
    ),
    Option(
        "vramleak_report",
        "write a report of every checked test to this path: HTML when it ends in .html or .htm, else JSON (repeat for both)",
        "",
        metavar="PATH",
        repeat=True,
    ),
    Option(
        "vramleak_warmup",
        f"warm-up steps of the vramleak fixture, not measured, and warm-up runs of a test run N times (--vramleak-repeat, "
        f"a marker's repeat=), not judged (default {DEFAULT_WARMUP})",
        str(DEFAULT_WARMUP),
        metavar="N",
    ),
    Option(
        "vramleak_tolerance",
        "growth across measured steps that is not yet a leak, e.g. '64 KiB' (default 0)",
        "0",
        metavar="SIZE",
    ),
    Option(
        "vramleak_repeat",
        "run each checked test N times (warm-up runs first) and classify what it left: grows, kept_once or settled (default 1: once)",
        "1",
        metavar="N",
    ),
    Option(
        "vramleak_confirm",
        f"run each test found over its leak budget N more times, to tell memory that grows from memory kept once and to record "
        f"where its tensors are made (default {DEFAULT_CONFIRM}; 0: never)",
        str(DEFAULT_CONFIRM),
        metavar="N",
    ),
    Option(
        "vramleak_fail_on",
        "which leaks fail a test: significant (memory that grows when the test runs again, or memory kept once of at least "
        "--vramleak-kept-floor; the default for tests without a vram_budget marker), growth (only growth), or any (everything "
        "past the budget on the first run, kept once or not, memory held by PyTorch in C++ too; the default for marked tests)",
        "",
        metavar="significant|growth|any",
    ),
    Option(
        "vramleak_kept_floor",
        f"memory a test keeps once (not growing) fails it from this size on, under --vramleak-fail-on=significant (default {KEPT_FLOOR_TEXT})",
        KEPT_FLOOR_TEXT,
        metavar="SIZE",
    ),
    Option(
        "vramleak_sites",
        "record where leaked tensors were allocated: auto (in step checks), on (in every checked test too, slower) or off (default auto)",
        "auto",
        metavar="auto|on|off",
    ),
    Option(
        "vramleak_peaks",
        "measure the peak of every checked test on CPU too (accelerators measure it always)",
        "false",
        flag=True,
    ),
    Option(
        "vramleak_strict_cycles",
        "fail tests whose tensors lived on reference cycles until garbage collection",
        "false",
        flag=True,
    ),
    Option("vramleak_pin_workers", "give each pytest-xdist worker its own GPU, by worker number", "false", flag=True),
    Option(
        "vramleak_trace",
        "record the CUDA allocator's history while checked tests run; save a snapshot per leaking test",
        "false",
        flag=True,
    ),
    Option(
        "vramleak_markdown",
        "write a Markdown summary for a CI job page to this path (default: append to $GITHUB_STEP_SUMMARY when set)",
        "",
        metavar="PATH",
    ),
    Option(
        "vramleak_benchmark_json",
        "write each checked test's peak and leaked bytes to this path as benchmark-tracking CI actions chart them ({name, unit, value})",
        "",
        metavar="PATH",
    ),
    Option(
        "vramleak_save",
        "save each checked test's peak and end figures under this name (in .vramleak/ under the root folder)",
        "",
        metavar="NAME",
    ),
    Option(
        "vramleak_compare",
        "compare each checked test's peak with the run saved under this name; fail growth past --vramleak-max-increase",
        "",
        metavar="NAME",
    ),
    Option(
        "vramleak_max_increase",
        "growth over the compared run that fails a test only past both limits, e.g. '10%, 1 MiB' (default '10%, 64 KiB')",
        "10%, 64 KiB",
        metavar="LIMITS",
    ),
    Option(
        "vramleak_release_above",
        "between tests, empty the CUDA caching allocator when its reserved memory passes this share of a device, e.g. 80%",
        "",
        metavar="PERCENT",
    ),
)


class OptionError(ValueError):
    """A setting's value cannot work; the message names where it came from."""


@dataclass(frozen=True)
class Settings:
    """The effective options, command line first, then ini."""

    every_test: bool
    device: str
    report_paths: tuple[str, ...]
    """Where to write reports: HTML for ``.html``/``.htm``, JSON otherwise."""
    warmup: int
    tolerance: int
    sites: str = "auto"
    release_above: float | None = None
    strict_cycles: bool = False
    trace: bool = False
    save: str | None = None
    compare: dict[str, dict[str, Any]] | None = None
    """The saved run's figures by test id, when comparing."""
    max_increase: Increase = Increase()
    default_leak: int = 0
    """The leak budget of tests checked by ``--vramleak`` alone."""
    markdown: str = ""
    pin_workers: bool = False
    repeat: int = 1
    """Runs of each checked test (``--vramleak-repeat``); a marker's ``repeat=`` wins."""
    confirm: int = DEFAULT_CONFIRM
    """Re-runs of a test found over its leak budget, to classify it (``--vramleak-confirm``)."""
    fail_on: FailOn | None = None
    """``significant``, ``growth`` or ``any``; None: ``significant`` for tests without a marker,
    ``any`` for tests with one."""
    kept_floor: int = KEPT_FLOOR
    """``significant``: memory kept once fails from this many bytes on."""
    peaks: bool = False
    """Measure every checked test's CPU peak (torch's profiler around each test body)."""
    benchmark_json: str = ""
    """Where to write the figures for benchmark-tracking CI actions (``--vramleak-benchmark-json``)."""


Getter = Callable[[str], tuple[Any, str]]
"""An option's value (command line first, then ini) and where it came from."""

_TRUE = ("true", "yes", "on", "1", "y", "t")
_FALSE = ("false", "no", "off", "0", "n", "f", "")


def _naming_bad_switches(get: Getter) -> Getter:
    """``get``, where a switch's ini value that pytest cannot read as true or false (it reads
    ``bool`` ini options itself, raising a usage error from a ValueError that names no option) is
    an :class:`OptionError` naming the option."""

    def reading(name: str) -> tuple[Any, str]:
        try:
            return get(name)
        except Exception as error:
            if not isinstance(error.__cause__ or error, ValueError):
                raise
            bad = re.search(r"'(.*)'", str(error))
            got = repr(bad.group(1)) if bad else str(error)
            raise OptionError(f"ini option {name}: expected true or false, got {got}") from None

    return reading


def _switch(get: Getter, name: str) -> bool:
    value, source = get(name)
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise OptionError(f"{source}: expected true or false, got {value!r}")


def check_device_spec(spec: str) -> str:
    """``spec`` lowered, or ValueError: ``auto``, ``cpu``, ``cuda``, ``cuda:N``, ``mps``, ``xpu``, ``xpu:N``."""
    spec = spec.strip().lower()
    if spec in ("auto", "cpu", "mps", "xpu", "cuda") or re.fullmatch(r"(cuda|xpu):[0-9]+", spec):
        return spec
    raise ValueError(f"unknown device {spec!r}; expected {DEVICE_SPECS}")


_SAVE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


CHECK_ONLY = (
    "vramleak_leak",
    "vramleak_repeat",
    "vramleak_confirm",
    "vramleak_fail_on",
    "vramleak_kept_floor",
    "vramleak_sites",
    "vramleak_peaks",
    "vramleak_strict_cycles",
    "vramleak_trace",
    "vramleak_save",
    "vramleak_compare",
    "vramleak_max_increase",
)
"""Options that act on whole-test checks only: a run that checks no test says they did nothing."""


def saved_run_path(rootpath: Path, name: str) -> Path:
    """Where the run saved as ``name`` lives: ``.vramleak/NAME.json`` under the root folder."""
    return rootpath / ".vramleak" / f"{name}.json"


def _save_name(value: Any, source: str) -> str | None:
    name = str(value or "").strip()
    if not name:
        return None
    if not _SAVE_NAME.fullmatch(name):
        raise OptionError(
            f"{source}: a saved run's name is letters, digits, '_', '-' and '.' (kept in .vramleak/), got {value!r}"
        )
    return name


def read_settings(
    get: Getter,
    rootpath: Path,
    environ: Mapping[str, str] | None = None,
    other_outputs: Sequence[tuple[str, str]] = (),
) -> Settings:
    """Read and check every option; a bad value raises :class:`OptionError` naming its source.

    ``environ`` (``os.environ`` by default) gives ``$GITHUB_STEP_SUMMARY``. ``other_outputs`` are
    the files pytest and its other plugins write, each as the option that names it was given, and
    its path (``("--junitxml=r.xml", "r.xml")``): no output of the plugin may be one of them.
    """
    environ = os.environ if environ is None else environ
    get = _naming_bad_switches(get)
    every_test = _switch(get, "vramleak")
    device, source = get("vramleak_device")
    try:
        device = check_device_spec(str(device))
    except ValueError as error:
        raise OptionError(f"{source}: {error}") from None
    report_paths = _report_paths(get)
    warmup_text, source = get("vramleak_warmup")
    try:
        warmup = int(str(warmup_text).strip())
        if warmup < 0:
            raise ValueError
    except ValueError:
        raise OptionError(f"{source}: expected a whole number of steps >= 0, got {warmup_text!r}") from None
    repeat = _count(get, "vramleak_repeat", minimum=1, what="runs")
    confirm = _count(get, "vramleak_confirm", minimum=0, what="re-runs")
    if 1 < repeat < warmup + 2:
        raise OptionError(
            f"{get('vramleak_repeat')[1]}: {repeat} runs leave {max(0, repeat - warmup)} measured after {warmup} warm-up runs; "
            f"at least 2 are needed: use {warmup + 2} or more, or a shorter --vramleak-warmup"
        )
    if confirm == 1:
        raise OptionError(
            f"{get('vramleak_confirm')[1]}: at least 2 re-runs are needed to tell growth from memory kept once, got 1"
        )
    fail_on_text, source = get("vramleak_fail_on")
    fail_on = _fail_on(fail_on_text, source)
    if fail_on in ("growth", "significant") and confirm == 0 and repeat == 1:
        raise OptionError(
            f"{source}={fail_on} tells growth from memory kept once by running a leaking test again, and "
            f"{get('vramleak_confirm')[1]}=0 runs none again: drop one of them, or use --vramleak-repeat=N"
        )
    sizes = {}
    for name in ("vramleak_tolerance", "vramleak_leak", "vramleak_kept_floor"):
        text, source = get(name)
        try:
            sizes[name] = parse_size(str(text))
        except SizeError as error:
            raise OptionError(f"{source}: {error}") from None
    sites_text, source = get("vramleak_sites")
    sites = str(sites_text).strip().lower()
    if sites not in ("auto", "on", "off"):
        raise OptionError(f"{source}: expected auto, on or off, got {sites_text!r}")
    release_text, source = get("vramleak_release_above")
    try:
        release_above = parse_percent(release_text) if str(release_text).strip() else None
    except PercentError as error:
        raise OptionError(f"{source}: {error}") from None
    save_value, source = get("vramleak_save")
    save = _save_name(save_value, source)
    if save:
        path = saved_run_path(rootpath, save)
        problem = output_problem(path)
        if problem:
            raise OptionError(f"{source}: cannot save the run to {path}: {problem}")
    compare_value, source = get("vramleak_compare")
    compare_name = _save_name(compare_value, source)
    compare = None
    if compare_name:
        compare = read_saved_run(saved_run_path(rootpath, compare_name), compare_name, source)
    increase_text, source = get("vramleak_max_increase")
    try:
        max_increase = parse_increase(increase_text)
    except (ValueError, SizeError) as error:
        raise OptionError(f"{source}: {error}") from None
    if not math.isfinite(max_increase.fraction):
        raise OptionError(f"{source}: the percentage must be a finite number, got {increase_text!r}")
    markdown = _output_path(get, "vramleak_markdown")
    summary = environ.get("GITHUB_STEP_SUMMARY", "")
    if not markdown and summary:
        # Other steps of a CI job append there too: the summary is appended, never replaced.
        problem = output_problem(summary, append=True)
        if problem:
            raise OptionError(f"$GITHUB_STEP_SUMMARY: cannot append the Markdown summary to {summary}: {problem}")
    settings = Settings(
        every_test=every_test,
        device=device,
        report_paths=tuple(report_paths),
        warmup=warmup,
        tolerance=sizes["vramleak_tolerance"],
        sites=sites,
        release_above=release_above,
        strict_cycles=_switch(get, "vramleak_strict_cycles"),
        trace=_switch(get, "vramleak_trace"),
        save=save,
        compare=compare,
        max_increase=max_increase,
        default_leak=sizes["vramleak_leak"],
        markdown=markdown,
        pin_workers=_switch(get, "vramleak_pin_workers"),
        repeat=repeat,
        confirm=confirm,
        fail_on=fail_on,
        kept_floor=sizes["vramleak_kept_floor"],
        peaks=_switch(get, "vramleak_peaks"),
        benchmark_json=_output_path(get, "vramleak_benchmark_json"),
    )
    outputs = _outputs(settings, get, rootpath, summary)
    no_shared_output([*outputs, *other_outputs])
    return settings


def _report_paths(get: Getter) -> list[str]:
    reports, source = get("vramleak_report")
    report_paths = []
    for report in reports or ():
        if not str(report).strip():
            raise OptionError(f"{source}: the report's path is empty")
        problem = output_problem(str(report))
        if problem:
            raise OptionError(f"{source}: cannot write a report to {report}: {problem}")
        report_paths.append(str(report))
    return report_paths


def _outputs(settings: Settings, get: Getter, rootpath: Path, summary: str) -> list[tuple[str, str]]:
    """Every file the run writes: the option that names it, as given, and its path."""
    source = get("vramleak_report")[1]
    outputs = [(f"{source}={path}", path) for path in settings.report_paths]
    if settings.markdown:
        outputs.append((f"{get('vramleak_markdown')[1]}={settings.markdown}", settings.markdown))
    elif summary:
        outputs.append((f"$GITHUB_STEP_SUMMARY={summary}", summary))
    if settings.benchmark_json:
        outputs.append((f"{get('vramleak_benchmark_json')[1]}={settings.benchmark_json}", settings.benchmark_json))
    if settings.save:
        path = str(saved_run_path(rootpath, settings.save))
        outputs.append((f"{get('vramleak_save')[1]}={settings.save} (saved to {path})", path))
    return outputs


def no_shared_output(outputs: Sequence[tuple[str, str]]) -> None:
    """An :class:`OptionError` where two of ``outputs`` (each the option as given, ``--junitxml=r.xml``,
    and the path) name one file, compared where their paths lead (relative or absolute, ``./x`` or
    ``x``, through symbolic links): the one written last would replace the other."""
    seen: dict[str, str] = {}
    for given, path in outputs:
        try:
            real = os.path.realpath(path)
        except (OSError, ValueError):  # (a NUL byte in the path: its own check names it)
            real = os.path.abspath(path)
        if real in seen:
            raise OptionError(
                f"{seen[real]} and {given} name the same file: "
                "the one written last would replace the other; give each its own path"
            )
        seen[real] = given


def read_saved_run(path: Path, name: str, source: str) -> dict[str, dict[str, Any]]:
    """The figures by test id of the run saved as ``name`` at ``path``, checked whole against its
    schema; :class:`OptionError` names the option (``source``), the file and its first problem."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise OptionError(
            f"{source}: cannot read the saved run {name!r} at {path}: {error.strerror or error}"
        ) from None
    except ValueError as error:
        raise OptionError(f"{source}: cannot read the saved run {name!r} at {path}: not JSON: {error}") from None
    if isinstance(document, dict) and document.get("version") not in (SAVED_RUN_VERSION, None):
        raise OptionError(
            f"{source}: the saved run {name!r} at {path} has format version {document['version']!r}; "
            f"this pytest-vramleak reads version {SAVED_RUN_VERSION}: save the run again"
        )
    problem = first_problem(document, "saved-run")
    if problem:
        raise OptionError(f"{source}: the saved run {name!r} at {path} is not a saved run: {problem}")
    tests: dict[str, dict[str, Any]] = document["tests"]
    return tests


SAVED_RUN_VERSION = 1


def _output_path(get: Getter, name: str) -> str:
    value, source = get(name)
    path = str(value or "").strip()
    if path:
        problem = output_problem(path)
        if problem:
            raise OptionError(f"{source}: cannot write to {path}: {problem}")
    return path


def _count(get: Getter, name: str, *, minimum: int, what: str) -> int:
    text, source = get(name)
    try:
        value = int(str(text).strip())
        if value < minimum:
            raise ValueError
    except ValueError:
        raise OptionError(f"{source}: expected a whole number of {what} >= {minimum}, got {text!r}") from None
    return value


def _fail_on(text: Any, source: str) -> FailOn | None:
    """The rule an option's text names (None where it is empty), or an error naming its source."""
    given = str(text or "").strip().lower()
    for word in FAIL_ON:
        if word == given:
            return word
    if given:
        raise OptionError(f"{source}: expected significant, growth or any, got {text!r}")
    return None

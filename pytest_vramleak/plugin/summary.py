"""The *vramleak summary* at the end of a run: the tests that leaked most, what tests keep once,
fixtures and older tensors that kept memory, and lines worth reading. Plain text, from the JSON
records of the run (so a pytest-xdist controller renders its workers' results the same way)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from ..judging.repeats import RUNS_NOT_USED
from ..judging.sizes import format_size
from ..meters.devices import DeviceUnavailable, resolve_device
from ..reporting.outcomes import headline
from ..reporting.report import leaked_figure
from ..tracking.torch_api import version_notes
from .options import CHECK_ONLY, OPTIONS, Settings
from .state import MARKER, import_torch

SHOWN = 5
"""Tests listed under each heading of the summary, unless ``-vv`` lists them all."""

MAX_CHAINS = 3
"""Holder chains shown per test or fixture."""

CYCLE_NOTE_BYTES = 1024**2
"""Memory left to the cycle collector that the summary mentions without -v."""


def _same(nodeid: str) -> str:
    return nodeid


def summary_lines(
    results: Sequence[dict[str, Any]],
    *,
    fixtures: Sequence[dict[str, Any]] = (),
    between_checks: Sequence[dict[str, Any]] = (),
    releases: tuple[int, int] = (0, 0),
    verbosity: int = 0,
    shown_id: Callable[[str], str] = _same,
) -> list[str]:
    """Every line of the summary (none where there is nothing to say). ``shown_id`` turns a test
    id into the one printed: relative to where pytest was invoked, so it can be pasted back."""
    lines = [headline(results)] if results else []
    lines += offenders(results, verbosity, shown_id)
    count, released = releases
    if count:
        lines.append(
            f"released the CUDA caching allocator's cache {count} times between tests, "
            f"{format_size(released)} in all (--vramleak-release-above)"
        )
    for leftover in fixtures:
        lines.append(
            f"fixture {leftover['fixture']!r} ({leftover['scope']} scope, {leftover['where']}"
            + (f", worker {leftover['worker']}" if leftover.get("worker") else "")
            + ") still holds "
            f"{format_size(leftover['bytes'])} it allocated, after its teardown"
        )
        lines += _chain_lines(leftover.get("held_by", []), "    ")
        lines += [f"    diagnosis: {finding}" for finding in leftover.get("diagnoses", [])]
    for finding in between_checks:
        from ..tracking.watches import COMPARED_PER_CHECK  # (loaded where a check ran)

        worker = f" (worker {finding['worker']})" if finding.get("worker") else ""
        lines.append(
            f"older tensors grew in place or were given gradients, {format_size(finding['bytes'])} on {finding['device']}, "
            f"during {finding['where']}{worker} (this process holds over {COMPARED_PER_CHECK:,} storages or leaves: checks "
            "compare their sizes and gradients between tests, and watch each backward pass, so no test is charged)"
        )
        lines += _chain_lines(finding.get("held_by", []), "    ")
    for result in results:
        lines += [f"{shown_id(result['nodeid'])}: {note}" for note in _notes_shown(result)]
    # Memory a reference cycle kept until collection is worth a line when it is large; with -v, always.
    least = 1 if verbosity > 0 else CYCLE_NOTE_BYTES
    # (a test failing --vramleak-strict-cycles says it in its failure)
    cycles = sorted(
        (r for r in results if (r.get("cycle_bytes") or 0) >= least and r.get("verdict") == "passed"),
        key=lambda r: -r["cycle_bytes"],
    )
    shown = None if verbosity > 1 else SHOWN
    for result in cycles[:shown]:
        lines.append(
            f"{shown_id(result['nodeid'])}: {format_size(result['cycle_bytes'])} lived in reference cycles until garbage "
            "collection (not a leak; on a GPU it raises the peak until collected)"
        )
    lines += left_out(
        len(cycles),
        shown,
        ("test left tensors to the cycle collector", "tests left tensors to the cycle collector"),
        indent="",
    )
    if cycles:
        lines.append(f"    ({CYCLES_NAMED_BY})")
    return lines


CYCLES_NAMED_BY = (
    "--vramleak-strict-cycles fails such a test, and names each cycle, what on it held the tensors and where they "
    "were made"
)


def _notes_shown(result: dict[str, Any]) -> list[str]:
    """A test's notes worth a line of the summary: where a step check's memory settled, why a step
    check could not decide, and why the runs after its first were not used (a test that failed
    says so in its failure)."""
    notes = result.get("notes", [])
    shown = [note for note in notes if "settled" in note] if result.get("settled_after_step") is not None else []
    # a step check that could not tell growth from noise passes the test unjudged: say so
    shown += [note for note in [result.get("reason") or "", *notes] if note.startswith("undecided: ")]
    if result.get("verdict") not in ("leaked", "over_budget"):
        shown += [note for note in notes if note.startswith(RUNS_NOT_USED)]
    elif result.get("outcome") == "xpassed":
        # pytest's xfail marker decides what a failure of this test means: the leak is not made one
        shown.append(
            f"{'leaked' if result['verdict'] == 'leaked' else 'went over budget'}, and pytest counts it XPASS: "
            "a test marked xfail that passes is not failed for a leak (its holders are in the JSON and HTML reports)"
        )
    return shown


def left_out(count: int, shown: int | None, what: tuple[str, str], *, indent: str = "  ") -> list[str]:
    """The line that closes a list cut at ``shown`` entries: how many it left out (``what``: the
    words for one and for several), and how to see them."""
    if shown is None or count <= shown:
        return []
    rest = count - shown
    return [f"{indent}... and {rest} more {what[0] if rest == 1 else what[1]} (-vv lists them all)"]


def offenders(results: Sequence[dict[str, Any]], verbosity: int, shown_id: Callable[[str], str] = _same) -> list[str]:
    """The tests that leaked most, and with ``-v`` the highest peaks: five of each, all with ``-vv``."""
    shown = None if verbosity > 1 else SHOWN
    lines = _largest_leaks(results, shown, shown_id) + _kept_once(results, shown, shown_id)
    if verbosity > 0:
        lines += _highest_peaks(results, shown, shown_id)
    return lines


def _largest_leaks(results: Sequence[dict[str, Any]], shown: int | None, shown_id: Callable[[str], str]) -> list[str]:
    """The tests that leaked, the largest leak first (nothing where none leaked)."""
    leaks = sorted(
        (r for r in results if r["verdict"] == "leaked" and leaked_figure(r)), key=lambda r: -leaked_figure(r)
    )
    if not leaks:
        return []
    lines = ["largest leaks:"]
    lines += [
        f"  {format_size(leaked_figure(r)):>10}  {shown_id(r['nodeid'])} ({_leak_kind(r)})" for r in leaks[:shown]
    ]
    return lines + left_out(len(leaks), shown, ("test that leaked", "tests that leaked"))


def _kept_once(results: Sequence[dict[str, Any]], shown: int | None, shown_id: Callable[[str], str]) -> list[str]:
    """The tests that kept memory once without failing, the most first, with what holds it."""
    # (what the other runs' figures set aside as PyTorch's or pytest's leaves some with nothing to show)
    kept = [
        r
        for r in results
        if r["verdict"] != "leaked"
        and r.get("pattern") in ("kept_once", "settled")
        and (r.get("leaked_bytes") or _history_nodes(r))
    ]
    if not kept:
        return []
    lines = [f"memory kept once, not growing (passed: {_why_kept_passes(results)}):"]
    for r in sorted(kept, key=lambda r: -(r.get("leaked_bytes") or 0))[:shown]:
        nodes = _history_nodes(r)
        history = f", autograd history of {nodes} nodes" if nodes else ""
        lines.append(
            f"  {format_size(r.get('leaked_bytes') or 0):>10}  {shown_id(r['nodeid'])} ({_leak_kind(r)}{history})"
        )
        lines += _holder_lines(r)
    return lines + left_out(len(kept), shown, ("test that kept memory once", "tests that kept memory once"))


def _holder_lines(result: dict[str, Any]) -> list[str]:
    """The first :data:`MAX_CHAINS` holder chains of a test's tensors, and how many more there are."""
    return _chain_lines([chain for group in result.get("tensors", []) for chain in group.get("held_by", [])], " " * 14)


def _chain_lines(chains: Sequence[str], indent: str) -> list[str]:
    """The first :data:`MAX_CHAINS` of ``chains``, each on a line, and how many more there are."""
    lines = [f"{indent}held by {chain}" for chain in chains[:MAX_CHAINS]]
    if len(chains) > MAX_CHAINS:
        rest = len(chains) - MAX_CHAINS
        lines.append(
            f"{indent}... and {rest} more holder{'' if rest == 1 else 's'} (the JSON and HTML reports list them all)"
        )
    return lines


def _highest_peaks(results: Sequence[dict[str, Any]], shown: int | None, shown_id: Callable[[str], str]) -> list[str]:
    """The tests with the highest peaks above their baseline (nothing where none has a peak)."""
    peaks = sorted((r for r in results if r.get("peak_bytes")), key=lambda r: -r["peak_bytes"])
    if not peaks:
        return []
    lines = ["highest peaks above baseline:"]
    lines += [f"  {format_size(r['peak_bytes']):>10}  {shown_id(r['nodeid'])} ({r['device']})" for r in peaks[:shown]]
    return lines + left_out(len(peaks), shown, ("test with a peak", "tests with a peak"))


def _history_nodes(result: dict[str, Any]) -> int:
    return int((result.get("details") or {}).get("history_nodes") or 0)


def _why_kept_passes(results: Sequence[dict[str, Any]]) -> str:
    rules = {
        r.get("rule") for r in results if r.get("pattern") in ("kept_once", "settled") and r["verdict"] != "leaked"
    }
    if rules == {"growth"}:
        return "--vramleak-fail-on=growth"
    return "below --vramleak-kept-floor" if rules <= {"significant"} else "their rule"


def _leak_kind(result: dict[str, Any]) -> str:
    """``cpu``, ``cpu, grew across steps``, ``cpu, kept once`` ...: the device and the leak's pattern."""
    if result.get("pattern"):
        return f"{result['device']}, {result['pattern'].replace('_', ' ')}"
    return f"{result['device']}, grew across steps" if not result.get("leaked_bytes") else str(result["device"])


def header_settings(settings: Settings) -> str:
    """The effective device and settings, e.g. ``device cpu, checking every test (--vramleak), step warm-up 2``."""
    scope = "every test (--vramleak)" if settings.every_test else f"tests marked {MARKER}"
    # Importing torch takes seconds: a run that only has the plugin installed is not made to pay
    # them to say which device. A run that checks every test, or writes reports, imports it anyway,
    # and its header then names the device its reports name.
    torch = sys.modules.get("torch")
    if (
        torch is None
        and settings.device == "auto"
        and (settings.every_test or settings.report_paths or settings.markdown)
    ):
        torch = import_torch()
    try:
        device = resolve_device(settings.device, torch) if torch is not None else _unresolved(settings.device)
    except (DeviceUnavailable, ValueError) as error:
        device = f"{settings.device} ({error})"
    report = f", report {', '.join(settings.report_paths)}" if settings.report_paths else ""
    return f"device {device}, checking {scope}, {rule_text(settings)}, step warm-up {settings.warmup}{report}"


def _unresolved(device: str) -> str:
    """The device setting where torch is not imported yet (``auto`` says what it will be)."""
    return "auto (the current accelerator, else cpu, as the first checked test runs)" if device == "auto" else device


def header_notes(settings: Settings) -> list[str]:
    """The header's lines on this torch, one each: a release newer than the newest tested, a feature the
    device in use needs that this torch lacks (see :func:`~pytest_vramleak.tracking.torch_api.version_notes`)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return []
    try:
        device = resolve_device(settings.device, torch)
    except (DeviceUnavailable, ValueError):
        device = "cpu"
    return [f"vramleak: {note}" for note in version_notes(torch, device)]


def rule_text(settings: Settings) -> str:
    """How leaks fail tests, in a few words for the header."""
    runs = f"a leaking test runs {settings.confirm} more times" if settings.confirm else "tests run once"
    if settings.repeat > 1:
        runs = f"each test runs {settings.repeat} times"
    floor = format_size(settings.kept_floor)
    rules = {
        "significant": f"failing growth or memory kept once from {floor}",
        "growth": "failing growth only",
        "any": "failing any leak past the budget",
    }
    if settings.fail_on is not None:
        return f"{runs}, {rules[settings.fail_on]}"
    return f"{runs}, failing growth or memory kept once from {floor} (marked tests: any leak past their budget)"


def latest(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per test, the last reported: a test run again (a rerun plugin, a crashed xdist
    worker's test run elsewhere) is listed once."""
    return list({result["nodeid"]: result for result in results}.values())


def idle_options(config: pytest.Config, ran: bool, results: list[dict[str, Any]]) -> list[str]:
    """The options given that act on checked tests only, in a run that ran tests and checked none."""
    given = [
        "--" + option.ini.replace("_", "-") if config.getoption(option.ini) is not None else f"ini option {option.ini}"
        for option in OPTIONS
        if option.ini in CHECK_ONLY
        and (config.getoption(option.ini) is not None or config.getini(option.ini) != option.ini_default)
    ]
    if not given or not ran or any(result["verdict"] != "unchecked" for result in results):
        return []
    return given


def status_word(word: str) -> Any:
    """The verbose word of a failed test (``LEAKED``), in red where pytest's short summary takes a
    word with its markup (newer pytest); before, the summary would print the pair itself."""
    return (word, {"red": True}) if hasattr(pytest.TestReport, "_get_verbose_word_with_markup") else word

"""Rendering results: the failure text people read and the JSON report CI reads."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from ..judging.sizes import format_size
from ..judging.words import StepVerdict, Verdict
from .outcomes import headline, verdict_of

REPORT_VERSION = 2
MAX_GROUPS_SHOWN = 10
HOLDERS_SAMPLED = 3
"""Tensors of a group whose holders are searched for: the rest are alike in dtype, shape and
device, and a search for each of 10^5 such tensors would cost minutes and name the same holder."""


def is_html_path(path: str) -> bool:
    """Whether a report path asks for the HTML page (``.html`` or ``.htm``) rather than JSON."""
    return path.lower().endswith((".html", ".htm"))


def holders_not_searched(kind: str, count: int, holders: int) -> int:
    """How many tensors of a group had their holders not searched: all but the
    :data:`HOLDERS_SAMPLED` searched, in a group of tensors or gradients whose holders were found."""
    return count - HOLDERS_SAMPLED if holders and kind in ("tensor", "grad") and count > HOLDERS_SAMPLED else 0


def sites_not_looked_up_text(count: int) -> str:
    """What a group's sites leave out, once it showed 3: ``the sites of 97 more tensors, not looked up``."""
    return f"the site{'' if count == 1 else 's'} of {count:,} more tensor{'' if count == 1 else 's'}, not looked up"


def size_text(value: int | None) -> str:
    """A figure for a table: its size, or a dash where it was not measured."""
    return "—" if value is None else format_size(value)


def shape_text(shape: Iterable[int]) -> str:
    """A tensor shape as reports write it: ``[2, 512]``."""
    return "[" + ", ".join(str(s) for s in shape) + "]"


def leaked_figure(result: Mapping[str, Any]) -> int:
    """What a test in the report leaked: its bytes left after teardown, its growth across steps or
    runs, or the autograd history it kept (estimated), whichever is most."""
    history = sum(group.get("bytes", 0) for group in result.get("tensors", []) if group.get("kind") == "history")
    return int(max(result.get("leaked_bytes") or result.get("growth_bytes") or 0, history))


def listed_total_text(listed: int, leaked: int | None, above: str) -> str:
    """``, 2.0 MiB in all``: what one run's listed tensors add up to, and, where that is not the
    first run's leak the failure opens with, that the one above is the first run's (``above``: how
    the renderer names it, ``figure`` or ``leak``). Empty where nothing is listed."""
    if not listed:
        return ""
    if leaked is None or leaked == listed:
        return f", {format_size(listed)} in all"
    return f", {format_size(listed)} in all, where the {above} above, {format_size(leaked)}, is the first run's"


def render_groups(groups: Sequence[Any]) -> str:
    """Each leaked group, its holders, and a note on autograd graphs it keeps alive."""
    if not groups:
        return "no live tensor accounts for it: the memory is held outside Python tensors (C++ caches, extensions)"
    lines = []
    stated: set[str] = set()
    for group in groups[:MAX_GROUPS_SHOWN]:
        lines.append(group.title())
        for site in group.allocated_at:
            storage, _, view = site.partition("; kept through a view made at ")
            lines.append(f"    allocated at {storage}")
            if view:
                lines.append(f"        kept through a view made at {view}")
        if group.sites_not_looked_up:
            lines.append(f"    ... and {sites_not_looked_up_text(group.sites_not_looked_up)}")
        for chain in group.held_by:
            lines.append(f"    held by {chain}")
        if not group.held_by:
            lines.append("    held by: no chain found")
        elif unsearched := holders_not_searched(group.kind, group.count, len(group.held_by)):
            lines.append(f"    ... and {unsearched:,} more alike, whose holders were not searched")
        repeated = False  # (the diagnoses an earlier group was given: one line says so)
        for finding in group.diagnoses:
            if finding not in stated:
                lines.append(f"    diagnosis: {finding}")
                stated.add(finding)
            elif not repeated:
                lines.append("    diagnosis: as above")
                repeated = True
    if len(groups) > MAX_GROUPS_SHOWN:
        rest = groups[MAX_GROUPS_SHOWN:]
        lines.append(
            f"... and {len(rest)} more groups, {format_size(sum(g.bytes for g in rest))} "
            "(--vramleak-report=PATH.json or .html lists them all)"
        )
    return "\n".join(lines)


@dataclass
class TestResult:
    """One checked test's entry in the JSON report; numbers not measured stay None."""

    nodeid: str
    device: str | None
    verdict: Verdict
    """The leak check's verdict: ``passed``, ``leaked``, ``over_budget`` or ``unchecked``."""
    outcome: str | None = None
    """pytest's outcome of the test, in its words (``passed``, ``failed``, ``skipped``, ``xfailed``,
    ``xpassed``, ``error``; see :mod:`~pytest_vramleak.reporting.outcomes`), set as its reports are logged."""
    step_verdict: StepVerdict | None = None
    """What the ``vramleak`` fixture's step checks found: ``passed``, ``leaked`` or ``undecided`` (None: none ran)."""
    baseline_bytes: int | None = None
    end_bytes: int | None = None
    leaked_bytes: int | None = None
    peak_bytes: int | None = None
    budget: dict[str, int | None] = field(default_factory=lambda: {"peak": None, "leak": None})
    steps: list[int] | None = None
    """Bytes above the warm-up baseline after each measured step of the test's last step check."""
    warmup_steps: list[int] | None = None
    """The same after each warm-up step of that check."""
    step_history_nodes: list[int] | None = None
    """After each measured step of that check, the autograd nodes made by earlier measured steps
    that tensors alive then keep (None where torch does not number its nodes)."""
    growth_bytes: int | None = None
    settled_after_step: int | None = None
    """Where a step check's memory rose and then stayed flat: the step after which it did."""
    tensors: list[dict[str, Any]] = field(default_factory=list)
    tensors_from: str | None = None
    """Which run left the tensors listed, where they are one run's of several (their indices in a
    list the test appends to are that run's): ``run 5, which recorded where tensors are made after the 4 above``."""
    reason: str | None = None
    """Why a test is unchecked, or the plugin's own error."""
    trace: str | None = None
    """The allocator snapshot saved for this test (``--vramleak-trace``), if any."""
    cycle_bytes: int | None = None
    """Bytes of storages the test created that only the cycle collector freed (a finding, not a leak)."""
    peak_breakdown: dict[str, Any] | None = None
    """What filled the memory at the peak, by kind (CPU tests with a peak budget; see :mod:`pytest_vramleak.meters.peaks`)."""
    ranks: list[dict[str, Any]] = field(default_factory=list)
    """What each rank process reported through ``watch_rank()``: rank, pid, outcome, leaked bytes, tensors."""
    rule: str | None = None
    """How the test was judged: ``significant``, ``growth`` or ``any`` (see :mod:`pytest_vramleak.judging.repeats`)."""
    pattern: str | None = None
    """For a test run more than once: ``grows``, ``kept_once`` or ``settled`` (see :mod:`pytest_vramleak.judging.repeats`)."""
    repetitions: list[int] | None = None
    """Memory left after each run of a repeated test, above its first run's baseline."""
    repetition_warmup: int | None = None
    details: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    """Lines that explain the figures: the driver's view, reserved memory, what PyTorch's caches hold."""

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def write_json(
    path: str | os.PathLike[str],
    results: Iterable[dict[str, Any]],
    *,
    fixtures: Iterable[dict[str, Any]] = (),
    between_checks: Iterable[dict[str, Any]] = (),
    about: Mapping[str, str] | None = None,
    interrupted: str | None = None,
) -> None:
    """Write the report atomically: a reader sees the old file or the whole new one, never half.

    ``fixtures`` lists wider-scoped fixtures whose storages outlived their teardown;
    ``between_checks``, older tensors found grown in place or given gradients between checks
    (charged to no test); ``about`` says where and when the run was made (what merging shards
    keeps per test); ``interrupted``, why its tests are not all there (a run stopped by Ctrl-C).
    """
    document: dict[str, Any] = {
        "version": REPORT_VERSION,
        "tests": sorted(results, key=lambda r: r["nodeid"]),
        "fixtures": list(fixtures),
        "between_checks": list(between_checks),
    }
    if about:
        document["about"] = dict(about)
    if interrupted:
        document["interrupted"] = interrupted
    write_text_atomically(path, json.dumps(document, indent=2) + "\n")


def benchmark_entries(results: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each checked test's peak and leaked bytes as benchmark-tracking CI actions chart them: a list
    of ``{"name", "unit", "value"}``, smaller is better (github-action-benchmark's
    ``customSmallerIsBetter``)."""
    entries = []
    for result in sorted(results, key=lambda r: r["nodeid"]):
        if verdict_of(result) == "unchecked":
            continue
        device = result.get("device") or "?"
        for key, what in (("peak_bytes", "peak"), ("leaked_bytes", "leaked")):
            value = result.get(key)
            if value is not None:
                entries.append({"name": f"{result['nodeid']} {what} ({device})", "unit": "bytes", "value": int(value)})
    return entries


def render_markdown(results: Sequence[dict[str, Any]], interrupted: str | None = None) -> str:
    """A summary for a CI job page: the headline the terminal prints (and ``interrupted``, why the
    run's tests are not all there), the checked tests that leaked, went over budget or did not pass
    (pytest's outcome beside the leak verdict), and holders."""
    listed = sorted(
        (r for r in results if verdict_of(r) in ("leaked", "over_budget") or r.get("outcome") in NOT_PASSING),
        key=lambda r: (verdict_of(r) not in ("leaked", "over_budget"), -(r.get("leaked_bytes") or 0), r["nodeid"]),
    )
    lines = [f"## vramleak: {headline(results)}"]
    if interrupted:
        lines += ["", f"**Interrupted**: {interrupted}"]
    if not listed:
        return "\n".join(lines) + "\n"
    lines += [
        "",
        "| test | outcome | verdict | device | leaked | peak |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    lines += [
        f"| {_code(r['nodeid'])} | {r.get('outcome') or 'not recorded'} | {verdict_of(r).replace('_', ' ')} | {r['device']} "
        f"| {size_text(r.get('leaked_bytes'))} | {size_text(r.get('peak_bytes'))} |"
        for r in listed
    ]
    holders = [(r["nodeid"], group) for r in listed for group in r.get("tensors", [])]
    if holders:
        lines += ["", "<details><summary>What holds the leaked tensors</summary>", ""]
        for nodeid, group in holders:
            held = group["held_by"][0] if group["held_by"] else "no chain found"
            lines.append(
                f"- {_code(nodeid)}: {group['dtype']}{shape_text(group['shape'])}, {_tensors(group)}{format_size(group['bytes'])}, "
                f"held by {_code(held)}{_more_holders(group)}"
            )
        lines += ["", "</details>"]
    return "\n".join(lines) + "\n"


def _more_holders(group: Mapping[str, Any]) -> str:
    """What the Markdown summary's one holder of a group leaves out: the group's other holders
    found (in the JSON and HTML reports), and its tensors whose holders were not searched."""
    held = group.get("held_by") or []
    count = int(group.get("count") or 0)
    more = []
    if len(held) > 1:
        more.append(f"{len(held) - 1} more holder{'' if len(held) == 2 else 's'} in the JSON and HTML reports")
    unsearched = holders_not_searched(str(group.get("kind") or "tensor"), count, len(held))
    if unsearched:
        more.append(f"{unsearched:,} more tensors alike, whose holders were not searched")
    return f" ({'; '.join(more)})" if more else ""


def _tensors(group: Mapping[str, Any]) -> str:
    """How many tensors a group of several tensors or gradients has, for the Markdown summary."""
    count = int(group.get("count") or 0)
    return f"{count:,} tensors, " if count > 1 and (group.get("kind") or "tensor") in ("tensor", "grad") else ""


NOT_PASSING = ("failed", "error", "xpassed")
"""pytest's outcomes that the Markdown summary lists whatever the verdict (a test that failed on its own)."""


def _code(text: str) -> str:
    """``text`` as a Markdown code span that stays on its line and in its table cell."""
    text = " ".join(str(text).splitlines()).replace("|", "\\|")
    if "`" not in text:
        return f"`{text}`"
    fence = "`" * (max(len(run) for run in re.findall("`+", text)) + 1)
    return f"{fence} {text} {fence}"


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


class OutputPathError(OSError):
    """A path the plugin will not write to: not a regular file, read-only, or in a folder it cannot write."""


_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def output_problem(path: str | os.PathLike[str], *, append: bool = False) -> str | None:
    """Why the plugin will not write a file at ``path``, or None where it will.

    Files are replaced whole (:func:`write_text_atomically`): only a regular file, or nothing, may
    be there. A symbolic link is followed to where it points, even where nothing is there yet, and
    the file there is what is written. A FIFO, a device, a socket or a folder is never replaced.
    ``append`` (``$GITHUB_STEP_SUMMARY``) accepts a character device too (a terminal,
    ``/dev/null``: appending there replaces nothing), but not a FIFO, where opening to write waits
    for a reader that may never come. Permissions are those of the user who runs the plugin.
    """
    target = os.fspath(path)
    if target.endswith(("/", os.sep)):
        return "it ends with a slash, so it names a folder"
    try:
        info: os.stat_result | None = os.stat(target)
    except FileNotFoundError:
        info = None  # nothing there, or a link to nothing: the file is made where it points
    except NotADirectoryError:
        info = None  # a file where a folder must be: named below
    except OSError as error:
        if error.errno == errno.ELOOP:
            return "it is a loop of symbolic links"
        return f"it cannot be examined: {error.strerror or error}"
    real = os.path.realpath(target)
    it = f"it links to {real}, which" if os.path.islink(target) else "it"
    if info is not None:
        if stat.S_ISDIR(info.st_mode):
            return f"{it} is a folder"
        if not stat.S_ISREG(info.st_mode) and not (append and stat.S_ISCHR(info.st_mode)):
            return f"{it} is {_kind(info.st_mode)}, not a regular file"
        if not os.access(real, os.W_OK):
            return f"{it} is read-only"
        if append:
            return None  # appending needs no new file beside it
    for folder in Path(real).parents:
        if folder.exists():
            if not folder.is_dir():
                return f"{folder} is a file, not a folder"
            if not os.access(folder, os.W_OK | os.X_OK):
                return f"the folder {folder} is not writable"
            return None
    return None


def write_text_atomically(path: str | os.PathLike[str], text: str) -> None:
    """Replace ``path`` with ``text`` in one step: a reader never sees half a file (see :func:`replacing`)."""
    with replacing(path) as stream:
        stream.write(text)


@contextlib.contextmanager
def replacing(path: str | os.PathLike[str], *, binary: bool = False) -> Iterator[IO[Any]]:
    """A stream (UTF-8 text, or bytes) whose content replaces ``path`` in one step when the block
    ends; where the block raises, ``path`` is left as it was.

    What is written goes to a temporary file beside the target, which is then renamed over it. A
    symbolic link stays a link: the file it points to is replaced. A file replaced keeps its
    permission bits (and its owner, where the user may give it); a new one is as readable as any
    file the user writes. Where :func:`output_problem` finds a reason not to write,
    :class:`OutputPathError` says it and nothing is written.
    """
    target = os.fspath(path)
    problem = output_problem(target)
    if problem:
        raise OutputPathError(f"{target}: {problem}")
    real = os.path.realpath(target)
    directory = os.path.dirname(real)
    os.makedirs(directory, exist_ok=True)
    try:
        existing: os.stat_result | None = os.stat(real)
    except FileNotFoundError:
        existing = None
    handle, temporary = tempfile.mkstemp(prefix=".vramleak-", dir=directory)
    try:
        with os.fdopen(handle, "wb") if binary else os.fdopen(handle, "w", encoding="utf-8") as stream:
            yield stream
        if existing is None:
            # mkstemp makes the file private; a report is as readable as any file the user writes.
            os.chmod(temporary, 0o666 & ~_umask())
        else:
            if hasattr(os, "chown") and (existing.st_uid, existing.st_gid) != (os.geteuid(), os.getegid()):
                with contextlib.suppress(PermissionError):  # only root may give a file to another user
                    os.chown(temporary, existing.st_uid, existing.st_gid)
            os.chmod(temporary, stat.S_IMODE(existing.st_mode))  # after chown, which clears set-id bits
        os.replace(temporary, real)
    except BaseException:
        os.unlink(temporary)
        raise

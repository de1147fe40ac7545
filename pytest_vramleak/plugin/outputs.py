"""The files a run writes as it ends, besides the JSON report: the HTML page and the Markdown
summary (to a file, or appended to a CI job's summary)."""

from __future__ import annotations

import datetime
import functools
import json
import os
import socket
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ..reporting.report import benchmark_entries, is_html_path, render_markdown, write_json, write_text_atomically
from .options import Settings, saved_run_path
from .summary import header_settings, latest

if TYPE_CHECKING:
    from .state import SessionState


INTERRUPTED = (
    "the run was interrupted (KeyboardInterrupt: Ctrl-C or SIGINT) before all its tests ran: only the "
    "tests that ran before it are here"
)
"""What the reports of an interrupted run say of it (as a top-level field in the JSON report)."""


def write_html(
    settings: Settings,
    path: str,
    results: list[dict[str, Any]],
    leftovers: list[dict[str, Any]],
    drift: list[dict[str, Any]],
    interrupted: str | None = None,
) -> None:
    from ..reporting.html_report import render_html  # (loaded where a page is asked for)

    page = render_html(
        results, fixtures=leftovers, between_checks=drift, about=run_about(settings), interrupted=interrupted
    )
    write_text_atomically(path, page)


def run_about(settings: Settings) -> dict[str, str]:
    """What the HTML report says of the run under its title."""
    from importlib.metadata import version

    about = {"generated": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    about["pytest-vramleak"] = version("pytest-vramleak")
    torch = sys.modules.get("torch")
    if torch is not None:
        about["torch"] = str(torch.__version__)
    about["python"] = sys.version.split()[0]
    about["settings"] = header_settings(settings)
    return about


def write_markdown(path: str | None, results: list[dict[str, Any]], interrupted: str | None = None) -> str | None:
    """The Markdown summary, to ``--vramleak-markdown`` or appended to ``$GITHUB_STEP_SUMMARY``;
    where it went (None: nowhere). A file asked for is written in a run that checked no test too
    (``0 checked tests``), so that no earlier run's summary is left there to be read as this one's."""
    if path:
        write_text_atomically(path, render_markdown(results, interrupted))
        return path
    if results and os.environ.get("GITHUB_STEP_SUMMARY"):
        with open(os.environ["GITHUB_STEP_SUMMARY"], "a") as stream:  # other steps append there too
            stream.write(render_markdown(results, interrupted))
        return "$GITHUB_STEP_SUMMARY (appended)"
    return None


def shown_path(path: str | os.PathLike[str], invoked: Path) -> str:
    """A file's path as the summary prints it: relative to where pytest was invoked, as the sites
    in failures are (``../out/r.json`` run from ``tests/``), unless more than two folders up."""
    full = os.path.abspath(path)
    try:
        relative = os.path.relpath(full, invoked)
    except ValueError:  # another drive
        return full
    return full if relative.split(os.sep)[:3] == [os.pardir] * 3 else relative


def write_outputs(session: pytest.Session, owner: SessionState) -> None:
    """Write every file the run asked for (the Markdown summary, the saved run, the reports, the
    benchmark figures), each on its own: one that fails is said in the summary, the others are
    written, and the run's exit status says so. A run that ran no test writes none. What was
    written is noted in ``owner.written``, what was not in ``owner.not_written``. An interrupted
    run's reports say so; the saved run and the benchmark figures, which have no room to, stay as
    they were."""
    config, settings, leftovers = session.config, owner.settings, owner.leftovers
    assert settings is not None
    results = latest(owner.results)
    drift = owner.drift
    invoked = config.invocation_params.dir
    interrupted = INTERRUPTED if session.exitstatus == pytest.ExitCode.INTERRUPTED else None
    owner.interrupted = interrupted is not None
    outputs: list[tuple[str, str | None, Callable[[], str | None]]] = [
        ("the Markdown summary", None, lambda: write_markdown(settings.markdown, results, interrupted))
    ]
    if settings.save and interrupted:
        owner.output_errors.append(f"the run was interrupted: the saved run {settings.save!r} was left as it was")
    elif settings.save:
        figures = {
            r["nodeid"]: {name: r[name] for name in ("device", "peak_bytes", "end_bytes", "leaked_bytes")}
            for r in results
            if r["verdict"] != "unchecked"
        }
        path = saved_run_path(config.rootpath, settings.save)
        outputs.append(
            (
                f"the saved run to {path}",
                str(path),
                lambda: write_text_atomically(path, json.dumps({"version": 1, "tests": figures}, indent=2) + "\n"),
            )
        )
    for report in settings.report_paths:
        if is_html_path(report):
            outputs.append(
                (
                    f"the HTML report to {report}",
                    report,
                    functools.partial(write_html, settings, report, results, leftovers, drift, interrupted),
                )
            )
        else:
            about = {**run_about(settings), "host": socket.gethostname()}
            write_report = functools.partial(
                write_json,
                report,
                results,
                fixtures=leftovers,
                between_checks=drift,
                about=about,
                interrupted=interrupted,
            )
            outputs.append((f"the JSON report to {report}", report, write_report))
    if settings.benchmark_json and interrupted:  # (a list of figures: a partial one would read as whole)
        owner.output_errors.append(
            f"the run was interrupted: the benchmark figures {settings.benchmark_json} were left as they were"
        )
    elif settings.benchmark_json:
        benchmark = json.dumps(benchmark_entries(results), indent=2) + "\n"
        outputs.append(
            (
                f"the benchmark figures to {settings.benchmark_json}",
                settings.benchmark_json,
                functools.partial(write_text_atomically, settings.benchmark_json, benchmark),
            )
        )
    if not owner.ran:
        # --collect-only, -k matching nothing, a collection error: the last real run's files stay.
        files = [*settings.report_paths, settings.benchmark_json, settings.markdown]
        if settings.save:
            files.append(str(saved_run_path(config.rootpath, settings.save)))
        owner.not_written = [shown_path(file, invoked) for file in files if file and os.path.exists(file)]
        owner.not_made = [shown_path(file, invoked) for file in files if file and not os.path.exists(file)]
        return
    errors = owner.output_errors
    for what, target, write in outputs:
        try:
            went = write()
        except Exception as error:  # the others are still written; the summary says what failed
            errors.append(f"could not write {what}: {type(error).__name__}: {error}")
            continue
        where = target if target is not None else went
        if where is not None:
            owner.written.append(where if where.startswith("$") else shown_path(where, invoked))
    if errors and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.USAGE_ERROR


def files_line(
    written: list[str],
    not_written: list[str],
    errors: list[str],
    interrupted: bool = False,
    not_made: Sequence[str] = (),
) -> str | None:
    """The summary's last line: every file the run wrote (marked as from an interrupted run, where
    it was), or that it wrote none, and why (``not_written``: files from an earlier run, left as
    they were; ``not_made``: files asked for that no run made)."""
    if not_written or not_made:
        parts = []
        if not_written:
            parts.append(
                f"{', '.join(not_written)} {'is' if len(not_written) == 1 else 'are'} from an earlier run, left as "
                f"{'it was' if len(not_written) == 1 else 'they were'}"
            )
        if not_made:
            parts.append(f"{', '.join(not_made)} {'was' if len(not_made) == 1 else 'were'} not made")
        return f"vramleak: no test ran, so no file was written: {'; '.join(parts)}"
    if written:
        marked = " (each marked as from an interrupted run: only the tests that ran are there)" if interrupted else ""
        return f"vramleak: wrote {', '.join(written)}{marked}"
    if errors:
        return "vramleak: wrote no file"
    return None


def trace_folder(settings: Settings, rootpath: Path) -> Path:
    """Snapshots go next to the (first) report, or into ``.vramleak-traces`` under the root folder."""
    report = next(iter(settings.report_paths), None)
    return Path(report).resolve().parent / "vramleak-traces" if report else rootpath / ".vramleak-traces"

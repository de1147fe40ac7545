"""One report from several runs: shards of a CI job on different machines, or runs that selected
different tests.

    python -m pytest_vramleak merge shard-1.json shard-2.json --json all.json --html all.html

Each test keeps the shard that ran it (``shard``: the report's file name without its suffix, or
what an earlier merge recorded, so merging merged reports changes nothing). A test found in two
reports with the same figures is listed once; with different figures, the later report on the
command line wins and the merge says which figures differ. A report of format version 1 is read
as version 2 (its ``outcome`` was the leak verdict: it becomes ``verdict``, and pytest's outcome,
which it did not record, is null), and the merge says so; reports of another format version are
refused, and so is a report that does not follow its format (``schemas/report.schema.json``),
naming the file and its first problem. The outputs are checked before anything is read or written.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .html_report import render_html
from .report import REPORT_VERSION, output_problem, write_json, write_text_atomically
from .schemas import first_problem


class MergeError(ValueError):
    """A report that cannot be merged; the message names the file."""


READS = (1, REPORT_VERSION)
"""The report format versions a merge reads."""


def read_report(path: Path) -> tuple[dict[str, Any], str | None]:
    """The report at ``path``, checked whole against the report format of its version, in the
    current version's form (see :func:`migrate`), and what to say of its version where it is an
    earlier one; :class:`MergeError` says what is wrong with it."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise MergeError(f"{path}: cannot be read: {error.strerror or error}") from None
    except ValueError as error:
        raise MergeError(f"{path}: not a JSON report: {error}") from None
    if not isinstance(document, dict) or not isinstance(document.get("tests"), list):
        raise MergeError(f"{path}: not a pytest-vramleak JSON report (no 'tests' list)")
    version = document.get("version")
    if version not in READS:
        raise MergeError(
            f"{path}: report format version {version!r}, this pytest-vramleak reads versions "
            f"{' and '.join(str(known) for known in READS)}: merge reports written by one of those"
        )
    problem = first_problem(document, "report" if version == REPORT_VERSION else f"report-v{version}")
    if problem:
        raise MergeError(f"{path}: not a pytest-vramleak JSON report: {problem}")
    return migrate(document), migrated_note(str(path), document)


def migrate(document: dict[str, Any]) -> dict[str, Any]:
    """A report of an earlier format version in the current version's form. Version 1's
    ``outcome`` was the leak verdict; pytest's outcome it did not record (null)."""
    if document.get("version") == 1:
        tests = [{**entry, "verdict": entry["outcome"], "outcome": None} for entry in document["tests"]]
        document = {**document, "version": REPORT_VERSION, "tests": tests}
    return document


def migrated_note(name: str, document: dict[str, Any]) -> str | None:
    """What the merge says of a version 1 report it read."""
    if document.get("version") != 1:
        return None
    return (
        f"{name} is a version 1 report: its tests' 'outcome' was the leak verdict, kept as 'verdict'; "
        "pytest's outcome was not recorded there (null)"
    )


def differences(earlier: dict[str, Any], later: dict[str, Any]) -> str:
    """The fields two entries of one test disagree on, with both values: ``verdict passed and
    leaked, leaked_bytes 0 and 4096``."""
    keys = [key for key in {**earlier, **later} if key != "shard" and earlier.get(key) != later.get(key)]
    shown = [f"{key} {_short(earlier.get(key))} and {_short(later.get(key))}" for key in keys[:4]]
    if len(keys) > 4:
        shown.append(f"{len(keys) - 4} more fields ({', '.join(keys[4:])})")
    return ", ".join(shown)


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _without_shard(entry: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in entry.items() if key != "shard"}


def merge(
    documents: Sequence[tuple[str, dict[str, Any]]], files: Sequence[str] | None = None
) -> tuple[dict[str, Any], list[str]]:
    """The merged document of ``(shard name, report)`` pairs, and what the merge has to say
    (naming each report by its file, from ``files``, where given)."""
    tests: dict[str, dict[str, Any]] = {}
    origin: dict[str, str] = {}
    fixtures: dict[str, dict[str, Any]] = {}
    between: dict[str, dict[str, Any]] = {}
    messages: list[str] = []
    shards: list[str] = []
    interrupted: list[str] = []
    for index, (name, document) in enumerate(documents):
        shards.append(name)
        if document.get("interrupted"):
            interrupted.append(f"{name}: {document['interrupted']}")
        file = files[index] if files is not None else name
        for entry in document["tests"]:
            entry = dict(entry)
            entry.setdefault("shard", name)
            nodeid = entry["nodeid"]
            earlier = tests.get(nodeid)
            if earlier is not None and _without_shard(earlier) != _without_shard(entry):
                messages.append(
                    f"{nodeid} is in {origin[nodeid]} and {file} with different figures "
                    f"({differences(earlier, entry)}): kept the one from {file}"
                )
            if earlier is None or _without_shard(earlier) != _without_shard(entry):
                tests[nodeid] = entry
                origin[nodeid] = file
        for fixture in document.get("fixtures", []):
            fixture = dict(fixture)
            fixture.setdefault("shard", name)
            fixtures[json.dumps(_without_shard(fixture), sort_keys=True)] = fixture
        for finding in document.get("between_checks", []):
            finding = dict(finding)
            finding.setdefault("shard", name)
            between[json.dumps(_without_shard(finding), sort_keys=True)] = finding
    merged = {
        "version": REPORT_VERSION,
        "tests": sorted(tests.values(), key=lambda entry: entry["nodeid"]),
        "fixtures": list(fixtures.values()),
        "between_checks": list(between.values()),
        "about": {"merged from": ", ".join(dict.fromkeys(shards))},
    }
    if interrupted:  # a shard's partial set stays marked in the whole
        merged["interrupted"] = "; ".join(interrupted)
    return merged, messages


def shard_names(paths: Sequence[Path]) -> list[str]:
    """Each report's shard name: its file name without ``.json`` (a name with another extension
    keeps it: ``out.txt``), with its folder where two share a name."""
    stems = [path.name.removesuffix(".json") for path in paths]
    return [
        f"{path.parent.name}/{stem}" if stems.count(stem) > 1 else stem
        for path, stem in zip(paths, stems, strict=False)
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pytest_vramleak merge",
        description="Merge pytest-vramleak JSON reports into one JSON and one HTML report.",
    )
    parser.add_argument("reports", nargs="+", type=Path, help="JSON reports written by --vramleak-report")
    # Kept as typed (not Path): a trailing slash says a folder is meant, and is refused.
    parser.add_argument("--json", help="write the merged JSON report here")
    parser.add_argument("--html", help="write the merged HTML report here")
    options = parser.parse_args(argv)
    if options.json is None and options.html is None:
        parser.error("say where to write the merged report: --json PATH, --html PATH, or both")
    try:
        check_outputs(options.json, options.html)
        documents, notes = [], []
        for name, path in zip(shard_names(options.reports), options.reports, strict=False):
            document, note = read_report(path)
            documents.append((name, document))
            notes += [note] if note else []
    except MergeError as error:
        print(f"pytest-vramleak merge: {error}", file=sys.stderr)
        return 2
    merged, messages = merge(documents, [str(path) for path in options.reports])
    messages = notes + messages
    for message in messages:
        print(f"pytest-vramleak merge: {message}", file=sys.stderr)
    try:
        if options.json is not None:
            write_json(
                options.json,
                merged["tests"],
                fixtures=merged["fixtures"],
                between_checks=merged["between_checks"],
                about=merged["about"],
                interrupted=merged.get("interrupted"),
            )
        if options.html is not None:
            page = render_html(
                merged["tests"],
                fixtures=merged["fixtures"],
                between_checks=merged["between_checks"],
                about=merged["about"],
                interrupted=merged.get("interrupted"),
            )
            write_text_atomically(options.html, page)
    except OSError as error:  # a disk that filled up, a folder made read-only meanwhile
        print(f"pytest-vramleak merge: could not write the merged report: {error}", file=sys.stderr)
        return 2
    print(f"pytest-vramleak merge: {len(merged['tests'])} tests from {len(documents)} reports")
    return 0


def check_outputs(json_path: str | None, html_path: str | None) -> None:
    """:class:`MergeError` where an output could not be written (see :func:`report.output_problem`),
    or where both name the same file."""
    for option, path in (("--json", json_path), ("--html", html_path)):
        problem = None if path is None else output_problem(path)
        if problem:
            raise MergeError(f"{option} {path}: cannot write the merged report there: {problem}")
    if json_path is not None and html_path is not None and os.path.realpath(json_path) == os.path.realpath(html_path):
        raise MergeError(f"--json and --html name the same file, {json_path}: give each its own")

"""The files rank processes report through (see :mod:`pytest_vramleak.ranks`): where they go,
what one holds, and how the parent's check reads them. The check reads them; :func:`watch_rank`
writes them: this module imports neither.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..judging.sizes import format_size
from ..reporting.report import write_text_atomically

RANKS_ENV = "PYTEST_VRAMLEAK_RANKS"
"""The folder where ranks write their results, set while a checked test runs."""


def _rank() -> int | None:
    """This process's rank: torch.distributed's where a group is up, else ``RANK`` (torchrun's)."""
    import sys

    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    try:
        if c10d is not None and c10d.is_initialized():
            return int(c10d.get_rank())
    except (RuntimeError, ValueError):
        pass
    rank = os.environ.get("RANK")
    return int(rank) if rank is not None and rank.isdigit() else None


def entry(result: Any, rank: int | None) -> dict[str, Any]:
    return {
        "rank": rank if rank is not None else _rank(),
        "pid": os.getpid(),
        "device": result.device,
        "outcome": result.outcome,
        "message": result.message,
        "leaked_bytes": result.leaked_bytes,
        "peak_bytes": result.peak_bytes,
        "report": result.report() if result.outcome != "passed" else "",
        "tensors": [group.to_json() for group in result.groups],
    }


def write(folder: Path, entry: dict[str, Any]) -> None:
    name = f"rank-{entry['rank'] if entry['rank'] is not None else 'unknown'}-{entry['pid']}.json"
    write_text_atomically(folder / name, json.dumps(entry))  # the parent never reads half a file


def collect(folder: Path) -> list[dict[str, Any]]:
    """The results the ranks wrote, by rank."""
    entries: list[dict[str, Any]] = []
    if not folder.is_dir():
        return entries
    for path in sorted(folder.glob("rank-*.json")):
        try:
            entries.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return sorted(entries, key=lambda entry: (entry.get("rank") is None, entry.get("rank") or 0, entry.get("pid") or 0))


def describe(entries: list[dict[str, Any]]) -> tuple[str, str]:
    """A one-line verdict and the failure text for the ranks that leaked, or two empty strings."""
    leaking = [entry for entry in entries if entry.get("outcome") != "passed"]
    if not leaking:
        return "", ""
    names = ", ".join(
        f"rank {entry['rank']}" if entry.get("rank") is not None else f"pid {entry['pid']}" for entry in leaking
    )
    blocks = []
    for entry in leaking:
        who = f"rank {entry['rank']}" if entry.get("rank") is not None else f"process {entry['pid']}"
        leaked = entry.get("leaked_bytes")
        size = f"{format_size(leaked)} " if isinstance(leaked, int) else ""
        blocks.append(f"{who} (pid {entry['pid']}) leaked {size}on {entry['device']}:\n{entry['report']}")
    return f"{names} leaked (watch_rank)", "\n".join(blocks)

"""Leaks in rank processes a test spawns (``torch.multiprocessing.spawn``, ``multiprocessing.Process``).

A check in the parent process cannot see memory in its children. Code that runs in a rank wraps
its work in :func:`watch_rank`::

    def worker(rank, world_size):
        dist.init_process_group("gloo", ..., rank=rank, world_size=world_size)
        with pytest_vramleak.watch_rank(rank):
            train_a_few_steps()
        dist.destroy_process_group()

While a checked test runs, the plugin names a folder in the environment variable
:data:`RANKS_ENV`, which the processes it starts inherit. :func:`watch_rank` runs a whole check
(:class:`~pytest_vramleak.check.LeakCheck`) around its block and writes the result there, one
JSON file per rank: leaked bytes, the leaked tensors with their holders and allocation sites,
the peak. The parent's check reads them as the test ends (:func:`collect`) and fails the test
for a rank that leaked, naming the rank. Outside a checked test :func:`watch_rank` does nothing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .report import write_text_atomically
from .sizes import format_size

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


@contextmanager
def watch_rank(rank: int | None = None, device: str = "auto", *, leak: int | str = 0) -> Iterator[None]:
    """Check the block for leaked memory on ``device`` and report it to the parent test's check.

    ``rank`` names the process in the report; where it is not given, torch.distributed's rank
    when the block ends, else the ``RANK`` environment variable. ``leak`` is the bytes the block
    may leave (an int or a size string such as ``"1 MiB"``). Does nothing where no checked test
    is waiting for the result (no :data:`RANKS_ENV`).
    """
    folder = os.environ.get(RANKS_ENV)
    if not folder:
        yield
        return
    from .check import LeakCheck
    from .sizes import parse_size
    from .verdict import Budget

    check = LeakCheck(device, Budget(leak=parse_size(leak)), record_sites=True, name="rank")
    check.begin()
    check.start()
    failed = True
    try:
        yield
        failed = False
    finally:
        try:
            check.stop()
            if not failed:
                _write(Path(folder), _entry(check.finish(), rank))
        finally:
            check.close()


def _entry(result: Any, rank: int | None) -> dict[str, Any]:
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


def _write(folder: Path, entry: dict[str, Any]) -> None:
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
    names = ", ".join(f"rank {entry['rank']}" if entry.get("rank") is not None else f"pid {entry['pid']}" for entry in leaking)
    blocks = []
    for entry in leaking:
        who = f"rank {entry['rank']}" if entry.get("rank") is not None else f"process {entry['pid']}"
        leaked = entry.get("leaked_bytes")
        size = f"{format_size(leaked)} " if isinstance(leaked, int) else ""
        blocks.append(f"{who} (pid {entry['pid']}) leaked {size}on {entry['device']}:\n{entry['report']}")
    return f"{names} leaked (watch_rank)", "\n".join(blocks)

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
the peak. The parent's check reads them as the test ends (:func:`~pytest_vramleak.meters.rank_reports.collect`) and fails the test
for a rank that leaked, naming the rank. Outside a checked test :func:`watch_rank` does nothing.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .check import LeakCheck
from .judging.sizes import parse_size
from .judging.verdict import Budget
from .meters.rank_reports import RANKS_ENV, entry, write

__all__ = ["RANKS_ENV", "watch_rank"]


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
                write(Path(folder), entry(check.finish(), rank))
        finally:
            check.close()

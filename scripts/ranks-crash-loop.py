"""Run a two-rank gloo world under ``watch_rank()`` many times and count the runs where a rank crashed.

    python scripts/ranks-crash-loop.py --runs 100 --order inside
    python scripts/ranks-crash-loop.py --runs 100 --order before
    python scripts/ranks-crash-loop.py --runs 100 --order inside --variant unfixed

``--order inside``: the gloo group is made inside the block and destroyed after it; ``before``:
made before the block and destroyed after it. Each run spawns two fresh rank processes
(torch.multiprocessing.spawn, file:// rendezvous, as tests/test_ranks.py does) with faulthandler
on; a run counts as crashed where a rank died of a signal. ``--variant``:

- ``fixed``: the plugin as it is;
- ``unfixed``: tracemalloc started as the plugin started it before (its raw-domain hook left in
  place): gloo's worker thread, taking the GIL to drop the all-reduced tensor's Python object,
  can wait in that hook while the check stops tracemalloc (see ``sites.start_tracing``);
- ``no-tracing``: no allocation sites traced at all (the rest of the check as it is);
- ``bare``: no ``watch_rank()`` (no check).

The last line prints the counts.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

VARIANTS = ("fixed", "unfixed", "no-tracing", "bare")


def step(rank: int) -> None:
    import torch
    import torch.distributed as dist

    tensor = torch.ones(256) * rank
    dist.all_reduce(tensor)


def worker(rank: int, world_size: int, store: str, order: str, variant: str) -> None:
    faulthandler.enable(all_threads=True)
    import torch.distributed as dist

    import pytest_vramleak
    from pytest_vramleak.tracking import sites

    if variant == "bare":
        os.environ.pop("PYTEST_VRAMLEAK_RANKS", None)  # watch_rank() does nothing then
    elif variant == "unfixed":
        sites.start_tracing = tracemalloc.start  # type: ignore[assignment]
    elif variant == "no-tracing":
        sites.start_tracing = lambda frames: None  # type: ignore[assignment]

    def init() -> None:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world_size)

    if order == "before":
        init()
    with pytest_vramleak.watch_rank(rank):
        if order == "inside":
            init()
        step(rank)
    dist.destroy_process_group()


def one_run(order: str, variant: str, folder: Path, run: int, show: bool) -> str:
    import torch.multiprocessing as mp

    from pytest_vramleak.meters.rank_reports import collect

    ranks = folder / f"ranks-{run}"
    os.environ["PYTEST_VRAMLEAK_RANKS"] = str(ranks)
    try:
        mp.spawn(worker, args=(2, str(folder / f"store-{run}"), order, variant), nprocs=2)
    except mp.ProcessExitedException as error:
        return f"crashed ({error.signal_name})" if error.signal_name else f"failed (exit {error.exit_code})"
    except mp.ProcessRaisedException as error:
        return "raised: " + str(error).strip().splitlines()[-1]
    if show:
        return "ok: " + "; ".join(
            f"rank {entry['rank']} {entry['outcome']} {entry['message']!r}" for entry in collect(ranks)
        )
    return "ok"


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--order", choices=("inside", "before"), default="inside")
    parser.add_argument("--variant", choices=VARIANTS, default="fixed")
    parser.add_argument("--show", action="store_true", help="print what each rank's check found")
    options = parser.parse_args()
    counts: dict[str, int] = {}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        for run in range(options.runs):
            outcome = one_run(options.order, options.variant, Path(folder), run, options.show)
            kind = outcome.split(":")[0]
            counts[kind] = counts.get(kind, 0) + 1
            print(f"run {run + 1}: {outcome}", flush=True)
    crashed = sum(count for kind, count in counts.items() if kind.startswith("crashed"))
    print(
        f"order={options.order} variant={options.variant}: {crashed} of {options.runs} runs crashed; "
        f"{counts}; {time.perf_counter() - started:.0f} s; torch {_torch_version()}, Python {sys.version.split()[0]}"
    )
    return 1 if crashed else 0


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


if __name__ == "__main__":
    sys.exit(main())

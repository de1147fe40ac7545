"""What a test leaves outside its own process's tensors: ``torch.distributed`` process groups, and
child processes still running.

Process groups hold communicators and their buffers (NCCL's live outside the caching allocator, so
its counters never see them); a suite whose tests each leave a group behind runs out of memory
later. Child processes a test started and left running (DataLoader workers kept by a persistent
iterator, a pool never closed) hold their memory until the session ends.

:class:`ProcessGroups` and :class:`Children` each take a "before" when a check begins and say,
after the test's teardown, what it left. Reading them runs no user code: the process group
registry is read from ``torch.distributed``'s own tables, and children from ``/proc`` (Linux) or,
elsewhere, from ``multiprocessing.active_children()``.
"""

from __future__ import annotations

import os
import sys
import traceback
from dataclasses import dataclass, field
from typing import Any

from ..judging.sizes import format_size
from ..tracking import gc_functions as gc
from ..tracking.census import whole_heap
from ..tracking.sites import site_text, user_sites


def _c10d() -> Any | None:
    """``torch.distributed.distributed_c10d`` where a test has imported it and it works, else None."""
    module = sys.modules.get("torch.distributed.distributed_c10d")
    if module is None or not hasattr(module, "_world"):
        return None
    return module


@dataclass
class LeftGroup:
    name: str
    backend: str
    ranks: list[int]
    default: bool
    created_at: str | None

    def describe(self) -> str:
        what = "the default process group" if self.default else f"process group {self.name!r}"
        where = f", created at {self.created_at}" if self.created_at else ""
        return f"{what} ({self.backend}, ranks {self.ranks}){where}"


@dataclass
class ProcessGroups:
    """The process groups alive when a check began; :meth:`left` names those made since and alive."""

    before: set[int] = field(default_factory=set)
    sites: dict[int, str | None] = field(default_factory=dict)
    _original: Any = None
    _thread: int = 0

    def begin(self) -> None:
        self.before = set()
        self.adopt()
        self._watch_creation()

    def adopt(self) -> None:
        """Count the groups alive now as older than the check (a wider-scoped fixture made them)."""
        c10d = _c10d()
        if c10d is not None:
            self.before.update(map(id, c10d._world.pg_map))

    def _watch_creation(self) -> None:
        """Note where each group is made: ``_new_process_group_helper`` makes every one
        (``init_process_group``, ``new_group``); it is wrapped while the check runs."""
        c10d = _c10d()
        helper = getattr(c10d, "_new_process_group_helper", None) if c10d is not None else None
        if helper is None or self._original is not None:
            return
        self._original = helper
        sites = self.sites

        def making_a_group(*args: Any, **kwargs: Any) -> Any:
            made = helper(*args, **kwargs)
            group = made[0] if isinstance(made, tuple) else made
            sites[id(group)] = _user_site(traceback.extract_stack()[:-1])
            return made

        c10d._new_process_group_helper = making_a_group  # type: ignore[union-attr]

    def end(self) -> None:
        c10d = _c10d()
        if self._original is not None and c10d is not None:
            c10d._new_process_group_helper = self._original
        self._original = None

    def left(self) -> list[LeftGroup]:
        """The groups made since :meth:`begin` that are still registered (not destroyed)."""
        c10d = _c10d()
        if c10d is None:
            return []
        world = c10d._world
        default = world.default_pg if world.pg_map else None
        found = []
        for group, (backend, _) in list(world.pg_map.items()):
            if id(group) in self.before:
                continue
            ranks = sorted(world.pg_group_ranks.get(group, {}).keys())
            name = world.pg_names.get(group, "?")
            found.append(LeftGroup(str(name), str(backend), ranks, group is default, self.sites.get(id(group))))
        return found


def _user_site(stack: list[traceback.FrameSummary]) -> str | None:
    """The innermost frame of the user's code (see :func:`pytest_vramleak.tracking.sites.user_sites`):
    ``test_x.py:12 in test_it()``."""
    found = user_sites([(frame.filename, frame.lineno or 0, frame.name) for frame in reversed(stack)])
    return site_text(found[0]) if found else None


def describe_groups(groups: list[LeftGroup]) -> str:
    lines = [f"left {len(groups)} torch.distributed process group(s) alive that it created:"]
    lines += [f"    {group.describe()}" for group in groups]
    lines.append(
        "    diagnosis: each group keeps its communicator and buffers (NCCL's outside the caching allocator) until destroyed: "
        "call torch.distributed.destroy_process_group(group) for each group, and destroy_process_group() for the default "
        "group, in the test or its fixture's teardown"
    )
    return "\n".join(lines)


@dataclass
class Child:
    pid: int
    command: str
    rss_bytes: int | None
    kind: str
    """``DataLoader worker``, ``multiprocessing process`` or ``process``."""

    def describe(self) -> str:
        rss = f", {format_size(self.rss_bytes)} resident" if self.rss_bytes is not None else ""
        return f"{self.kind} pid {self.pid} ({self.command}{rss})"


def _proc_children() -> dict[int, str] | None:
    """This process's running children by pid, each with its start time (to tell a reused pid),
    from ``/proc/self/task/*/children``; None where that is not there. Finished (zombie) children
    are left out."""
    try:
        tasks = os.listdir("/proc/self/task")
        pids: set[int] = set()
        for task in tasks:
            with open(f"/proc/self/task/{task}/children") as file:
                pids.update(int(pid) for pid in file.read().split())
    except (OSError, ValueError):
        return None
    children = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as file:
                stat = file.read().decode(errors="replace")
        except OSError:
            continue  # gone meanwhile
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 19 and fields[0] not in ("Z", "X"):
            children[pid] = fields[19]
    return children


def _rss(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/statm") as file:
            return int(file.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            parts = file.read().split(b"\0")
    except OSError:
        return "?"
    text = " ".join(part.decode(errors="replace") for part in parts if part)
    return text if len(text) <= 120 else text[:117] + "..."


@dataclass
class Children:
    """The child processes running when a check began; :meth:`left` lists those started since."""

    before: dict[int, str] = field(default_factory=dict)
    known: bool = False

    def begin(self) -> None:
        running = _proc_children()
        self.known = running is not None
        self.before = {}
        self.adopt(running)

    def adopt(self, running: dict[int, str] | None = None) -> None:
        """Count the children running now (``running``, where just read) as older than the check (a
        wider-scoped fixture started them)."""
        if self.known:
            self.before.update(running if running is not None else _proc_children() or {})
        else:
            import multiprocessing

            self.before.update(
                {process.pid: "" for process in multiprocessing.active_children() if process.pid is not None}
            )

    def left(self, *, grace: float = 1.0) -> list[Child]:
        """Children started since :meth:`begin` that still run; those still running are given up to
        ``grace`` seconds to finish (a worker told to stop may still be on its way out)."""
        import multiprocessing
        import time

        deadline = time.monotonic() + grace
        while True:
            processes = {process.pid: process for process in multiprocessing.active_children()}
            new = self._new(processes)
            if not new or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        left = []
        workers = _dataloader_workers() if new else set()
        for pid in new:
            process = processes.get(pid)
            if pid in workers:
                kind = "DataLoader worker"
            elif process is not None:
                kind = "multiprocessing process"
            else:
                kind = "process"
            left.append(Child(pid, _command(pid), _rss(pid), kind))
        return left

    def _new(self, processes: dict[int | None, Any]) -> list[int]:
        """The pids of running children not running at :meth:`begin` (nor multiprocessing's helpers)."""
        running = _proc_children() if self.known else None
        if running is None:
            running = {pid: "" for pid in processes if pid is not None}
        helpers = _multiprocessing_helpers()
        return [
            pid
            for pid, started in sorted(running.items())
            if not (pid in self.before and self.before[pid] == started)
            and pid not in helpers
            and not _torch_helper(pid)
        ]


def _multiprocessing_helpers() -> set[int]:
    """Processes multiprocessing starts once and keeps for the session (its resource tracker and
    fork server, started by the first spawn or forkserver start): not a test's doing."""
    pids = set()
    for module_name, attribute, field_name in (
        ("multiprocessing.resource_tracker", "_resource_tracker", "_pid"),
        ("multiprocessing.forkserver", "_forkserver", "_forkserver_pid"),
    ):
        module = sys.modules.get(module_name)
        helper = getattr(module, attribute, None) if module is not None else None
        pid = getattr(helper, field_name, None) if helper is not None else None
        if isinstance(pid, int):
            pids.add(pid)
    return pids


TORCH_HELPERS = ("torch_shm_manager",)
"""Processes torch starts once and keeps for the session: its shared-memory manager (started the
first time a tensor is shared with the ``file_system`` strategy)."""

TORCH_HELPER_SCRIPTS = ("torch/_inductor/compile_worker/__main__.py",)
"""Python scripts of torch's that run as such helpers: inductor's pool of compile workers, which
torch.compile starts at its first compile in releases such as 2.4 and keeps for the session."""


def _torch_helper(pid: int) -> bool:
    """Whether a child is one of torch's own helpers (read from ``/proc``; False elsewhere)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            arguments = file.read().decode(errors="replace").split("\0")
    except OSError:
        return False
    script = arguments[1].replace(os.sep, "/") if len(arguments) > 1 else ""
    return os.path.basename(arguments[0]) in TORCH_HELPERS or script.endswith(TORCH_HELPER_SCRIPTS)


def _dataloader_workers() -> set[int]:
    """The pids of the workers of every live multi-process DataLoader iterator (torch's
    ``_MultiProcessingDataLoaderIter``, found by exact class among gc's objects, frozen ones too:
    paid only when a test left children running)."""
    module = sys.modules.get("torch.utils.data.dataloader")
    iterator_class = getattr(module, "_MultiProcessingDataLoaderIter", None) if module is not None else None
    if iterator_class is None:
        return set()
    pids = set()
    with whole_heap():  # (an iterator frozen with the heap is not among gc's objects)
        iterators = [obj for obj in gc.get_objects() if type(obj) is iterator_class]
    for iterator in iterators:
        for worker in iterator.__dict__.get("_workers", ()):
            pid = getattr(worker, "pid", None)
            if isinstance(pid, int):
                pids.add(pid)
    iterators.clear()
    return pids


def describe_children(children: list[Child]) -> str:
    lines = [f"left {len(children)} child process(es) running that it started:"]
    lines += [f"    {child.describe()}" for child in children]
    if any(child.kind == "DataLoader worker" for child in children):
        lines.append(
            "    diagnosis: DataLoader workers outlive the test while an iterator over a DataLoader with persistent_workers=True "
            "(or one never exhausted) is alive: del the iterator and the DataLoader in the test, or use persistent_workers=False "
            "(or num_workers=0) in tests"
        )
    else:
        lines.append(
            "    diagnosis: a process the test started still runs: close and join pools (pool.close(); pool.join(), or a with block), "
            "wait for subprocesses, or terminate them in the fixture's teardown"
        )
    return "\n".join(lines)

"""Where the tensors an autograd graph saved were made, from the forward stacks of anomaly mode.

What an autograd node saves for backward (an activation, the output of a layer) is seldom a Python
object the test holds: its object was made where the user's line called the model and was let go
when that call returned, and with it went the stack :mod:`.sites` knows it by. So a loss kept with
its graph named what held it but not where the memory behind it was made.

Autograd's anomaly mode keeps, on each node it sees made, the stack of the forward call that made
it (``node.metadata["traceback_"]``). While :class:`GraphSites` runs (in the run of a failing test
that records sites, where the runs before it kept autograd graphs) anomaly mode is on, without its
checks for NaN; once the run ends, the graphs it kept are walked, and each saved tensor that a node
of that run made (its ``grad_fn``) is sited at that node's stack. A leaf has no such node: its
Python object is the user's own, sited by the recorder. Anomaly mode prints nothing unless backward
fails, and then the forward stack of the failing node, as it would for the user. A backward pass
that makes a graph runs with it off (:func:`own_anomaly_paused`): it would keep the forward graph
behind each node it made.

Anomaly mode asks ``torch.fx.traceback.format_stack`` for each node's stack, which formats every
frame with its source line: under the tracing of that run, 5.6 ms a node 60 frames deep. While it
runs, that function is replaced by one that formats only the frames a site is read from (the
user's, in one string, without source lines: 0.14 ms a node, anomaly mode's own work included),
and it is put back after.
"""

from __future__ import annotations

import contextlib
import importlib
import re
import sys
import types
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .census import _graph_tensors, _torch, collections_paused, storage_facts, tensor_storages
from .graphs import graph_clock
from .sites import MAX_CALLERS, Site, SiteRecorder, frame_kind_of_file, user_sites

_FRAME = re.compile(r'File "(.*)", line (\d+), in ')
"""A frame of the stack anomaly mode keeps (``traceback.format_list``'s form)."""


_turned_on_here = False
"""Whether anomaly mode is on because :class:`GraphSites` turned it on (not the user's)."""


@contextlib.contextmanager
def own_anomaly_paused() -> Iterator[None]:
    """Anomaly mode off meanwhile, where :class:`GraphSites` turned it on: around a backward pass
    that makes a graph (``create_graph=True``). Anomaly mode has each node made in backward keep the
    forward node whose backward made it (``metadata['parent_']``), which keeps that forward graph
    and all it saved alive: memory the test would not keep without it. Such a node gets no site
    from its stack; what it saved is sited as the run's other tensors are."""
    torch = _torch()
    paused = _turned_on_here and torch.is_anomaly_enabled()
    if paused:
        check_nan = torch.is_anomaly_check_nan_enabled()
        torch._C.set_anomaly_enabled(False, check_nan)
    try:
        yield
    finally:
        if paused:
            torch._C.set_anomaly_enabled(True, check_nan)


class GraphSites:
    """Where the saved tensors of the graphs a run kept were made, by their storages' address and size."""

    def __init__(self) -> None:
        self._storages: dict[tuple[int, int], tuple[Site, ...]] = {}
        self._turned_on = False
        self._check_nan = True
        self._since: int | None = None
        """The thread's autograd counter as the run began: nodes numbered from it on are the run's."""
        self._format_stack: Callable[[], list[str]] | None = None
        """``torch.fx.traceback.format_stack`` while :meth:`start` replaced it."""

    def start(self) -> None:
        """Have autograd keep each node's forward stack (where the user's own code has not already)."""
        torch = _torch()
        self._since = graph_clock(torch)
        if torch.is_anomaly_enabled():
            return  # the user's anomaly mode keeps the stacks already
        try:
            fx_traceback: Any = importlib.import_module("torch.fx.traceback")  # (anomaly mode's, at its first node)
            self._check_nan = torch.is_anomaly_check_nan_enabled()
            original = fx_traceback.format_stack
            fx_traceback.format_stack = _stack_formatter(fx_traceback, original)
            self._format_stack = original
            torch._C.set_anomaly_enabled(True, False)
        except Exception:  # a torch without it: no site from graphs
            self.stop()
            return
        self._turned_on = True
        global _turned_on_here
        _turned_on_here = True

    def stop(self) -> None:
        """Put anomaly mode, and the stack formatter it calls, back as they were."""
        if self._turned_on:
            self._turned_on = False
            global _turned_on_here
            _turned_on_here = False
            _torch()._C.set_anomaly_enabled(False, self._check_nan)
        if self._format_stack is not None:
            fx_traceback: Any = sys.modules["torch.fx.traceback"]
            fx_traceback.format_stack = self._format_stack
            self._format_stack = None

    def capture(self, roots: Sequence[tuple[weakref.ref[Any], int]]) -> None:
        """Note where each tensor saved in the graphs of ``roots`` (weak references to the tensors
        that keep them) was made, where a node of the run made it."""
        torch = _torch()
        grad_fn = torch._C.TensorBase.grad_fn.__get__
        stacks: dict[int, tuple[Any, tuple[Site, ...]]] = {}  # (each node kept: its id stays its own)
        visited: set[int] = set()
        keep: list[Any] = []
        try:
            with torch._C.DisableTorchFunction(), collections_paused():
                for tensor in (ref() for ref, _ in roots):
                    node = grad_fn(tensor) if tensor is not None else None
                    for saved in _graph_tensors(node, visited, keep) if node is not None else ():
                        self._note(saved, grad_fn(saved), stacks)
        except Exception:  # a graph that cannot be read: what it saved has no site from it
            pass
        finally:
            keep.clear()
            stacks.clear()

    def _note(self, saved: Any, maker: Any, stacks: dict[int, tuple[Any, tuple[Site, ...]]]) -> None:
        if maker is None:
            return
        known = stacks.get(id(maker))
        if known is None:
            known = stacks[id(maker)] = (maker, self._stack_of(maker))
        stack = known[1]
        if not stack:
            return
        for storage in tensor_storages(saved):
            facts = storage_facts(storage)
            if facts is not None and facts[1]:
                self._storages.setdefault((facts[1], facts[2]), stack)

    def _stack_of(self, node: Any) -> tuple[Site, ...]:
        """The user's frames of the forward call that made ``node``, where the run made it."""
        try:
            if self._since is not None and node._sequence_nr() < self._since:
                return ()  # an earlier run's node: anomaly mode did not see it made
            kept = node.metadata.get("traceback_")
        except Exception:
            return ()
        if type(kept) is list:
            kept = "".join(entry for entry in kept if type(entry) is str)
        if type(kept) is not str:
            return ()
        return user_sites(_innermost_first(kept))

    def site_of(self, tensor: Any, storage: Any) -> tuple[Site, ...] | None:
        facts = storage_facts(storage)
        stack = self._storages.get((facts[1], facts[2])) if facts is not None else None
        return SiteRecorder._named(stack) if stack else None

    def clear(self) -> None:
        self._storages.clear()


def _stack_formatter(fx_traceback: Any, original: Callable[[], list[str]]) -> Callable[[], list[str]]:
    """A ``format_stack`` for anomaly mode that formats only the frames a site is read from: the
    user's innermost ones (:data:`MAX_CALLERS` callers at most, not past the test runner), in
    ``traceback.format_list``'s form but in one string, without source lines (each string is an
    allocation the run's tracing records). The frames are those :func:`~.sites.user_sites` would
    pick, chosen as the stack is walked: handing it every frame costs a traced tuple for each
    library frame between (0.2 ms a node against 0.14). While torch's tracing preserves node
    metadata, torch's own answers, as it would."""
    kinds: dict[str, str] = {}

    def format_stack() -> list[str]:
        if fx_traceback.should_preserve_node_meta:
            return original()
        kept: list[tuple[str, int, str]] = []
        frame: types.FrameType | None = sys._getframe(1)
        while frame is not None:
            code = frame.f_code
            filename = code.co_filename
            kind = kinds.get(filename)
            if kind is None:
                kind = kinds[filename] = frame_kind_of_file(filename)
            if kind == "user":
                kept.append((filename, frame.f_lineno, code.co_name))
                if len(kept) > MAX_CALLERS:
                    break
            elif kind == "runner" and kept:
                break
            frame = frame.f_back
        if not kept:
            return []
        return ["".join(f'  File "{name}", line {line}, in {function}\n' for name, line, function in reversed(kept))]

    return format_stack


def _innermost_first(stack: str) -> list[tuple[str, int, str]]:
    """The frames of a stack as anomaly mode keeps it (outermost first), innermost first."""
    frames: list[tuple[str, str]] = _FRAME.findall(stack)
    return [(filename, int(line), "") for filename, line in reversed(frames)]

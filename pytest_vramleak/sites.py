"""Where leaked tensors were allocated: the innermost frame of the user's code, and its callers.

While a checked test's body runs, a ``TorchFunctionMode`` notes the Python stack of every tensor
a torch function or tensor method returns, keyed by the tensor's storage; the record holds weak
references only and is dropped when the check ends. Tensors created in C++ without a torch call
from Python (gradients made by ``backward()``) have no site.
"""

from __future__ import annotations

import functools
import os
import sys
import types
import weakref
from dataclasses import dataclass
from typing import Any, Protocol

from .census import is_tensor_type

MAX_CALLERS = 3


@functools.lru_cache(maxsize=1)
def _directories() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Library code a site never points into (torch, this plugin), and the test runner's code
    (pytest, pluggy), where a stack stops."""
    import pluggy
    import pytest
    import torch

    def folder(module: Any) -> str:
        return os.path.dirname(module.__file__ or "") + os.sep

    runner = (folder(pytest), os.path.dirname(folder(pytest).rstrip(os.sep)) + os.sep + "_pytest" + os.sep, folder(pluggy))
    return (folder(torch), os.path.dirname(__file__) + os.sep), runner


Site = tuple[str, int, str]
"""A place in the user's code: file name, line, function. Plain tuples, which gc stops tracking,
so a long recording adds nothing to what later collections have to examine."""


def site_text(site: Site) -> str:
    """``file:line in function()``."""
    filename, line, function = site
    return f"{_short_path(filename)}:{line} in {function}()"


def _short_path(filename: str) -> str:
    try:
        relative = os.path.relpath(filename)
    except ValueError:
        return filename
    return filename if relative.startswith("..") else relative


_frame_kinds: weakref.WeakKeyDictionary[types.CodeType, str] = weakref.WeakKeyDictionary()


def _kind(code: types.CodeType) -> str:
    kind = _frame_kinds.get(code)
    if kind is None:
        kind = _frame_kinds[code] = frame_kind_of_file(code.co_filename)
    return kind


def frame_kind_of_file(filename: str) -> str:
    """``user``, ``library`` (torch, this plugin) or ``runner`` (pytest, pluggy) for a file name."""
    library, runner = _directories()
    if filename.startswith(runner):
        return "runner"
    if filename.startswith(library) or filename.startswith("<") or not filename:
        return "library"
    return "user"


def user_stack(frame: types.FrameType | None) -> tuple[Site, ...]:
    """The innermost frames of ``frame``'s stack that belong to the user's code, torch's own frames
    between them left out, up to the test runner's frames."""
    stack: list[Site] = []
    while frame is not None and len(stack) <= MAX_CALLERS:
        kind = _kind(frame.f_code)
        if kind == "user":
            stack.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        elif kind == "runner" and stack:
            break
        frame = frame.f_back
    return tuple(stack)


def describe_stack(stack: tuple[Site, ...]) -> str:
    """``a.py:3 in f(), called from test_b.py:9 in test_x()``."""
    if not stack:
        return "unknown"
    return ", called from ".join(site_text(site) for site in stack)


class SiteSource(Protocol):
    """Anything that can say where a storage was allocated."""

    def site_of(self, storage: Any) -> tuple[Site, ...] | None: ...


@dataclass
class Sites:
    """Several sources asked in turn: the first that knows a storage answers."""

    sources: list[SiteSource]

    def site_of(self, storage: Any) -> tuple[Site, ...] | None:
        for source in self.sources:
            stack = source.site_of(storage)
            if stack:
                return stack
        return None


def _untyped_storage(tensor: Any) -> Any:
    import torch

    return torch._C.TensorBase.untyped_storage(tensor)


_resident: list[Any] = []
"""The recording mode left on torch's function mode stack between checks, at most one: the mode
stack is the process's, and so is this."""


def _ignore(value: Any, frame: types.FrameType) -> None:
    return None


def _top_mode() -> Any:
    import torch

    overrides: Any = torch.overrides
    stack = overrides._get_current_function_mode_stack()
    return stack[-1] if stack else None


def release_resident_mode() -> None:
    """Take the recording mode left between checks off torch's mode stack (as a session ends)."""
    while _resident:
        _leave(_resident.pop())


def _leave(mode: Any) -> None:
    """Take ``mode`` off torch's function mode stack, wherever it is in it.

    ``TorchFunctionMode.__exit__`` pops whatever is on top: if the test entered a mode of its own
    and left it there, that would take the test's mode off and leave ours. Modes above ours are
    put back as they were (as torch does for its default-device mode).
    """
    import torch

    overrides: Any = torch.overrides
    above: list[Any] = []
    try:
        while overrides._get_current_function_mode_stack() and _top_mode() is not mode:
            above.append(overrides._pop_mode())
        if _top_mode() is mode:
            overrides._pop_mode()
    finally:
        for other in reversed(above):
            overrides._push_mode(other)


def _compiled_anything() -> bool:
    """Whether torch.compile has compiled code in this process (without importing dynamo)."""
    utils = sys.modules.get("torch._dynamo.utils")
    try:
        return bool(utils is not None and utils.counters["frames"]["total"])
    except Exception:
        return False


@functools.lru_cache(maxsize=1)
def _recording_mode() -> type:
    """The torch function mode that notes where results are made: one class for the whole process.

    ``torch.compile`` traces the modes that are active and guards on their classes: a class per
    check would recompile a compiled function in every checked test. While compiling, the mode
    passes calls straight through (``is_compiling`` is a constant to the tracer), so compiled code
    gets no graph break and no warning from it.
    """
    import torch
    from torch.overrides import TorchFunctionMode

    is_compiling = torch.compiler.is_compiling

    class RecordSites(TorchFunctionMode):
        def __init__(self, note: Any) -> None:
            super().__init__()
            self.note = note
            self.recording = True

        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            result = func(*args, **(kwargs or {}))
            if is_compiling() or not self.recording:
                return result
            if type(result) in (tuple, list):
                for item in result:
                    self.note(item, sys._getframe(1))
            else:
                self.note(result, sys._getframe(1))
            return result

    return RecordSites


class SiteRecorder:
    """Records the allocation site of every tensor torch returns to Python while it is active."""

    def __init__(self) -> None:
        # id(storage) -> (data pointer, size, stack): an id and a data pointer together are reused
        # only when a new storage takes both the old storage object's place and its memory.
        self._sites: dict[int, tuple[int, int, tuple[Site, ...]]] = {}
        self._mode: Any = None
        self._paused = False
        self._on_stack = False

    def __enter__(self) -> SiteRecorder:
        if _resident and _top_mode() is _resident[-1]:
            self._mode = _resident.pop()  # left on the stack by the previous check: record with it
            self._mode.note, self._mode.recording = self._note, True
        else:
            self._mode = _recording_mode()(self._note)
            self._mode.__enter__()
        self._on_stack = True
        return self

    def _note(self, value: Any, frame: types.FrameType) -> None:
        if not is_tensor_type(type(value)):
            return
        try:
            storage = _untyped_storage(value)
            identity = (storage.data_ptr(), storage.nbytes())
        except Exception:
            return
        known = self._sites.get(id(storage))
        if known is None or known[:2] != identity:  # in-place results keep their first site
            self._sites[id(storage)] = (*identity, user_stack(frame))

    def __exit__(self, *exc_info: object) -> None:
        mode, self._mode = self._mode, None
        if mode is not None and self._on_stack:
            if _compiled_anything() and _top_mode() is mode:
                # Compiled code is guarded on the mode stack: a stack that changed between
                # checked and unchecked code would recompile it. Stay, recording nothing.
                mode.note, mode.recording = _ignore, False
                _resident.append(mode)
            else:
                mode.note = _ignore  # should a test have held on to the mode, it keeps no record
                _leave(mode)
        self._paused = self._on_stack = False

    def pause(self) -> None:
        """Stop recording for a while (a long loop whose first steps were recorded).

        Where torch.compile has compiled code, the mode stays on the stack and only stops
        recording: compiled code is guarded on the active modes, and leaving would recompile it
        in the middle of the loop.
        """
        if self._mode is None or self._paused:
            return
        if _compiled_anything() or _top_mode() is not self._mode:
            self._mode.recording = False  # (a mode the test entered sits above ours: stay under it)
        else:
            _leave(self._mode)
            self._on_stack = False
        self._paused = True

    def resume(self) -> None:
        if self._mode is not None and self._paused:
            if not self._on_stack:
                self._mode.__enter__()
                self._on_stack = True
            self._mode.recording = True
            self._paused = False

    def site_of(self, storage: Any) -> tuple[Site, ...] | None:
        """The stack where ``storage`` was allocated, if it was recorded."""
        known = self._sites.get(id(storage))
        if known is None or known[:2] != (storage.data_ptr(), storage.nbytes()):
            return None
        return known[2]

    def clear(self) -> None:
        self._sites.clear()

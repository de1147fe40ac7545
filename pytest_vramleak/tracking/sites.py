"""Where leaked tensors were allocated: the innermost lines of the user's code, and their callers.

A tensor's Python object is allocated when torch returns the tensor to Python, in the frame of
the code that asked for it. While :class:`SiteRecorder` runs, Python's ``tracemalloc`` notes the
stack of every allocation, so the stack of a tensor's object is where the user's code made it.
Nothing is put between the user's code and torch: error tracebacks, warnings and code compiled
by ``torch.compile`` are exactly as without it. Tracing every allocation is not free (Python
code that allocates much runs up to twice as slow meanwhile), so it runs only where asked: the
first measured steps of a step check, and checked tests with ``--vramleak-sites=on``.

A gradient ``backward()`` made gets the line that called backward: while tracing runs, the
backward watch gives each new gradient its Python object there
(:mod:`pytest_vramleak.tracking.backward`). Other tensors made inside C++ and handed to Python
later get the site where Python first saw them, or none.
"""

from __future__ import annotations

import ast
import contextlib
import ctypes
import functools
import importlib.util
import itertools
import linecache
import operator
import os
import sys
import sysconfig
import tracemalloc
import types
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from .census import collections_paused, is_tensor_type, storage_facts, tensor_storages
from .torch_api import not_compiled, skips_compiling

MAX_CALLERS = 3
FRAMES_TRACED = 16
FRAMES_FOR_CPP_HELD = 4
"""Frames traced where what a test keeps is held from C++ alone: where it was made, and its
nearest callers. tracemalloc's cost grows with the frames it records (16 cost test code heavy in
small allocations 25x, 4 cost 8x)."""
_PLUGIN_DIR = os.path.dirname(os.path.dirname(__file__)) + os.sep  # the package, every layer of it
_BACKWARD_FILE = os.path.join(os.path.dirname(__file__), "backward.py")
"""Where the plugin makes the Python objects of the gradients a backward pass made, standing in
for the backward pass itself (see :func:`pytest_vramleak.tracking.backward._give_gradients_objects`)."""
SITES_PER_GROUP = 32
"""Tensors of one dtype, shape and device (a group, as a leak report names it) whose sites a
recording run captures: a report shows three sites a group, and the stack of every one of 10^5
tensors kept alike would cost seconds and say nothing more."""


@functools.lru_cache(maxsize=1)
def code_folders() -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """Library code a site never points into (torch, this plugin), and the code that runs the
    user's (pytest, pluggy, the start of a thread or of a multiprocessing process), where a stack
    stops."""
    import multiprocessing
    import threading

    import torch

    def folder(module: Any) -> str:
        return os.path.dirname(module.__file__ or "") + os.sep

    def installed_folder(name: str) -> str:
        # found without importing: only the pytest layer imports pytest
        spec = importlib.util.find_spec(name)
        return os.path.dirname(spec.origin) + os.sep if spec is not None and spec.origin else os.sep + "\0"

    paths = sysconfig.get_paths()
    installed = tuple({paths["purelib"] + os.sep, paths["platlib"] + os.sep})
    standard = tuple({paths["stdlib"] + os.sep, paths["platstdlib"] + os.sep} - set(installed))
    runner = (
        installed_folder("pytest"),
        os.path.dirname(installed_folder("pytest").rstrip(os.sep)) + os.sep + "_pytest" + os.sep,
        installed_folder("pluggy"),
        folder(multiprocessing),
        threading.__file__,
    )
    return (folder(torch), _PLUGIN_DIR), runner, standard, installed


Site = tuple[str, int, str]
"""A place in the user's code: file name, line, function (empty where not known)."""


def found_on_path(filename: str) -> str:
    """The file a name relative to a ``sys.path`` entry (as PyTorch's profiler names files:
    ``mlkit/model.py`` for ``src/mlkit/model.py``) is, found on ``sys.path``; the name as given
    where it is absolute or found nowhere."""
    if os.path.isabs(filename):
        return filename
    for entry in sys.path:
        candidate = os.path.join(entry or os.getcwd(), filename)
        if os.path.isfile(candidate):
            return candidate
    return filename


def site_text(site: Site) -> str:
    """``file:line in function()``, or ``file:line`` where the function is not known."""
    filename, line, function = site
    text = f"{_short_path(filename)}:{line}"
    return f"{text} in {function}()" if function else text


# Expressions that run in a frame of their own, named as CPython names their code (comprehensions
# other than generator expressions run inline from 3.12 on: PEP 709).
_SCOPE_NAMES: dict[type, str] = {ast.Lambda: "<lambda>", ast.GeneratorExp: "<genexpr>"}
if sys.version_info < (3, 12):
    _SCOPE_NAMES.update({ast.ListComp: "<listcomp>", ast.SetComp: "<setcomp>", ast.DictComp: "<dictcomp>"})


@functools.lru_cache(maxsize=64)
def _functions_by_line(filename: str, stamp: tuple[int, int]) -> tuple[tuple[int, int, str], ...]:
    """``(first line, last line, name)`` of every function in a source file, innermost last."""
    source = "".join(linecache.getlines(filename))
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return ()
    spans = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            spans.append((node.lineno, node.col_offset, node.end_lineno or node.lineno, node.name))
        elif isinstance(node, ast.expr) and type(node) in _SCOPE_NAMES:
            spans.append((node.lineno, node.col_offset, node.end_lineno or node.lineno, _SCOPE_NAMES[type(node)]))
    return tuple((first, last, name) for first, _, last, name in sorted(spans, key=lambda span: span[:2]))


def enclosing_function(filename: str, line: int, outer: int = 0) -> str:
    """The name of the innermost function whose body holds ``line`` (``outer`` levels out from
    it), read from the source (tracemalloc records files and lines only), or ``""`` at a module's
    or class's top level."""
    try:
        status = os.stat(filename)
    except OSError:
        return ""
    # spans are sorted by start: the last match is the innermost
    names = [
        function
        for first, last, function in _functions_by_line(filename, (status.st_mtime_ns, status.st_size))
        if first <= line <= last
    ]
    return names[-1 - outer] if outer < len(names) else ""


def name_frames(stack: Sequence[tuple[str, int, Any]]) -> tuple[Site, ...]:
    """Each frame of a stack (innermost first) with the function it ran. Frames on one line are
    nested scopes, innermost first (``(lambda: torch.ones(3))()`` in a test): the caller of a
    lambda on its own line is the function around the lambda, not the lambda again."""
    named: list[Site] = []
    outer = 0
    for filename, line, _ in stack:
        if named and named[-1][:2] == (filename, line):
            # Called from the same line: from around the lambda or comprehension the inner frame
            # ran (a function calling itself on one line is that function again).
            outer += named[-1][2].startswith("<")
        else:
            outer = 0
        named.append((filename, line, enclosing_function(filename, line, outer)))
    return tuple(named)


def _short_path(filename: str) -> str:
    """A file's name relative to the working folder (where pytest was invoked), as pytest's own
    tracebacks write it: ``../src/pkg/model.py`` run from ``tests/``. A file far from it (more
    than two folders up: an installed library) keeps its absolute name."""
    try:
        relative = os.path.relpath(filename)
    except ValueError:
        return filename
    return filename if relative.split(os.sep)[:3] == [os.pardir] * 3 else relative


def frame_kind_of_file(filename: str) -> str:
    """``user``, ``library`` (torch, this plugin, the standard library) or ``runner`` (pytest,
    pluggy) for a file name."""
    library, runner, standard, installed = code_folders()
    if filename.startswith(runner):
        return "runner"
    if filename.startswith(library) or filename.startswith("<") or not filename:
        return "library"
    if filename.startswith(standard) and not filename.startswith(installed):
        return "library"  # copy.deepcopy, functools: a site names the user's line that called them
    if is_loaded_standard_library(filename):
        return "library"  # the same, loaded from where sysconfig does not say (a zip of the standard library)
    return "user"


_STANDARD_NAMES = frozenset(getattr(sys, "stdlib_module_names", ())) - {"test", "__main__"}
"""The standard library's top-level module names, less ``test``: a project's tests are often a
package of that name, and the standard library's own tests are never what a test suite runs."""
_MODULE_NAMESPACE: Any = vars(types.ModuleType)["__dict__"]


@dataclass
class _LoadedStandard:
    modules: int = -1
    """How many modules were loaded when the files below were read."""
    files: frozenset[str] = frozenset()
    folders: tuple[str, ...] = ()


_loaded_standard = _LoadedStandard()


def is_loaded_standard_library(filename: str) -> bool:
    """Whether a file is a module of the standard library that is loaded, or in the folder of one
    of its packages, wherever it was loaded from: a zip of the standard library, an install whose
    place sysconfig does not give. A module of the user's that has a standard module's name (in
    the working folder, or installed) is not."""
    known = _loaded_standard
    if known.modules != len(sys.modules):
        known.modules = len(sys.modules)
        known.files, known.folders = _standard_library_files()
    return filename in known.files or filename.startswith(known.folders)


def _standard_library_files() -> tuple[frozenset[str], tuple[str, ...]]:
    _, _, _, installed = code_folders()
    here = os.getcwd() + os.sep
    files: set[str] = set()
    folders: set[str] = set()
    for name, module in list(sys.modules.items()):
        if name.partition(".")[0] not in _STANDARD_NAMES or not issubclass(type(module), types.ModuleType):
            continue
        namespace = _MODULE_NAMESPACE.__get__(module)  # read without running any code of the module's
        path = namespace.get("__file__") if type(namespace) is dict else None
        if type(path) is not str or not os.path.isabs(path) or path.startswith(installed) or path.startswith(here):
            continue
        if namespace.get("__path__") is not None:
            folders.add(os.path.dirname(path) + os.sep)
        else:
            files.add(path)
    return frozenset(files), tuple(sorted(folders))


def user_sites(frames: list[tuple[str, int, str]]) -> tuple[Site, ...]:
    """The innermost frames of a stack (innermost first) that belong to the user's code, library
    frames between them left out, up to the test runner's frames; where more than two frames in a
    row stand at one line (deep recursion, modes on torch's stack each calling the next), two are
    shown. (Two can be two scopes on one line, a lambda and its caller: functions are named later.)"""
    stack: list[Site] = []
    for filename, line, function in frames:
        kind = frame_kind_of_file(filename)
        if kind == "user":
            if len(stack) >= 2 and stack[-1] == stack[-2] == (filename, line, function):
                continue
            stack.append((filename, line, function))
            if len(stack) > MAX_CALLERS:
                break
        elif kind == "runner" and stack:
            break
    return tuple(stack)


def thread_entry(frames: list[tuple[str, int, str]]) -> tuple[str, int] | None:
    """Where a stack (innermost first) that starts at threading's bootstrap (a thread other than
    the main one) enters the code the thread runs: the outermost frame below threading's own, as
    (file, line); None for any other stack (the main thread's, or one cut short before its start)."""
    import threading

    if not frames or frames[-1][0] != threading.__file__:
        return None
    entry = next((frame for frame in reversed(frames) if frame[0] != threading.__file__), None)
    return (entry[0], entry[1]) if entry is not None else None


def describe_stack(stack: tuple[Site, ...]) -> str:
    """``a.py:3 in f(), called from test_b.py:9 in test_b()``."""
    if not stack:
        return "unknown"
    return ", called from ".join(site_text(site) for site in stack)


class SiteSource(Protocol):
    """Anything that can say where a tensor's storage was allocated."""

    def site_of(self, tensor: Any, storage: Any) -> tuple[Site, ...] | None: ...


@dataclass
class Sites:
    """Several sources asked in turn: the first that knows a storage answers. A source that knows
    where the tensor object itself was made (:class:`SiteRecorder`) also says where a view kept
    of the storage was made (:meth:`view_site_of`)."""

    sources: list[SiteSource] = field(default_factory=list)

    def site_of(self, tensor: Any, storage: Any) -> tuple[Site, ...] | None:
        for source in self.sources:
            stack = source.site_of(tensor, storage)
            if stack:
                return stack
        return None

    def captured_pointers(self) -> set[int]:
        """The data pointers of the storages whose sites a source captured (see :meth:`SiteRecorder.captured_pointers`)."""
        return set().union(*(source.captured_pointers() for source in self.sources if type(source) is SiteRecorder))

    def made_inside_library(self, obj: Any) -> bool | None:
        """What the first source that knows says of who made ``obj`` (see :meth:`SiteRecorder.made_inside_library`)."""
        for source in self.sources:
            ask = getattr(source, "made_inside_library", None)
            known = ask(obj) if ask is not None else None
            if known is not None:
                return bool(known)
        return None

    def view_site_of(self, tensor: Any, storage: Any) -> tuple[Site, ...] | None:
        """Where the tensor object kept was made, where that is not where its storage was
        allocated (``inputs[0].detach()`` in a hook keeps the batch the test made)."""
        storage_stack = next(
            (
                stack
                for source in self.sources
                if type(source) is StorageSites
                for stack in [source.site_of(tensor, storage)]
                if stack
            ),
            None,
        )
        if not storage_stack:
            return None
        for source in self.sources:
            if type(source) is SiteRecorder:
                stack = source.object_site_of(tensor)
                if stack and stack[0] != storage_stack[0]:
                    return stack
        return None


_GC_HEADER = 2 * ctypes.sizeof(ctypes.c_void_p)
_HAVE_GC = 1 << 14
_MANAGED_DICT = 1 << 4


@functools.lru_cache(maxsize=1)
def _raw_traceback() -> Any | None:
    """CPython's lookup of a memory block's traceback by address (3.11 needs it: see :func:`_frames_of`)."""
    try:
        function = ctypes.pythonapi._PyTraceMalloc_GetTraceback
    except (AttributeError, OSError):
        return None
    function.restype = ctypes.py_object
    function.argtypes = [ctypes.c_uint, ctypes.c_size_t]
    return function


def _made_by_plugin(frames: list[tuple[str, int, str]]) -> bool:
    """Whether an object whose stack this is was made by the plugin reading a tensor (no site of
    the user's): the gradients the backward watch gives objects are the backward pass's own."""
    return frames[0][0].startswith(_PLUGIN_DIR) and frames[0][0] != _BACKWARD_FILE


def _frames_of(obj: Any) -> list[tuple[str, int, str]] | None:
    """The stack (innermost first) where ``obj`` was allocated while tracemalloc ran, or None.

    Python 3.11's ``tracemalloc.get_object_traceback`` misses objects whose class keeps their
    ``__dict__`` before the object (every Python subclass of a C type, ``torch.Tensor`` among
    them), so there the block's address is computed here and looked up directly: a lookup in
    tracemalloc's table that never reads the memory at that address.
    """
    if sys.version_info >= (3, 12) or sys.version_info < (3, 11):
        traceback = tracemalloc.get_object_traceback(obj)
        return None if traceback is None else [(frame.filename, frame.lineno, "") for frame in reversed(traceback)]
    lookup = _raw_traceback()
    if lookup is None:
        return None
    flags = type(obj).__flags__
    header = (_GC_HEADER if flags & _HAVE_GC else 0) + (_GC_HEADER if flags & _MANAGED_DICT else 0)
    raw = lookup(0, id(obj) - header)
    return None if raw is None else [(filename, line, "") for filename, line in raw]


class _Allocator(ctypes.Structure):
    """CPython's ``PyMemAllocatorEx``."""

    _fields_ = [(name, ctypes.c_void_p) for name in ("ctx", "malloc", "calloc", "realloc", "free")]


_RAW_DOMAIN = 0  # PYMEM_DOMAIN_RAW
_OBJECT_DOMAIN = 2  # PYMEM_DOMAIN_OBJ
_untraced: list[_Allocator] = []
"""The object domain's allocator as tracing began, where :func:`start_tracing` began it: see
:func:`objects_untraced`."""


@functools.lru_cache(maxsize=1)
def _allocator_functions() -> tuple[Any, Any] | None:
    """``PyMem_GetAllocator`` and ``PyMem_SetAllocator``, or None where the interpreter lacks them.
    (From a handle of the plugin's own, so that the argument types set here are no one else's.)"""
    try:
        api = ctypes.PyDLL(ctypes.pythonapi._name, handle=ctypes.pythonapi._handle)
        get, set_ = api.PyMem_GetAllocator, api.PyMem_SetAllocator
    except (AttributeError, OSError):
        return None
    for function in (get, set_):
        function.restype = None
        function.argtypes = [ctypes.c_int, ctypes.POINTER(_Allocator)]
    return get, set_


def start_tracing(frames: int) -> None:
    """``tracemalloc.start(frames)``, with its hook on the raw domain (``PyMem_RawMalloc``) taken out.

    Threads that do not hold the GIL call the raw domain: a native thread taking the GIL for the
    first time allocates its thread state there (a gloo worker dropping the last reference to a
    tensor's Python object, a ctypes callback, any C++ thread calling back into Python).
    tracemalloc's hook waits for the GIL before it records the block; where the thread that holds
    the GIL stops tracemalloc meanwhile, the hook then records into the freed tables and the
    process dies of a segmentation fault (CPython gh-128679: fixed in 3.12.9 and 3.13.2, never
    in 3.10 or 3.11). Sites need only where Python objects were made (the object domain, always
    called with the GIL held), so the raw domain keeps the allocator it had: no thread waits in
    tracemalloc when it stops. ``tracemalloc.stop()`` puts back that same allocator. (A thread that
    enters the hook in the instant between the two calls below still waits there, and gets the GIL
    at the next switch between threads: only a traced block shorter than the switch interval,
    ``sys.getswitchinterval()``, could end before.)
    """
    functions = _allocator_functions()
    raw, objects = _Allocator(), _Allocator()
    if functions is not None:
        functions[0](_RAW_DOMAIN, ctypes.byref(raw))
        functions[0](_OBJECT_DOMAIN, ctypes.byref(objects))
    tracemalloc.start(frames)
    _untraced[:] = [objects] if functions is not None else []
    if functions is not None:
        functions[1](_RAW_DOMAIN, ctypes.byref(raw))


@contextlib.contextmanager
def objects_untraced() -> Iterator[None]:
    """While tracing that :func:`start_tracing` began runs, Python objects made inside are not
    traced: the object domain has the allocator it had before tracing began, and tracemalloc's
    hook back after. (The plugin groups 10^5 tensors a test made as its body ends, a shape and a
    device object each: traced, that took ten times as long.) An object made inside and freed after
    is freed through the hook, which finds no trace of it; one made before and freed inside keeps
    its trace, until its address is traced again or tracing stops: only the plugin's own objects,
    never one whose site is asked for. Nothing changes where the user's code began tracing."""
    functions = _allocator_functions()
    if functions is None or not _untraced or not tracemalloc.is_tracing():
        yield
        return
    hook = _Allocator()
    functions[0](_OBJECT_DOMAIN, ctypes.byref(hook))
    functions[1](_OBJECT_DOMAIN, ctypes.byref(_untraced[0]))
    try:
        yield
    finally:
        if tracemalloc.is_tracing():  # (stopped meanwhile: tracemalloc put back the allocator it had)
            functions[1](_OBJECT_DOMAIN, ctypes.byref(hook))


class SiteRecorder:
    """Records where tensors are made while it runs; see the module docstring.

    Where the user's own code already runs tracemalloc, it is used as it is and left running.
    """

    def __init__(self) -> None:
        # id(storage) -> (data pointer, size, stack): an id and a data pointer together are reused
        # only when a new storage takes both the old storage object's place and its memory.
        self._sites: dict[int, tuple[int, int, tuple[Site, ...]]] = {}
        self._objects: dict[int, tuple[Site, ...]] = {}
        """Where each tensor object captured was made, by id: asked while those tensors live."""
        self._inside_library: dict[int, bool] = {}
        """By id of each object captured: whether library code (torch) made it, not the user's."""
        self._owns_tracing = False
        self._agreed: dict[Any, bool] = {}
        self._pointers: set[int] = set()
        """The data pointers of the storages whose sites :meth:`capture` noted."""
        """Each group whose sample :meth:`capture` took was full and agreed, with its answer."""
        self.stopped_by_others = False
        """Tracing it started was stopped by other code (the test's ``tracemalloc.stop()``)."""
        self.started_tracing = False
        """Whether :meth:`start` began tracing (rather than finding the user's own running)."""
        self._threads: dict[int, tuple[int, int, tuple[str, int] | None]] = {}
        """id(storage) -> (data pointer, size, the thread's entry) for each storage captured: the
        entry, where a thread other than the main one made its tensor (its stack starts at
        threading's bootstrap), is the outermost frame below threading's, in the function the
        thread runs (file, line); None for the main thread."""

    def start(self, frames: int = FRAMES_TRACED) -> None:
        if not tracemalloc.is_tracing():
            start_tracing(frames)
            self._owns_tracing = self.started_tracing = True

    @property
    def owns_tracing(self) -> bool:
        """Whether tracing runs because :meth:`start` began it: what was made before has no site."""
        return self._owns_tracing and tracemalloc.is_tracing()

    def stop(self) -> None:
        """Stop tracing (the sites captured so far stay known)."""
        if self._owns_tracing:
            self._owns_tracing = False
            _untraced.clear()
            if tracemalloc.is_tracing():
                tracemalloc.stop()
            else:
                self.stopped_by_others = True

    def capture(self, pairs: list[tuple[Any, Any]]) -> None:
        """Note now, while tracing runs, where each ``(tensor, storage)`` pair's tensor was made:
        for the last ``SITES_PER_GROUP`` pairs of each group (dtype, shape and device; the newest
        are the ones tracing saw). Whether library code made a tensor is decided on its group's
        sample: a tensor left out gets the answer its sample agrees on, or none where it is split."""
        self._capture([pair[0] for pair in pairs], [pair[1] for pair in pairs])

    def capture_objects(self, objects: list[Any], storages: list[Any]) -> None:
        """As :meth:`capture`, of tensors and storage objects and the storage of each, where None
        stands for the tensor's own (first) storage, or the storage object itself: what a test's
        body made, listed from gc as the body ends."""
        self._capture(objects, storages)

    def captured_pointers(self) -> set[int]:
        """The data pointers of the storages whose sites :meth:`capture` noted."""
        return set(self._pointers)

    def _capture(self, objects: list[Any], storages: list[Any]) -> None:
        if not tracemalloc.is_tracing():
            self.stopped_by_others = self.stopped_by_others or self._owns_tracing
            return
        import torch

        # (no code of a tensor subclass runs; nor do the collections that making an object or two
        # per tensor sets off, each a walk of the heap)
        sampled: dict[Any, list[bool | None]] = {}
        with torch._C.DisableTorchFunction(), collections_paused():
            with objects_untraced():  # (nothing changes where the user's code began tracing)
                taken = _sample(objects, torch._C.TensorBase)
            for index, group in taken:
                tensor = objects[index]
                storage = storages[index]
                if storage is None:
                    storage = _own_storage(tensor)
                made = sampled.setdefault(group, [])
                frames = _frames_of(tensor)
                made.append(None)
                if frames and not _made_by_plugin(frames):
                    made[-1] = self._inside_library[id(tensor)] = frame_kind_of_file(frames[0][0]) != "user"
                # (an object the plugin made, reading a tensor, says nothing of the thread that made it)
                facts = storage_facts(storage) if storage is not None else None
                if frames and facts is not None and not _made_by_plugin(frames):
                    self._threads[id(storage)] = (facts[1], facts[2], thread_entry(frames))
                stack = self._stack(tensor, frames or [])
                if stack:
                    self._objects[id(tensor)] = stack
                    if facts is not None:
                        self._sites[id(storage)] = (facts[1], facts[2], stack)
                        self._pointers.add(facts[1])
        # (a group with tensors left out has a full sample)
        self._agreed = {
            group: made[0]
            for group, made in sampled.items()
            if len(made) == SITES_PER_GROUP and len(set(made)) == 1 and made[0] is not None
        }

    def made_inside_library(self, obj: Any) -> bool | None:
        """Whether library code (torch's own) made this tensor or storage object, rather than a
        line of the user's calling it (None where not known): as its site said, where
        :meth:`capture` looked it up, else as the sample of its group agreed, where it was full
        (a tensor made before tracing began, an earlier run's, is answered so too)."""
        known = self._inside_library.get(id(obj))
        if known is not None or not self._agreed:
            return known
        import torch

        with torch._C.DisableTorchFunction():
            return self._agreed.get(_group_of(obj, torch._C.TensorBase, {}))

    def made_on(self, storage: Any) -> tuple[str, int] | Literal["main thread"] | None:
        """Which thread made a captured storage's tensor: where a thread other than the main one
        entered the code it runs (file, line), or ``"main thread"``; None where not captured."""
        known = self._threads.get(id(storage))
        facts = storage_facts(storage) if known is not None else None
        if known is None or facts is None or known[:2] != facts[1:]:
            return None
        return known[2] or "main thread"

    def _stack(self, tensor: Any, frames: list[tuple[str, int, str]] | None = None) -> tuple[Site, ...]:
        frames = _frames_of(tensor) if frames is None else frames
        if not frames or _made_by_plugin(frames):
            return ()  # an object the plugin itself made, reading a tensor: no site of the user's
        return user_sites(frames)  # functions are named as a site is asked for: reading the source costs

    @staticmethod
    def _named(stack: tuple[Site, ...]) -> tuple[Site, ...]:
        return name_frames(stack)

    def object_site_of(self, tensor: Any) -> tuple[Site, ...] | None:
        """Where the tensor object itself was made, as captured or while tracing runs."""
        known = self._objects.get(id(tensor))
        if known is not None:
            return self._named(known)
        if not tracemalloc.is_tracing():
            return None
        return self._named(self._stack(tensor)) or None

    def view_site_of(self, tensor: Any, storage: Any) -> tuple[Site, ...] | None:
        """Where the tensor object kept was made, where the storage was captured made elsewhere by
        another tensor (the view a loop keeps of a batch: ``zip(ids, logits)`` keeps rows of
        ``logits``). Used where this recorder is the only source (a step check)."""
        known = self._sites.get(id(storage))
        facts = storage_facts(storage) if known is not None else None
        view = self._objects.get(id(tensor))
        if known is None or facts is None or known[:2] != facts[1:] or not view or not known[2]:
            return None
        return self._named(view) if view[0] != known[2][0] else None

    def site_of(self, tensor: Any, storage: Any) -> tuple[Site, ...] | None:
        """Where ``tensor`` (whose storage is ``storage``) was made, if recorded."""
        known = self._sites.get(id(storage))
        facts = storage_facts(storage) if known is not None else None
        if known is not None and facts is not None and known[:2] == facts[1:]:
            return self._named(known[2])
        if tracemalloc.is_tracing():
            return self._named(self._stack(tensor)) or None
        return None

    def clear(self) -> None:
        self._sites.clear()
        self._objects.clear()
        self._pointers.clear()


def _group_of(obj: Any, base: Any, tensor_classes: dict[type, bool]) -> tuple[Any, ...]:
    """dtype, shape and device of a tensor, as torch's objects (cheaper than their names; read
    through ``base``, ``torch._C.TensorBase``, with torch functions disabled); a storage object's
    class and size. ``tensor_classes``: which classes are tensors, as found so far."""
    cls = type(obj)
    tensor = tensor_classes.get(cls)
    if tensor is None:
        tensor = tensor_classes[cls] = is_tensor_type(cls)
    try:
        if not tensor:
            return (cls, cls.nbytes(obj))
        return (cls, base.dtype.__get__(obj), base.size(obj), base.device.__get__(obj))
    except Exception:  # a nested tensor has no single shape: grouped by its class
        return (cls,)


def _interned(groups: Iterable[Any]) -> list[Any]:
    """The groups as a list in which equal groups are one object: 10^5 alike tensors hold one
    group (with its shape and device objects), not 10^5 copies of it."""
    pool: dict[Any, Any] = {}
    return [pool.setdefault(group, group) for group in groups]


def groups_of(objects: list[Any], base: Any, *, distinct: bool = False) -> Any:
    """:func:`_group_of` of each object, read by torch's getters mapped over the list in C (the
    tensors apart from the storage objects of each class), or one at a time where one fails.
    With ``distinct``, the set of the groups met (no list of one per object is made)."""
    collect: Any = set if distinct else _interned
    classes = list(map(type, objects))
    tensor_classes = {cls: is_tensor_type(cls) for cls in set(classes)}
    try:
        if all(tensor_classes.values()):
            return collect(
                zip(
                    classes,
                    map(base.dtype.__get__, objects),
                    map(base.size, objects),  # (a torch.Size: a tuple, equal and hashed alike)
                    map(base.device.__get__, objects),
                    strict=True,
                )
            )
        if len(tensor_classes) == 1:
            (cls,) = tensor_classes
            return collect(zip(classes, map(cls.nbytes, objects), strict=True))  # type: ignore[attr-defined]
    except Exception:  # a nested tensor has no single shape: each object is read alone
        return collect(_group_of(obj, base, tensor_classes) for obj in objects)
    # Tensors and storage objects (or storage objects of several classes): each kind apart.
    kinds = list(map(tensor_classes.__getitem__, classes)) if any(tensor_classes.values()) else classes
    parts = {
        kind: groups_of(
            list(itertools.compress(objects, map(operator.eq, kinds, itertools.repeat(kind)))), base, distinct=distinct
        )
        for kind in set(kinds)
    }
    if distinct:
        return set().union(*parts.values())
    each = {kind: iter(groups) for kind, groups in parts.items()}
    return [next(each[kind]) for kind in kinds]


def _sample(objects: list[Any], base: Any) -> list[tuple[int, Any]]:
    """The positions of the last ``SITES_PER_GROUP`` objects of each group (see :func:`_group_of`),
    each with its group, last first: the groups met are found in one pass in C, which makes an
    object for each group rather than for each object (under tracing each object made costs more
    than the grouping), then the objects are read from the last until each group's are found."""
    wanted = dict.fromkeys(groups_of(objects, base, distinct=True), SITES_PER_GROUP)
    left = sum(wanted.values())
    taken: list[tuple[int, Any]] = []
    classes: dict[type, bool] = {}
    for index in range(len(objects) - 1, -1, -1):
        if not left:
            break
        group = _group_of(objects[index], base, classes)
        count = wanted.get(group, 0)
        if count:
            wanted[group] = count - 1
            taken.append((index, group))
            left -= 1
    return taken


ITEMS_NOTED = 64
"""How many items of each list, tuple or dict a returning function holds :class:`StorageSites` notes."""


def _with_items(values: list[Any]) -> Iterator[Any]:
    """``values``, each followed by the first :data:`ITEMS_NOTED` items of it where it is a list,
    tuple or dict (its values): exact built-in types only, whose iteration runs no user code."""
    for value in values:
        yield value
        kind = type(value)
        if kind is dict:
            yield from itertools.islice(value.values(), ITEMS_NOTED)
        elif kind is list or kind is tuple:
            yield from value[:ITEMS_NOTED]


def _own_storage(obj: Any) -> Any | None:
    """A tensor's (first) storage, or a storage object's own; None where it has none."""
    if not is_tensor_type(type(obj)):
        return obj
    storages = tensor_storages(obj)
    return storages[0] if storages else None


class StorageSites:
    """Where storages were allocated, seen from the tensors the user's functions hold as they return.

    :class:`SiteRecorder` sees where a Python tensor object was made. A tensor kept through a view
    (``inputs[0].detach()`` in a hook, a slice) is a new object made where the view was taken,
    while its storage was allocated where the batch was made, by a tensor that may be gone by the
    time a leak is named. So while this recorder runs (in one run of a test already found
    leaking), each function of the user's code that returns has its local tensors (and what it
    returns) noted, with those its local lists, tuples and dicts hold (the first
    :data:`ITEMS_NOTED` of each): the first tensor seen with a storage is where that storage was
    made, as tracemalloc recorded it, and a view seen stands for its base (``weights["a"][:8]``
    was not made where ``weights["a"]`` was allocated). It runs as a trace function on the test's
    thread, for calls only (line events off); where a tracer runs already (coverage, a debugger),
    it records nothing.
    """

    def __init__(self) -> None:
        self._storages: dict[tuple[int, int], tuple[Site, ...]] = {}
        self._tracing = False
        self._known_files: dict[str, bool] = {}
        self._tracer: Any = self._call
        self._on_return: Any = self._returning
        self._learn_file: Any = self._file_kind
        """The trace functions, kept out of ``torch.compile`` where it is loaded (see :func:`not_compiled`)."""

    def start(self) -> None:
        if sys.gettrace() is not None or not tracemalloc.is_tracing():
            return
        self._tracing = True
        self._on_return = not_compiled(self._returning)
        self._learn_file = not_compiled(self._file_kind)
        # the trace function runs for every call of every function the test makes: where torch's
        # compiler can be told to leave its frame alone, it runs as itself, without the wrapper
        # that keeps the compiler off it (a few microseconds a call: a compiling test ran 7x slower)
        self._tracer = self._call if skips_compiling(StorageSites._call.__code__) else not_compiled(self._call)
        sys.settrace(self._tracer)

    def stop(self) -> None:
        if self._tracing:
            self._tracing = False
            if sys.gettrace() == self._tracer:
                sys.settrace(None)

    def _file_kind(self, filename: str) -> bool:
        known = self._known_files[filename] = frame_kind_of_file(filename) == "user"
        return known

    def _call(self, frame: Any, event: str, argument: Any) -> Any:
        # (no call of a Python function but for a file not seen before: see start())
        if not self._tracing:
            return None
        filename = frame.f_code.co_filename
        known = self._known_files.get(filename)
        if known is None:
            known = self._learn_file(filename)
        if not known:
            return None
        frame.f_trace_lines = False
        return self._on_return

    def _returning(self, frame: Any, event: str, argument: Any) -> Any:
        if event == "return" and self._tracing:
            try:
                self._note([*frame.f_locals.values(), argument])
            except Exception:  # a frame that will not say: nothing noted
                pass
        return self._on_return if self._tracing else None

    def _note(self, values: list[Any]) -> None:
        import torch

        base_of: Any = vars(torch._C.TensorBase)["_base"].__get__  # (the C attribute: no subclass's code runs)
        for value in _with_items(values):
            if not is_tensor_type(type(value)):
                continue
            with torch._C.DisableTorchFunction():
                base = base_of(value)
                if base is not None:
                    value = base
                storages = tensor_storages(value)
            for storage in storages:
                facts = storage_facts(storage)  # (None for torch.compile's fake tensors: reading their pointer warns)
                if facts is None:
                    continue
                key = (facts[1], facts[2])
                if key[0] and key not in self._storages:
                    frames = _frames_of(value)
                    if frames and not _made_by_plugin(frames):
                        self._storages[key] = user_sites(frames)

    def site_of(self, tensor: Any, storage: Any) -> tuple[Site, ...] | None:
        facts = storage_facts(storage)
        if facts is None:
            return None
        stack = self._storages.get((facts[1], facts[2]))
        return SiteRecorder._named(stack) if stack else None

    def clear(self) -> None:
        self._storages.clear()

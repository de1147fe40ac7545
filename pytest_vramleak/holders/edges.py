"""Name a chain of objects ``[root, ..., target]`` as a :class:`~.paths.HolderPath`: its root's kind and each edge's.

Names come from exact-type checks and C-level descriptors, never from ``repr``, ``__getattr__`` or
``__eq__`` of the objects on the way: naming a holder must not run the user's code. Each kind of
parent has one small function, tried in the order of :data:`_EDGE_RULES`.
"""

from __future__ import annotations

import _thread
import collections
import contextvars
import functools
import itertools
import operator
import re
import sys
import types
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

from ..tracking import gc_functions as gc
from ..tracking.census import is_tensor_type
from ..tracking.saved_hooks import pack_state
from .paths import Edge, EdgeKind, HolderPath, Root, RootKind

_MODULE_NAMESPACES = ("_modules", "_parameters", "_buffers")
_LRU_WRAPPER_NAME = "_lru_cache_wrapper"
_MAX_KEY_TEXT = 60
_MODULE_NAMESPACE: Any = vars(types.ModuleType)["__dict__"]
"""A module's ``__dict__`` descriptor: its namespace, read without running any code of the module's."""
_HOOK_DICT = re.compile(r"_\w*_hooks")
PYTEST_WARNINGS = "the warnings pytest recorded"

NamedKind = Literal["fixture", "parametrize", "pytest", "step", "value"]
_ROLES: dict[str, RootKind] = {
    "fixture": "fixture",
    "parametrize": "parametrize",
    "step": "step",
    "value": "value",
    "pytest": "value",
}


class FrameLocal:
    """A root: a local variable of a frame still running, e.g. the test body around a step loop.

    A running frame's locals are not visible to ``gc.get_referrers``, so they are checked directly.
    """

    __slots__ = ("frame", "name", "value", "thread", "thread_id")

    def __init__(self, frame: types.FrameType, name: str, value: Any, thread: str = "", thread_id: int = 0) -> None:
        self.frame = frame
        self.name = name
        self.value = value
        self.thread = thread
        """The name of the thread the frame runs in, where it is not the one searching."""
        self.thread_id = thread_id
        """That thread's ident (``threading.get_ident()``)."""


class SearchStopped:
    """A root: the farthest holder the search backwards reached where it stopped at its depth
    (what holds that one was not looked for), standing for it at the start of a chain."""

    __slots__ = ("value", "levels")

    def __init__(self, value: Any, levels: int) -> None:
        self.value = value
        self.levels = levels


class NamedRoot:
    """A root the caller names: a value a test runner keeps for the whole session, written as the
    user wrote it (``fixture 'model' (module scope)``, ``parametrize value lr of test_fit[...]``)
    rather than through the runner's internals."""

    __slots__ = ("label", "value", "kind", "role", "name")

    def __init__(
        self, label: str, value: Any, kind: NamedKind = "value", role: RootKind | None = None, name: str = ""
    ) -> None:
        self.label = label
        self.value = value
        self.name = name
        """The name the user's code gives the value (a fixture's, a parametrize argument's), where it has one."""
        self.kind = kind
        """``fixture``, ``parametrize``, ``pytest``, ``step`` or ``value``: how a drawn graph labels it."""
        self.role: RootKind = role if role is not None else _ROLES[kind]
        """The root's kind on a holder path, which decides the diagnosis (what pytest keeps is
        given its own: its test's class instance, the warnings it recorded, record_property values)."""


def type_name(obj: Any) -> str:
    """The qualified name of ``obj``'s class, read without running any code of the object's."""
    name = type.__dict__["__qualname__"].__get__(type(obj))
    return name if type(name) is str else "?"


_MRO = type.__dict__["__mro__"]
_CLASS_DICT = type.__dict__["__dict__"]
_PLAIN_TYPES = frozenset(
    {dict, list, tuple, set, frozenset, str, bytes, int, float, types.FunctionType, types.ModuleType}
)


def _is_distribution(obj: Any) -> bool:
    """Whether ``obj`` is a ``torch.distributions`` distribution (where that module is loaded)."""
    distribution = getattr(sys.modules.get("torch.distributions.distribution"), "Distribution", None)
    return distribution is not None and issubclass(type(obj), distribution)


def has_reset(obj: Any) -> bool:
    """Whether ``obj``'s class, or one it derives from, defines ``reset`` (a metric, a meter),
    read from the classes' own dicts: no code of the object's or its class's runs."""
    kind = type(obj)
    if kind in _PLAIN_TYPES:
        return False
    try:
        return any("reset" in _CLASS_DICT.__get__(cls) for cls in _MRO.__get__(kind) if cls is not object)
    except Exception:  # a class whose dict cannot be read
        return False


def is_ndarray(obj: Any) -> bool:
    cls = type(obj)
    return cls.__name__ == "ndarray" and cls.__module__ == "numpy"


def instance_dict(obj: Any) -> dict[str, Any] | None:
    """``obj.__dict__`` read through its C descriptor, never through ``__getattribute__``."""
    value = _c_field(obj, "__dict__")
    return value if type(value) is dict else None


def _c_field(obj: Any, name: str) -> Any:
    """``obj``'s field ``name`` read through the descriptor in C (a slot, a getter) that the
    nearest class of its MRO to define ``name`` has; None where that class defines it otherwise
    (in Python: a property would run the object's code), none does, or reading fails."""
    for klass in type(obj).__mro__:
        descriptor = type.__dict__["__dict__"].__get__(klass).get(name)
        if descriptor is None:
            continue
        if type(descriptor) in (types.GetSetDescriptorType, types.MemberDescriptorType):
            try:
                return descriptor.__get__(obj, type(obj))
            except Exception:
                return None
        return None
    return None


def _slot_name(obj: Any, child: Any) -> str | None:
    for klass in type(obj).__mro__:
        for name, descriptor in type.__dict__["__dict__"].__get__(klass).items():
            if type(descriptor) is types.MemberDescriptorType and name != "__dict__":
                try:
                    if descriptor.__get__(obj, type(obj)) is child:
                        return str(name)
                except Exception:
                    continue
    return None


def _key_of(mapping: dict[Any, Any], child: Any) -> tuple[bool, Any]:
    for key, value in dict.items(mapping):
        if value is child:
            return True, key
    return False, None


def key_text(key: Any) -> str:
    """A dict key as source text, for key types whose ``repr`` is the interpreter's own."""
    if type(key) in (str, int, float, bool, bytes) or key is None:
        text = repr(key)
        if len(text) <= _MAX_KEY_TEXT:
            return text
        # cut in the middle: keys that differ at their end (file paths, ids) stay apart
        head = (_MAX_KEY_TEXT - 3) // 2
        return text[:head] + "..." + text[len(text) - (_MAX_KEY_TEXT - 3 - head) :]
    if type(key) is tuple:
        return "(" + ", ".join(key_text(k) for k in key) + ("," if len(key) == 1 else "") + ")"
    if type(key) is type:  # a class as a key (copyreg.dispatch_table, a registry): its name, read from C
        name = type.__dict__["__qualname__"].__get__(key)
        if type(name) is str:
            return name
    name = _own_name(key)
    return f"<{type_name(key)} {name!r}>" if name is not None else f"<{type_name(key)} key>"


def _own_name(obj: Any) -> str | None:
    """The ``name`` an object (not a tensor) keeps in its ``__dict__``, a slot or a field its class
    defines in C (a ``torch.fx`` node's, ``relu_3``), read without running its code, where it is a
    short string."""
    if is_tensor_type(type(obj)):
        return None  # (a tensor a dict is keyed by is named by the path to it, where one is asked for)
    values = instance_dict(obj)
    name = dict.get(values, "name") if values is not None else None
    if name is None:  # (a slot, or a field of a class in C)
        name = _c_field(obj, "name")
    return name if type(name) is str and 0 < len(name) <= _MAX_KEY_TEXT else None


def _frame_locals_view() -> type | None:
    """The type of a function frame's ``f_locals`` where it is a view of the frame (Python 3.13,
    PEP 667), not a snapshot dict; None before."""
    kind = type(sys._getframe().f_locals)
    return None if kind is dict else kind


FRAME_LOCALS_VIEW = _frame_locals_view()


def frame_locals(frame: types.FrameType) -> Any:
    """A frame's variables as a plain dict (a copy of 3.13's view, read in C), or what else ``f_locals`` is."""
    local_values = frame.f_locals
    return (
        dict(local_values)
        if FRAME_LOCALS_VIEW is not None and type(local_values) is FRAME_LOCALS_VIEW
        else local_values
    )


def _is_nn_module(obj: Any) -> bool:
    nn = sys.modules.get("torch.nn")
    return nn is not None and issubclass(type(obj), nn.Module)


def frame_text(frame: types.FrameType) -> str:
    """``function:line`` of a frame, the place its locals belong to."""
    return f"{frame.f_code.co_name}:{frame.f_lineno}"


def _module_name(module: Any) -> str:
    namespace = instance_dict(module) or {}
    name = namespace.get("__name__")
    return name if type(name) is str else "<module>"


def _made_at_run_time(module: Any, name: str) -> bool:
    """Whether a module was made by Python code rather than loaded: a spec without an origin (no
    file, no loader's), not built in, not a namespace package (``importlib.util.module_from_spec``
    of a spec made without a loader, then put in ``sys.modules``). A C extension's submodules have
    no spec. Read through the namespace: no module ``__getattr__`` runs. (Subclasses of ModuleType,
    torch.ops' namespaces and lazy modules, are asked by the caller no question.)"""
    namespace = instance_dict(module) or {}
    if type(namespace.get("__file__")) is str or "__path__" in namespace or name in sys.builtin_module_names:
        return False
    spec = instance_dict(namespace.get("__spec__"))
    return spec is not None and spec.get("origin") is None


def root_of(root: Any) -> Root:
    """The root a chain's first object is: a module, a running frame's local, a named value, or
    the farthest holder found, which something outside gc keeps."""
    if issubclass(type(root), types.ModuleType):
        name = _module_name(root)
        if type(root) is types.ModuleType and name != "<module>" and _made_at_run_time(root, name):
            return Root("run-time module", f"sys.modules[{name!r}]", "module", name=name)
        return Root("module", name, "module", name=name)
    if type(root) is FrameLocal:
        where = f"{frame_text(root.frame)} local '{root.name}'"
        if root.thread:
            label = f"thread '{root.thread}' {where}"
            return Root(
                "thread local", label, "frame local", root.name, root.thread, root.thread_id, has_reset(root.value)
            )
        return Root("frame local", where, "frame local", root.name, resets=has_reset(root.value))
    if type(root) is NamedRoot:
        return Root(root.role, root.label, root.kind, root.name, resets=has_reset(root.value))
    if type(root) is SearchStopped:
        kind = type(root.value).__qualname__
        label = f"<{kind} {root.levels} levels up, where the search for holders stopped>"
        return Root("search limit", label, type_name(root.value))
    if type(root) is types.FrameType:
        return Root("frame", f"frame {frame_text(root)}", "frame")
    if type(root) is type:
        return Root("class", f"class {root.__qualname__}", "class")
    if type(root) is types.FunctionType:  # (a hook torch keeps in C++: which one is its name)
        name = function_name(root)
        return Root("outside gc", f"<function {name} held outside Python's gc>", "function", name=name)
    if _is_node_hooks(root):
        return Root("outside gc", NODE_HOOKS, type_name(root))
    if type(root) is contextvars.Context:
        return Root("context", _context_label(root), "Context")
    return Root("outside gc", f"<{type(root).__qualname__} held outside Python's gc>", type_name(root))


def _context_label(context: Any) -> str:
    """``the context of thread 'MainThread'`` where ``context`` holds what this thread's context
    holds (a copy shares its mapping), else ``a thread's context``."""
    import threading

    mine = {id(obj) for obj in gc.get_referents(contextvars.copy_context()) if _is_hamt(obj)}
    if mine and not mine.isdisjoint(map(id, gc.get_referents(context))):
        return f"the context of thread {threading.current_thread().name!r}"
    return "a thread's context"


_HAMT = frozenset({"hamt", "hamt_bitmap_node", "hamt_array_node", "hamt_collision_node"})
"""The classes of the immutable mapping a contextvars Context keeps its variables' values in."""


def _is_hamt(obj: Any) -> bool:
    kind = type(obj)
    return kind.__name__ in _HAMT and kind.__module__ == "builtins"


def _context_value(objects: Sequence[Any], index: int) -> tuple[int, str] | None:
    """Where a chain's ``objects`` go from the Context at ``index`` through its mapping's nodes to a value:
    the value's position and the quoted name of the ContextVar set to it."""
    after = index + 1
    while after < len(objects) and _is_hamt(objects[after]):
        after += 1
    if after == index + 1 or after == len(objects):
        return None
    for variable, value in contextvars.Context.items(objects[index]):
        if value is objects[after]:
            return after, repr(variable.name)
    return None


NODE_HOOKS = "<the hooks of an autograd node (grad_fn.register_hook), held from C++ outside Python's gc>"
_HOOK_TYPES = frozenset({functools.partial, types.FunctionType, types.MethodType})


def _is_node_hooks(root: Any) -> bool:
    """Whether ``root``, which nothing gc sees refers to, is the hooks dict torch.utils.hooks keeps
    for an autograd node in C++: an OrderedDict of handle ids to callables (a tensor's and a
    module's hooks dicts are their attributes, seen by gc). Read through dict's C methods."""
    if type(root) is not collections.OrderedDict or not dict.__len__(root):
        return False
    return all(type(key) is int and type(value) in _HOOK_TYPES for key, value in dict.items(root))


def function_name(function: types.FunctionType) -> str:
    """``module.qualname`` of a function, read from its C attributes (no code of the function's runs)."""
    module = vars(types.FunctionType)["__module__"].__get__(function)
    qualname = vars(types.FunctionType)["__qualname__"].__get__(function)
    return f"{module}.{qualname}" if type(module) is str and type(qualname) is str else "?"


Mode = Any
"""What the previous edge knew about the object it led to: that a dict is an object's namespace
(``"attr"``), an ``nn.Module``'s (``"module-attr"``), a frame's locals (``"local"``), a
function's closure (``("closure", function)``), a closure's cell (``"cell"``), that a frame is an
unfinished generator's (``"suspended"``), or that a dict is a ``threading.local``'s table of each
thread's attributes (``"thread-local"``)."""
Named = tuple[EdgeKind | None, str, Mode]
"""An edge's kind (None: it reads as nothing, the next edge says it), its name, and the next mode."""


def _attribute(name: str) -> tuple[EdgeKind, str]:
    return ("hook dict" if _HOOK_DICT.fullmatch(name) else "attribute"), name


def _dict_edge(parent: Any, child: Any, mode: Mode) -> Named:
    found, key = _key_of(parent, child)
    if not found:
        return "dict key", "", None
    if mode == "module-attr" and key in _MODULE_NAMESPACES:
        return None, "", "attr"
    if mode in ("attr", "module-attr") and type(key) is str:
        return (*_attribute(key), None)
    if mode == "local" and type(key) is str:
        return "local", key, None
    if mode == "thread-local":
        return None, "", "attr"  # one thread's attributes of a threading.local, keyed by that thread
    return "item", key_text(key), None


def _tuple_subclass_edge(parent: Any, child: Any, mode: Mode) -> Named | None:
    """A named tuple's field (``batch.obs``), read by position and the class's ``_fields``; another
    tuple subclass's entry by position (``[1]``)."""
    index = _position(tuple.__iter__(parent), child)
    if index is None:
        return None
    classes = _MRO.__get__(type(parent))
    fields = next((space["_fields"] for cls in classes if "_fields" in (space := _CLASS_DICT.__get__(cls))), None)
    if type(fields) is tuple and index < len(fields) and type(fields[index]) is str:
        return "attribute", fields[index], None
    return "item", str(index), None


def _thread_local_edge(parent: Any, child: Any, mode: Mode) -> Named | None:
    """A ``threading.local``'s table of each thread's attributes reads as nothing: its attribute is the next edge."""
    return (None, "", "thread-local") if type(child) is dict else None


def _sequence_edge(parent: Any, child: Any, mode: Mode) -> Named:
    if type(mode) is tuple and mode[0] == "closure":
        names = mode[1].__code__.co_freevars
        for index, cell in enumerate(parent):
            if cell is child and index < len(names):
                return "closure variable", names[index], "cell"
    position = _position(parent, child)
    if position is not None:
        return "item", str(position), None
    return "container item", type(parent).__name__, None


def _position(items: Iterable[Any], child: Any) -> int | None:
    """Where ``child`` itself (not an equal object: no ``__eq__`` runs) stands in ``items``; None where it does not."""
    matches = list(map(operator.is_, items, itertools.repeat(child)))
    return matches.index(True) if True in matches else None


def _array_edge(parent: Any, child: Any) -> Named:
    """An item of a numpy array of Python objects (``[2]``, ``[1, 0]``), else the array's base."""
    ndarray = type(parent)
    try:
        if ndarray.dtype.__get__(parent).hasobject:
            for index, item in enumerate(ndarray.ravel(parent)):
                if item is child:
                    position = sys.modules["numpy"].unravel_index(index, ndarray.shape.__get__(parent))
                    return "item", ", ".join(str(int(number)) for number in position), None
    except Exception:  # (a structured dtype's records)
        pass
    return "array base", "", None


def _cell_edge(parent: Any, child: Any, mode: Mode) -> Named:
    return (None if mode == "cell" else "cell contents"), "", None


def _module_edge(parent: Any, child: Any, mode: Mode) -> Named:
    if child is _MODULE_NAMESPACE.__get__(parent):
        return None, "", "attr"
    return "module state", "", None  # what a C module keeps outside its namespace


def _class_edge(parent: Any, child: Any, mode: Mode) -> Named:
    if child is type.__dict__["__dict__"].__get__(parent) or type(child) is dict:
        return None, "", "attr"
    return "class internals", "", None


def _function_edge(parent: Any, child: Any, mode: Mode) -> Named:
    if child is parent.__closure__:
        return None, "", ("closure", parent)
    for name in ("__defaults__", "__kwdefaults__", "__globals__"):
        if getattr(parent, name) is child:
            return "attribute", name, ("attr" if name == "__globals__" else None)
    if child is instance_dict(parent):
        return None, "", "attr"
    return "function internals", "", None


def _method_edge(parent: Any, child: Any, mode: Mode) -> Named:
    return "attribute", ("__self__" if child is parent.__self__ else "__func__"), None


def _frame_edge(parent: Any, child: Any, mode: Mode) -> Named:
    try:
        local_names = frame_locals(parent)
    except Exception:
        local_names = {}
    if child is local_names:
        return None, "", "local"
    found, key = _key_of(local_names, child) if type(local_names) is dict else (False, None)
    if found:
        return ("suspended local" if mode == "suspended" else "local"), str(key), None
    if child is parent.f_back:
        return "calling frame", "", None
    return "frame internals", "", None


_SUSPENDED_FRAME = {
    types.GeneratorType: "gi_frame",
    types.CoroutineType: "cr_frame",
    types.AsyncGeneratorType: "ag_frame",
}


def _suspended_edge(parent: Any, child: Any, mode: Mode) -> Named | None:
    """A generator's (or coroutine's) local: from Python 3.11 on, gc sees the locals of its
    suspended frame as the generator's own references, with no frame object between."""
    frame = _SUSPENDED_FRAME[type(parent)]
    try:
        suspended = getattr(parent, frame)
    except Exception:
        return None
    if suspended is None:
        return None
    if suspended is child:  # (before 3.11 gc shows the frame between)
        return None, "", "suspended"
    return _frame_edge(suspended, child, "suspended")


def _traceback_edge(parent: Any, child: Any, mode: Mode) -> Named:
    if child is parent.tb_frame:
        return "traceback frame", frame_text(child), None
    return "next traceback", "", None


def _exception_edge(parent: Any, child: Any, mode: Mode) -> Named | None:
    for name in ("__traceback__", "__context__", "__cause__", "args"):
        if BaseException.__dict__[name].__get__(parent, type(parent)) is child:
            return ("traceback" if name == "__traceback__" else "attribute"), name, None
    return None


def _lru_edge(parent: Any, child: Any, mode: Mode) -> Named:
    return ("lru_cache" if type(child) is dict else "lru_cache entry"), "", None


def _object_edge(parent: Any, child: Any, mode: Mode) -> Named:
    """An object's attribute (read from its ``__dict__`` or slots), a tensor's hooks, or a reference unnamed."""
    field = _tensor_field(parent, child)
    if field is not None:
        return field
    namespace = instance_dict(parent)
    if child is namespace:
        return None, "", ("module-attr" if _is_nn_module(parent) else "attr")
    if namespace is not None:
        found, key = _key_of(namespace, child)
        if found and type(key) is str:
            if key in _MODULE_NAMESPACES and _is_nn_module(parent):
                return None, "", "attr"  # Python 3.13 keeps attributes inline: gc shows no namespace dict between
            return (*_attribute(key), None)
    slot = _slot_name(parent, child)
    if slot is not None:
        return "attribute", slot, None
    return "reference", type(parent).__qualname__, None


_TENSOR_HOOKS = ("_backward_hooks", "_post_accumulate_grad_hooks")
"""The hooks dicts a tensor keeps in C: ``register_hook``'s and ``register_post_accumulate_grad_hook``'s."""


def _tensor_field(parent: Any, child: Any) -> Named | None:
    """The edge from tensor ``parent`` to what it keeps in C that ``child`` is: a hooks dict, or
    the autograd node it was made by (a custom ``autograd.Function``'s ctx: its backward node, in
    Python), read with torch function handling off (a subclass's handler is the user's code); None
    where ``child`` is neither, or ``parent`` no tensor."""
    torch = sys.modules.get("torch")
    if torch is None or not is_tensor_type(type(parent)):
        return None
    base = torch._C.TensorBase
    for name in _TENSOR_HOOKS:
        try:
            if getattr(base, name).__get__(parent) is child:
                return "tensor hooks", name, None
        except Exception:  # (a torch without it)
            continue
    try:
        with torch._C.DisableTorchFunction():
            if base.grad_fn.__get__(parent) is child:
                return "attribute", "grad_fn", None
    except Exception:
        pass
    return None


_FUTURE_FIELDS = ("_result", "_exception")
"""What an asyncio future (a task) keeps once done, read through the C getters of ``_asyncio.Future``."""


def _is_c_future(kind: type) -> bool:
    """Whether ``kind`` is asyncio's C ``Future`` (``Task`` is one) or a subclass of it."""
    future = getattr(sys.modules.get("_asyncio"), "Future", None)
    return future is not None and issubclass(kind, future)


def _future_edge(parent: Any, child: Any, mode: Mode) -> Named | None:
    """A C future's (a task's) result, exception, or the exception's traceback (which it keeps
    apart); its other references as any object's."""
    fields = type.__dict__["__dict__"].__get__(sys.modules["_asyncio"].Future)
    for name in _FUTURE_FIELDS:
        try:
            value = fields[name].__get__(parent)
        except Exception:  # (a Python without the getter)
            continue
        if value is child:
            return (*_attribute(name), None)
        if name == "_exception" and value is not None and _TRACEBACK.__get__(value) is child:
            return "attribute", "_exception.__traceback__", None
    return None


_TRACEBACK = BaseException.__dict__["__traceback__"]


def _is_lru_wrapper(kind: type) -> bool:
    return kind.__name__ == _LRU_WRAPPER_NAME and kind.__module__ == "functools"


_EDGE_RULES: list[tuple[Callable[[type], bool], Callable[[Any, Any, Mode], Named | None]]] = [
    (
        lambda kind: kind is FrameLocal or kind is NamedRoot or kind is SearchStopped,
        lambda parent, child, mode: (None, "", None),
    ),
    (lambda kind: issubclass(kind, dict), _dict_edge),
    (lambda kind: kind in (list, tuple, collections.deque), _sequence_edge),
    (lambda kind: issubclass(kind, tuple), _tuple_subclass_edge),  # (a named tuple: its fields by name)
    (lambda kind: kind.__name__ == "ndarray" and kind.__module__ == "numpy", lambda p, c, m: _array_edge(p, c)),
    (lambda kind: kind is types.CellType, _cell_edge),
    (lambda kind: kind in (set, frozenset), lambda parent, child, mode: ("set element", "", None)),
    (lambda kind: issubclass(kind, types.ModuleType), _module_edge),
    (lambda kind: issubclass(kind, type), _class_edge),
    (lambda kind: kind is types.FunctionType, _function_edge),
    (lambda kind: kind is types.MethodType, _method_edge),
    (lambda kind: kind is types.FrameType, _frame_edge),
    (lambda kind: kind in _SUSPENDED_FRAME, _suspended_edge),
    (lambda kind: issubclass(kind, _thread._local), _thread_local_edge),
    (lambda kind: kind is types.TracebackType, _traceback_edge),
    (lambda kind: issubclass(kind, BaseException), _exception_edge),  # (other references: as any object's)
    (_is_lru_wrapper, _lru_edge),
    (_is_c_future, _future_edge),
]
"""Which function names an edge, by the class of the object it leaves: the first that applies and
names it; :func:`_object_edge` for the rest."""


def name_edge(parent: Any, child: Any, mode: Mode) -> Named:
    """How the reference ``parent -> child`` reads, and the mode for the next edge (see :data:`Mode`)."""
    kind = type(parent)
    for applies, name in _EDGE_RULES:
        if applies(kind):
            found = name(parent, child, mode)
            if found is not None:
                return found
    return _object_edge(parent, child, mode)


def _named_logger(chain: Sequence[Any]) -> tuple[int, str] | None:
    """Where a chain reaches a logger through the table logging keeps of them (a ``Manager``'s
    ``loggerDict``, from whichever module's logger the search came by): its position and name."""
    logging = sys.modules.get("logging")
    if logging is None:
        return None
    for index in range(2, len(chain) - 1):
        logger, table, manager = chain[index], chain[index - 1], chain[index - 2]
        if (
            type(manager) is not logging.Manager
            or not issubclass(type(logger), logging.Logger)
            or type(table) is not dict
        ):
            continue
        attributes = instance_dict(manager) or {}
        name = (instance_dict(logger) or {}).get("name")
        if attributes.get("loggerDict") is table and type(name) is str:
            return index, name
    return None


def _named_thread(chain: Sequence[Any]) -> tuple[int, Root] | None:
    """Where a chain reaches a thread through the tables ``threading`` keeps of the threads started
    and not ended (``_active``, ``_limbo``): its position, and a root that names the thread."""
    threading = sys.modules.get("threading")
    if threading is None:
        return None
    tables = [table for table in (getattr(threading, "_active", None), getattr(threading, "_limbo", None)) if table]
    for index in range(1, len(chain) - 1):
        table, thread = chain[index - 1], chain[index]
        if type(table) is not dict or not any(table is known for known in tables):
            continue
        if not issubclass(type(thread), threading.Thread):
            continue
        name = (instance_dict(thread) or {}).get("_name")
        if type(name) is str:
            label = f"thread {name!r} ({type(thread).__qualname__}, not ended)"
            return index, Root("thread", label, type_name(thread), name=name)
    return None


def holder_path(chain: Sequence[Any]) -> HolderPath:
    """The path ``[root, ..., target]`` is: its root, then each edge that reads as something (an
    object's namespace dict reads as nothing: its attribute is the next edge). A path through
    logging's table of loggers starts at the logger, as the user gets it: ``logging.getLogger('stats')``."""
    logger = _named_logger(chain)
    if logger is not None:
        index, name = logger
        rest = holder_path(chain[index:])
        root = Root("module", f"logging.getLogger({name!r})", type_name(chain[index]), name="logging")
        return HolderPath(root, rest.edges)
    thread = _named_thread(chain)
    if thread is not None:
        index, root = thread
        return HolderPath(root, holder_path(chain[index:]).edges)
    edges: list[Edge] = []
    mode: Mode = None
    hooks_state = pack_state()
    position = 0
    while position < len(chain) - 1:
        parent, child = chain[position], chain[position + 1]
        variable = _context_value(chain, position) if type(parent) is contextvars.Context else None
        if variable is not None:  # (the mapping's nodes between read as the variable)
            position, name = variable
            edges.append(Edge("context variable", name, type_name(chain[position])))
            mode = None
            continue
        try:
            kind, name, mode = name_edge(parent, child, mode)
        except Exception:
            kind, name, mode = "reference", type_name(child), None
        if kind is not None:
            edges.append(
                Edge(
                    kind,
                    name,
                    type_name(child),
                    has_reset(child),
                    hooks_state.get(id(child), ""),
                    issubclass(type(child), BaseException),
                    _is_distribution(child),
                )
            )
        position += 1
    return HolderPath(root_of(chain[0]), tuple(edges))

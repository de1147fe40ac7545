"""The pack hooks of ``torch.autograd.graph.saved_tensors_hooks`` entered while checks run, so that a
holder search can tell the state such a hook stores tensors in.

A pack hook is called for every tensor autograd saves for backward, and what it returns is handed
to its unpack hook when backward needs the tensor. A pack hook that stores the tensor itself (an
offloading dict keyed by a counter, as in PyTorch's docs) lets it go only in the unpack hook, that
is, only when backward runs: a forward pass under the hooks whose backward never runs leaves every
saved activation in its store. A search backward from such a tensor finds the store (a module's
``OFFLOAD.storage[12]``) and nothing that says a hook filled it.

While a check runs, :class:`SavedTensorHooks` wraps the function every ``saved_tensors_hooks``
calls as it is entered (``torch._C._autograd._push_saved_tensors_default_hooks``) to note each pack
hook by weak reference (a bound method through :class:`weakref.WeakMethod`). :func:`pack_state`
then says which objects are a noted hook's state: the object a bound method is bound to, and what
a function's closure cells and the globals its code names hold (containers and instances, not
modules, functions or classes). PyTorch's own hooks (``torch.utils.checkpoint``'s) are left out:
they have a diagnosis of their own. No code of the hooks runs.
"""

from __future__ import annotations

import sys
import types
import weakref
from typing import Any

_noted: list[weakref.ref[Any]] = []
"""A weak reference (or :class:`weakref.WeakMethod`) to each pack hook noted, oldest first."""

_NOT_STATE = (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType, type)


def _torch_autograd() -> Any:
    torch_c = sys.modules.get("torch._C")
    return getattr(torch_c, "_autograd", None)


def _note(pack_hook: Any) -> None:
    # (read from the function, never from the hook object: a callable of the user's runs no code here)
    function = pack_hook.__func__ if type(pack_hook) is types.MethodType else pack_hook
    module = function.__module__ if type(function) is types.FunctionType else type(pack_hook).__module__
    module = module if type(module) is str else ""
    if module == "torch" or module.startswith("torch."):
        return
    ref: weakref.ref[Any] = (
        weakref.WeakMethod(pack_hook) if type(pack_hook) is types.MethodType else weakref.ref(pack_hook)
    )
    _noted[:] = [noted for noted in _noted if noted() is not None]
    if not any(_same(noted(), pack_hook) for noted in _noted):  # (a loop enters the same hooks each step)
        _noted.append(ref)


def _same(one: Any, other: Any) -> bool:
    """Whether two hooks are one: a bound method is made anew at each ``obj.pack``."""
    if type(one) is types.MethodType and type(other) is types.MethodType:
        return one.__self__ is other.__self__ and one.__func__ is other.__func__
    return one is other


def _state_of(hook: Any) -> list[Any]:
    """The objects a hook keeps what it stores in (see the module docstring)."""
    if type(hook) is types.MethodType:
        return [hook.__self__]
    if type(hook) is not types.FunctionType:
        return [hook]  # a callable object: its own attributes are its state
    found = []
    for cell in hook.__closure__ or ():
        try:
            found.append(cell.cell_contents)
        except ValueError:  # an empty cell
            continue
    namespace = hook.__globals__
    found += [namespace[name] for name in hook.__code__.co_names if name in namespace]
    return [value for value in found if not issubclass(type(value), _NOT_STATE)]  # (isinstance may read __class__)


def pack_state() -> dict[int, str]:
    """``id(object) -> the hook's name`` for each object a noted pack hook that is still alive keeps
    its state in. Ids are valid while the caller holds the objects it asks about."""
    state: dict[int, str] = {}
    for ref in _noted:
        hook = ref()
        if hook is None:
            continue
        name = getattr(hook, "__qualname__", None) or type(hook).__qualname__
        for value in _state_of(hook):
            state.setdefault(id(value), name)
    return state


class SavedTensorHooks:
    """Wraps the entry point of ``saved_tensors_hooks`` while started; see the module docstring."""

    _NAME = "_push_saved_tensors_default_hooks"

    def __init__(self) -> None:
        self._original: Any = None
        self._wrapper: Any = None

    def start(self) -> None:
        autograd = _torch_autograd()
        original = getattr(autograd, self._NAME, None)
        if original is None or (self._wrapper is not None and original is self._wrapper):
            return

        def push(pack_hook: Any, unpack_hook: Any) -> Any:
            pushed = original(pack_hook, unpack_hook)
            try:
                _note(pack_hook)
            except Exception:  # noting is for naming only: never the caller's failure
                pass
            return pushed

        self._original, self._wrapper = original, push
        setattr(autograd, self._NAME, push)

    def stop(self) -> None:
        """Put back what was there, unless something else replaced the wrapper meanwhile."""
        autograd = _torch_autograd()
        if self._wrapper is not None and getattr(autograd, self._NAME, None) is self._wrapper:
            setattr(autograd, self._NAME, self._original)
        self._original = self._wrapper = None

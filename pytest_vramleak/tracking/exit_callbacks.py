"""The callbacks registered with ``atexit`` while checks run, so that a holder search can name them.

CPython keeps every ``atexit.register(func, *args)`` (the callback and its arguments) in C, where gc
does not see it: a search backward from a tensor that only such a callback keeps stops at a
function "held outside Python's gc". While a check runs, :class:`ExitCallbacks` wraps
``atexit.register`` to note each callback and argument, by weak reference: they are alive exactly
as long as something else (``atexit`` itself) keeps them, and a callback ``atexit.unregister``
drops is forgotten with it. No code of the callbacks runs.

A bound method is noted through its object (``writer`` of ``atexit.register(writer.flush)``):
``atexit`` keeps the method object it was given, which cannot be referred to weakly, and the
method keeps its object, which is what the search meets.
"""

from __future__ import annotations

import atexit
import types
import weakref
from typing import Any

_noted: list[tuple[str, weakref.ref[Any]]] = []
"""``(label, weak reference)`` for each callback (or its object) and argument noted, oldest first."""


def _callback_name(func: Any) -> str:
    name = getattr(type(func), "__qualname__", "?")
    if type(func) is types.MethodType:
        return f"{type(func.__self__).__qualname__}.{getattr(func.__func__, '__name__', '?')}"
    if isinstance(func, types.FunctionType):
        return func.__qualname__
    return f"a {name}"


def _weakly(value: Any) -> weakref.ref[Any] | None:
    try:
        return weakref.ref(value)
    except TypeError:  # (an int, a str, a tuple: nothing a search would stop at)
        return None


def _note(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    name = _callback_name(func)
    found: list[tuple[str, Any]] = []
    if type(func) is types.MethodType:
        found.append((f"atexit callback {name} -> __self__", func.__self__))
    else:
        found.append((f"atexit callback {name}", func))
    found += [(f"atexit callback {name}: argument {index + 1}", value) for index, value in enumerate(args)]
    found += [(f"atexit callback {name}: argument {key}", value) for key, value in kwargs.items()]
    _noted[:] = [(label, ref) for label, ref in _noted if ref() is not None]
    for label, value in found:
        ref = _weakly(value)
        if ref is not None:
            _noted.append((label, ref))


def noted() -> list[tuple[str, Any]]:
    """``(label, object)`` for each callback (or its object) and argument noted that is still alive."""
    alive = [(label, ref()) for label, ref in _noted]
    return [(label, value) for label, value in alive if value is not None]


class ExitCallbacks:
    """Wraps ``atexit.register`` while started; see the module docstring."""

    def __init__(self) -> None:
        self._original: Any = None
        self._wrapper: Any = None

    def start(self) -> None:
        original = atexit.register
        if self._wrapper is not None and original is self._wrapper:
            return

        def register(func: Any, *args: Any, **kwargs: Any) -> Any:
            registered = original(func, *args, **kwargs)
            try:
                _note(func, args, kwargs)
            except Exception:  # noting is for naming only: never the caller's failure
                pass
            return registered

        register.__doc__ = original.__doc__
        self._original, self._wrapper = original, register
        atexit.register = register  # type: ignore[assignment]

    def stop(self) -> None:
        """Put back what was there, unless something else replaced the wrapper meanwhile."""
        if self._wrapper is not None and atexit.register is self._wrapper:
            atexit.register = self._original
        self._original = self._wrapper = None

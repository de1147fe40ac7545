"""What the tracker knows of one storage and one tensor: weak references and the facts last read.

A :class:`StorageRef` is a weak reference to a storage object with its size, device, address and
the clock it was first seen at; its callback reports the storage's death. A :class:`TensorRef` is
a weak reference to a tensor, and an :class:`Entry` what was last read of it. None of them keeps
the object alive, so indexing a tensor never changes when it dies.
"""

from __future__ import annotations

import operator
import weakref
from collections.abc import Callable
from typing import Any


def _call(function: Callable[[], Any]) -> Any:
    return function()


call: Callable[[Callable[[], Any]], Any] = getattr(operator, "call", _call)
"""``operator.call`` (Python 3.11) where there is one: dereferences weak references fastest in ``map``."""


class StorageRef(weakref.ref):  # type: ignore[type-arg]
    """A weak reference to a storage object, with what the tracker knows of the storage."""

    __slots__ = ("ident", "nbytes", "device", "pointer", "born", "users", "adopted")
    ident: int
    nbytes: int
    device: str
    pointer: int
    born: int
    """The tracker's clock when the storage was first seen."""
    users: tuple[int, ...]
    """Ids of the indexed tensors that used the storage when last read (a tuple of ints, which
    Python's collector stops tracking: a list would add an object to every walk of the heap for
    each indexed storage)."""
    adopted: bool
    """Made while a test set up, by a fixture of a wider scope: the fixture's, never the test's."""


class TensorRef(weakref.ref):  # type: ignore[type-arg]
    """A weak reference to an indexed tensor; its callback lets the index forget the tensor."""

    __slots__ = ("ident",)
    ident: int


class _Nothing:
    pass


NO_GRAD: weakref.ref[Any] = weakref.ref(_Nothing())  # dead at once: calling it gives None


class Entry:
    """What the tracker last read of one tensor."""

    __slots__ = ("ref", "storages", "grad", "capable", "version", "born")

    def __init__(self, ref: weakref.ref[Any], born: int = 0) -> None:
        self.ref = ref
        self.born = born
        """The tracker's clock when the tensor was first read."""
        self.version = -1
        """The tensor's version counter when last read: an in-place operation moves it."""
        self.storages: tuple[StorageRef, ...] = ()
        self.grad: weakref.ref[Any] = NO_GRAD
        """The gradient last read; a reference that is always dead where there was none."""
        self.capable = False
        """A leaf that requires grad, or a tensor that retains its gradient: backward can give it one."""

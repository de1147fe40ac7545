"""What the tracker knows of one storage and one tensor: weak references and the facts last read.

A :class:`StorageRef` is a weak reference to a storage object with its size, device, address and
the clock it was first seen at; its callback reports the storage's death. An :class:`Entry` is
a weak reference to a tensor with what was last read of it. Neither keeps the object alive, so
indexing a tensor never changes when it dies.
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


class _Nothing:
    pass


NO_GRAD: weakref.ref[Any] = weakref.ref(_Nothing())  # dead at once: calling it gives None


class Entry(weakref.ref):  # type: ignore[type-arg]
    """A weak reference to an indexed tensor with what the tracker last read of it: one object per
    tensor (a reference and a record apart add a second object to every walk of the heap for each
    tensor kept). Its callback lets the index forget the tensor. Made by :func:`new_entry`."""

    __slots__ = ("ident", "storages", "grad", "capable", "version", "born")
    ident: int
    """The tensor's ``id()``, its key in the index."""
    born: int
    """The tracker's clock when the tensor was first read."""
    version: int
    """The tensor's version counter when last read: an in-place operation moves it."""
    storages: StorageRef | tuple[StorageRef, ...]
    """The storages the tensor used when last read: the one storage itself, the common case (a
    tuple of one would add an object to every walk of the heap for each tensor kept), else a tuple
    (none, or several: nested tensors). :func:`storages_of` gives a tuple either way."""
    grad: weakref.ref[Any]
    """The gradient last read; a reference that is always dead where there was none."""
    capable: bool
    """A leaf that requires grad, or a tensor that retains its gradient: backward can give it one."""


def new_entry(tensor: Any, callback: Callable[[Entry], Any] | None = None, born: int = 0) -> Entry:
    """An entry for ``tensor``, nothing read of it yet (TypeError where it takes no weak reference)."""
    entry = Entry(tensor, callback)
    entry.ident = id(tensor)
    entry.born = born
    entry.version = -1
    entry.storages = ()
    entry.grad = NO_GRAD
    entry.capable = False
    return entry


def storages_of(entry: Entry) -> tuple[StorageRef, ...]:
    """The storages an entry's tensor used when last read, as a tuple."""
    storages = entry.storages
    return (storages,) if type(storages) is StorageRef else storages  # type: ignore[return-value]


def sole_storage(entry: Entry) -> StorageRef | None:
    """The one storage an entry's tensor used when last read; None where it used none or several."""
    storages = entry.storages
    return storages if type(storages) is StorageRef else None

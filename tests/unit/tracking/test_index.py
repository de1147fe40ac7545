"""Reading a tensor into the index: a tensor read for the first time is indexed by a shorter way, which
must leave the index and the ledger as the general way (``tensor_storages`` and ``register``) does."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

import pytest_vramleak.tracking.index as index_module
from pytest_vramleak.tracking.census import tensor_storages
from pytest_vramleak.tracking.index import Index, storage_readers
from pytest_vramleak.tracking.ledger import Ledger
from pytest_vramleak.tracking.refs import NO_GRAD, Entry, StorageRef, storages_of


class _Recording(Ledger):
    """A ledger that notes what the index tells it, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, int, int]] = []

    def seen(self, ref: StorageRef) -> None:
        self.calls.append(("seen", ref.ident, ref.born))
        super().seen(ref)

    def tensor_seen(self, entry: Entry) -> None:
        self.calls.append(("tensor_seen", entry.ident, entry.born))
        super().tensor_seen(entry)

    def resized(self, ref: StorageRef, delta: int) -> None:
        self.calls.append(("resized", ref.ident, delta))
        super().resized(ref, delta)


class _Sub(torch.Tensor):
    pass


class _Unreadable(torch.Tensor):
    """A subclass whose ``retains_grad`` raises: it is indexed no further than its version counter."""

    @property
    def retains_grad(self) -> bool:  # type: ignore[override]
        raise RuntimeError("unreadable")


def _tensors() -> tuple[list[Any], torch.Tensor, torch.Tensor]:
    """One of each kind of tensor the index reads; the plain tensor that views share, and a tensor
    given a gradient by hand."""
    base = torch.ones(4)
    leaf = torch.ones(3, requires_grad=True)
    (leaf * 2).sum().backward()  # a leaf with a gradient
    middle = leaf * 3
    middle.retain_grad()
    middle.sum().backward()  # a tensor with a graph, that retains its gradient
    given = torch.ones(2)
    given.grad = torch.zeros(2)  # a gradient on a tensor that takes none from backward
    with warnings.catch_warnings():  # (nested tensors are a prototype)
        warnings.simplefilter("ignore")
        nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    tensors = [
        base,
        base[1:],  # views: the storage is indexed already
        base.view(2, 2),
        leaf,
        leaf.grad,
        middle,
        middle.grad,
        leaf.exp(),  # a graph that saved its result
        nested,
        torch.ones(0),  # an empty storage (it can grow in place)
        torch.ones(5, device="meta"),  # a storage that holds no memory
        torch.ones(2, 2).to_sparse(),
        torch.ones(2).as_subclass(_Sub),
        torch.ones(2).as_subclass(_Unreadable),
        given,
        given.grad,
    ]
    if torch.backends.mkldnn.is_available():
        tensors.append(torch.ones(4).to_mkldnn())  # opaque: stands for its own storage
    return tensors, base, given


def _names(tensors: list[Any]) -> dict[int, str]:
    """A name for each tensor and each of its storages, the same from one set of ``_tensors()`` to the next."""
    names: dict[int, str] = {}
    with torch._C.DisableTorchFunction():
        for number, tensor in enumerate(tensors):
            names.setdefault(id(tensor), f"t{number}")
            for part, storage in enumerate(tensor_storages(tensor)):
                names.setdefault(id(storage), f"t{number}.{part}")
    return names


def _index(*, when: str, stored: bool) -> dict[str, Any]:
    """Read a new set of ``_tensors()`` into a new index twice, the plain one grown in place and the
    gradient given by hand dropped between; return all the index and the ledger recorded, each tensor
    and storage by its name."""
    tensors, base, given = _tensors()
    ledger = _Recording()
    if when != "between-tests":
        ledger.start()
    if when == "older-than-the-test":
        ledger.born_override = ledger.begin_clock - 1  # (as the tracker indexes the rest of the heap late)
    index = Index(ledger)
    with torch._C.DisableTorchFunction():
        if stored:  # the storage object found before the tensors (a scan meets both)
            index.register(base.untyped_storage(), None)
        for tensor in tensors:
            index.read_tensor(tensor, set(), [])
        base.resize_(8)
        given.grad = None
        ledger.clock += 1
        for tensor in tensors:
            index.read_tensor(tensor, set(), [])
    name = _names(tensors).__getitem__
    entries = {
        name(ident): (
            entry() is not None,
            entry.born,
            entry.version,
            [name(ref.ident) for ref in storages_of(entry)],
            None if entry.grad() is None else name(id(entry.grad())),
            entry.capable,
        )
        for ident, entry in index.entries.items()
    }
    storages = {
        name(ident): (name(ref.ident), ref.nbytes, ref.device, ref.pointer != 0, ref.born, [*map(name, ref.users)])
        for ident, ref in index.storages.items()
    }
    kinds = index.kinds
    lists = [sorted(map(name, kept)) for kept in (kinds.capable, kinds.capable_new, kinds.retainers, kinds.plain)]
    return {
        "entries": entries,
        "storages": storages,
        "totals": dict(index.totals),
        "opaque": sorted(map(name, index.opaque)),
        "kind lists": lists,
        "ledger calls": [(call, name(ident), number) for call, ident, number in ledger.calls],
        "young tensors": [name(entry.ident) for entry in ledger.young_tensors],
        "young storages": [name(ref.ident) for ref in ledger.young],
    }


@pytest.mark.parametrize("stored", [False, True], ids=["tensors-first", "storage-first"])
@pytest.mark.parametrize("when", ["between-tests", "during-a-test", "older-than-the-test"])
def test_a_tensor_read_first_is_indexed_as_the_general_way_indexes_it(
    monkeypatch: pytest.MonkeyPatch, when: str, stored: bool
) -> None:
    short = _index(when=when, stored=stored)
    untyped_storage, _ = storage_readers()

    def is_nested(tensor: Any) -> bool:
        raise RuntimeError("the general way")  # every storage read through tensor_storages and register

    monkeypatch.setattr(index_module, "storage_readers", lambda: (untyped_storage, is_nested))
    general = _index(when=when, stored=stored)
    for part, expected in general.items():
        assert short[part] == expected, part
    # what is compared has what it is meant to: every tensor, a growth, a gradient, an opaque tensor
    assert sorted(short["entries"]) == sorted(f"t{number}" for number in range(len(_tensors()[0])))
    assert ("resized", "t0.0", 16) in short["ledger calls"]
    assert short["entries"]["t3"][4] == "t4"  # the leaf's gradient
    assert short["entries"]["t14"][4] is None  # a gradient set to None since the first read is forgotten
    assert short["opaque"] == (["t16"] if torch.backends.mkldnn.is_available() else [])


def test_a_plain_tensor_read_first_uses_its_one_storage() -> None:
    ledger = Ledger()
    ledger.start()
    index = Index(ledger)
    tensor = torch.ones(4)
    view = tensor[2:]
    with torch._C.DisableTorchFunction():
        index.read_tensor(tensor, set(), [])
        index.read_tensor(view, set(), [])
    storage = tensor.untyped_storage()
    ref = index.storages[id(storage)]
    for read in (tensor, view):
        entry = index.entries[id(read)]
        assert entry() is read and entry.storages is ref
        assert (entry.born, entry.version, entry.grad, entry.capable) == (ledger.clock, 0, NO_GRAD, False)
    assert ref() is storage and ref.users == (id(tensor), id(view))
    assert (ref.nbytes, ref.device, ref.pointer, ref.born) == (16, "cpu", storage.data_ptr(), ledger.clock)
    assert index.totals == {"cpu": 16}
    assert ledger.young == [ref] and [entry() for entry in ledger.young_tensors] == [tensor, view]

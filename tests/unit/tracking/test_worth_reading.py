"""Which tensors a search for some storages reads: picked in C, none it needs left out."""

from __future__ import annotations

import warnings

import torch

from pytest_vramleak.tracking.census import only_worth_reading


def _kept(objects: list[object], pointers: set[int]) -> list[int]:
    with warnings.catch_warnings(), torch._C.DisableTorchFunction():
        warnings.simplefilter("error")  # (reading the gradient of a tensor that is not a leaf warns)
        return [id(obj) for obj in only_worth_reading(objects, pointers)]


def test_only_what_is_over_the_storages_or_has_a_graph_or_gradient_is_read() -> None:
    wanted, other = torch.ones(4), torch.ones(4)
    leaf = torch.ones(3, requires_grad=True)
    (leaf * 2).sum().backward()
    with_graph = leaf * 3
    not_a_leaf = leaf + 1  # (its gradient is never read)
    meta = torch.empty(2, device="meta")
    storage, another_storage = wanted.untyped_storage(), torch.ones(2).untyped_storage()
    objects: list[object] = [other, wanted, storage, another_storage, leaf, with_graph, meta, not_a_leaf.detach()]
    kept = _kept(objects, {wanted.untyped_storage().data_ptr()})
    assert kept == [id(wanted), id(storage), id(leaf), id(with_graph), id(meta)]


def test_every_storage_object_is_read_where_one_is_on_the_meta_device() -> None:
    storage, meta = torch.ones(2).untyped_storage(), torch.empty(2, device="meta").untyped_storage()
    assert _kept([storage, meta], set()) == [id(storage), id(meta)]


def test_every_object_is_read_where_a_tensor_has_no_single_storage() -> None:
    dense, sparse = torch.ones(4), torch.ones(2, 2).to_sparse()
    objects: list[object] = [dense, sparse]
    assert _kept(objects, set()) == [id(dense), id(sparse)]

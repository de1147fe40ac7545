"""Caches: one without eviction leaks, one with a bound does not."""

from __future__ import annotations

import collections
import functools
import itertools

import pytest
import torch
from models import Classifier

MODEL = Classifier()
EMBEDDINGS: dict[str, torch.Tensor] = {}
USERS = itertools.count()  # a service keeps meeting users it has not seen before
LENGTHS = itertools.count(512, 64)  # and batches padded to lengths it has not seen before


def embed_user(user_id: str) -> torch.Tensor:
    if user_id not in EMBEDDINGS:
        with torch.no_grad():
            EMBEDDINGS[user_id] = MODEL.encoder(torch.randn(1, 128))
    return EMBEDDINGS[user_id]


@pytest.mark.vram_budget(leak="64 KiB")
def test_embedding_cache_without_eviction():
    """Leaks: every user ever seen stays in EMBEDDINGS."""
    for _ in range(100):
        embed_user(f"user-{next(USERS)}")


@functools.lru_cache(maxsize=None)
def featurize(length: int) -> torch.Tensor:
    return torch.randn(length, 128)


@pytest.mark.vram_budget
def test_unbounded_lru_cache():
    """Leaks: functools.lru_cache(maxsize=None) keeps every result, one per length seen."""
    for _ in range(3):
        featurize(next(LENGTHS))


class BoundedCache:
    def __init__(self, size: int) -> None:
        self.size = size
        self.items: collections.OrderedDict[int, torch.Tensor] = collections.OrderedDict()

    def put(self, key: int, value: torch.Tensor) -> None:
        self.items[key] = value
        self.items.move_to_end(key)
        while len(self.items) > self.size:
            self.items.popitem(last=False)


def test_bounded_cache_plateaus(vramleak):
    """No leak: the cache fills during the first steps, then evicts as fast as it adds."""
    cache = BoundedCache(size=3)
    for step in vramleak.steps(12, warmup=2):
        cache.put(step, torch.randn(256, 128))

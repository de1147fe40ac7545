"""A leak check in PyTorch's style, for comparison: collect garbage and count live tensor storages
before and after every test (what ``CudaMemoryLeakCheck`` does with allocator counters on CUDA).

Loaded by ``benchmarks/run.py`` with ``-p naive_check``; not part of the plugin.
"""

from __future__ import annotations

import gc
from collections.abc import Generator
from typing import Any

import pytest
import torch


def live_storage_bytes() -> int:
    gc.collect()
    seen: dict[int, int] = {}
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor):
            try:
                storage = obj.untyped_storage()
            except Exception:
                continue
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    before = live_storage_bytes()
    try:
        return (yield)
    finally:
        if live_storage_bytes() > before:
            item.add_report_section("call", "naive_check", "tensor memory grew")

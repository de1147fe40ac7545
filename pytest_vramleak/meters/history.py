"""CUDA allocator history: where each live block was allocated, and snapshots for PyTorch's viewer.

With ``--vramleak-trace`` the caching allocator records its history (bounded) while a checked
test runs. For a leaking test the plugin saves a snapshot file that PyTorch's memory viewer
(https://pytorch.org/memory_viz) opens, and reads from it the Python stack that allocated each
leaked block, which also covers tensors made inside C++ (gradients made by ``backward()``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from ..tracking.sites import Site, frame_kind_of_file

MAX_ENTRIES = 100_000
"""Allocation events the history keeps; older ones are dropped."""


class AllocatorHistory:
    """Records one CUDA device's allocator history while active; ``memory`` is ``torch.cuda.memory``."""

    def __init__(self, memory: Any, device_index: int) -> None:
        self.memory = memory
        self.device_index = device_index
        self.recording = False

    def start(self) -> None:
        self.memory._record_memory_history(enabled="all", context="alloc", stacks="python", max_entries=MAX_ENTRIES)
        self.recording = True

    def stop(self) -> None:
        if self.recording:
            self.recording = False
            self.memory._record_memory_history(enabled=None)

    def save(self, folder: Path, nodeid: str) -> Path:
        """Write a snapshot for the memory viewer; the file is named after the test."""
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / (re.sub(r"[^\w.-]+", "_", nodeid).strip("_") + ".pickle")
        self.memory._dump_snapshot(os.fspath(path))
        return path

    def sites(self) -> BlockSites:
        """Where each live block of the device was allocated, read from the allocator's snapshot."""
        return BlockSites.from_snapshot(self.memory._snapshot(), self.device_index)


class BlockSites:
    """Allocation stacks of live blocks by address, answering like :class:`SiteRecorder`."""

    def __init__(self, stacks: dict[int, tuple[Site, ...]]) -> None:
        self.stacks = stacks

    @classmethod
    def from_snapshot(cls, snapshot: dict[str, Any], device_index: int) -> BlockSites:
        stacks: dict[int, tuple[Site, ...]] = {}
        for segment in snapshot.get("segments", []):
            if segment.get("device", device_index) != device_index:
                continue
            for block in segment.get("blocks", []):
                if block.get("state") == "active_allocated":
                    stacks[int(block["address"])] = user_frames(block.get("frames", []))
        return cls(stacks)

    def site_of(self, tensor: Any, storage: Any) -> tuple[Site, ...] | None:
        return self.stacks.get(storage.data_ptr()) or None


def user_frames(frames: list[dict[str, Any]]) -> tuple[Site, ...]:
    """The user's frames of an allocator stack (innermost first), torch's and pytest's left out."""
    return tuple(
        (frame["filename"], int(frame["line"]), frame["name"])
        for frame in frames
        if frame_kind_of_file(str(frame.get("filename", ""))) == "user"
    )[:4]

"""A fake CUDA backend with the memory API of ``torch.cuda``, for testing the CUDA code paths on CPU."""

from __future__ import annotations

from dataclasses import dataclass, field

# The units the tests move a fake's figures in.
MIB = 1024**2
GIB = 1024**3


@dataclass
class FakeMemory:
    """``torch.cuda.memory``'s history functions: records calls, dumps and snapshots a fixed history."""

    blocks: list[dict[str, object]] = field(default_factory=list)
    calls: list[object] = field(default_factory=list)

    def _record_memory_history(self, enabled: object = "all", **options: object) -> None:
        self.calls.append(enabled)

    def _snapshot(self, device: object = None) -> dict[str, object]:
        return {"segments": [{"device": 0, "blocks": self.blocks}]}

    def _dump_snapshot(self, filename: str) -> None:
        with open(filename, "wb") as stream:
            stream.write(b"snapshot")


@dataclass
class FakeCuda:
    """Per-device allocated, reserved and peak figures that a test moves by hand."""

    devices: int = 1
    allocated: dict[int, int] = field(default_factory=dict)
    reserved: dict[int, int] = field(default_factory=dict)
    peak: dict[int, int] = field(default_factory=dict)
    synchronized: list[int] = field(default_factory=list)
    available: bool = True
    initialized: bool = True
    total: int = 80 * 1024**3
    driver_extra: dict[int, int] = field(default_factory=dict)
    """Device memory the driver counts outside the allocator (context, loaded kernels)."""
    pending_frees: dict[int, list[int]] = field(default_factory=dict)
    """Frees that land at the next synchronize, like memory released by work still queued."""
    asked_driver: list[int] = field(default_factory=list)
    memory: FakeMemory = field(default_factory=FakeMemory)
    peak_reserved: dict[int, int] = field(default_factory=dict)
    pinned: list[int] = field(default_factory=lambda: [0, 0])
    """Pinned host memory: bytes handed out now, and the most since the last reset."""

    def is_available(self) -> bool:
        return self.available

    def device_count(self) -> int:
        return self.devices

    def current_device(self) -> int:
        return 0

    def synchronize(self, index: int = 0) -> None:
        self.synchronized.append(index)
        pending = self.pending_frees.get(index, [])
        if pending:
            self.free(index, pending.pop(0))

    def is_initialized(self) -> bool:
        return self.initialized

    def mem_get_info(self, index: int = 0) -> tuple[int, int]:
        self.asked_driver.append(index)
        used = self.reserved.get(index, 0) + self.driver_extra.get(index, 0)
        return self.total - used, self.total

    def get_device_properties(self, index: int = 0) -> object:
        return type("Properties", (), {"total_memory": self.total})()

    def empty_cache(self) -> None:
        self.reserved = dict(self.allocated)

    def memory_stats(self, index: int = 0) -> dict[str, int]:
        return {
            "inactive_split_bytes.all.current": max(0, self.reserved.get(index, 0) - self.allocated.get(index, 0)) // 2
        }

    def allocate(self, index: int, nbytes: int) -> None:
        self.allocated[index] = self.allocated.get(index, 0) + nbytes
        self.reserve(index, max(0, self.allocated[index] - self.reserved.get(index, 0)))
        self.peak[index] = max(self.peak.get(index, 0), self.allocated[index])

    def reserve(self, index: int, nbytes: int) -> None:
        """The allocator reserves more from the driver (a new segment) without handing it out."""
        self.reserved[index] = self.reserved.get(index, 0) + nbytes
        self.peak_reserved[index] = max(self.peak_reserved.get(index, 0), self.reserved[index])

    def pin(self, nbytes: int) -> None:
        self.pinned[0] += nbytes
        self.pinned[1] = max(self.pinned[1], self.pinned[0])

    def host_memory_stats(self) -> dict[str, int]:
        return {"active_bytes.current": self.pinned[0], "active_bytes.peak": self.pinned[1]}

    def reset_peak_host_memory_stats(self) -> None:
        self.pinned[1] = self.pinned[0]

    def max_memory_reserved(self, index: int = 0) -> int:
        return self.peak_reserved.get(index, 0)

    def free(self, index: int, nbytes: int) -> None:
        self.allocated[index] -= nbytes

    def memory_allocated(self, index: int = 0) -> int:
        return self.allocated.get(index, 0)

    def memory_reserved(self, index: int = 0) -> int:
        return self.reserved.get(index, 0)

    def max_memory_allocated(self, index: int = 0) -> int:
        return self.peak.get(index, 0)

    def reset_peak_memory_stats(self, index: int = 0) -> None:
        self.peak[index] = self.allocated.get(index, 0)
        self.peak_reserved[index] = self.reserved.get(index, 0)


class FakeAccelerator:
    def __init__(self, kind: str | None) -> None:
        self.kind = kind

    def is_available(self) -> bool:
        return self.kind is not None

    def current_accelerator(self) -> object:
        return type("Device", (), {"type": self.kind})()

    def current_device_index(self) -> int:
        return 0


class FakeTorch:
    """Just enough of ``torch`` for device resolution."""

    def __init__(self, cuda: FakeCuda, accelerator: str | None = "cuda") -> None:
        self.cuda = cuda
        self.accelerator = FakeAccelerator(accelerator)


@dataclass
class CountingAllocator(FakeCuda):
    """An accelerator's allocator whose counter is the bytes of the CPU tensors that the test
    modules (``test_*``) hold, through dicts, lists, tuples, sets and torch modules: the plugin's accelerator path
    (the allocator says how much, the tracker names which tensors) driven by real tensors on a
    machine without one. It reads no frozen list (a census would refreeze the heap as it ends,
    which no allocator does). Its tests' tensors are whole, not views."""

    def memory_allocated(self, index: int = 0) -> int:
        import sys

        import torch

        seen: set[int] = set()
        storages: dict[int, int] = {}
        stack = [vars(module) for name, module in list(sys.modules.items()) if name.startswith("test_")]
        while stack:
            obj = stack.pop()
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            if isinstance(obj, torch.Tensor):  # (untyped_storage() would make a storage object the tracker reads)
                storages[obj.data_ptr()] = obj.nbytes
            elif isinstance(obj, dict):
                stack.extend(obj.values())
            elif isinstance(obj, (list, tuple, set)):
                stack.extend(obj)
            elif isinstance(obj, torch.nn.Module):
                stack.extend([*obj.parameters(), *obj.buffers()])
        return sum(storages.values())

    def max_memory_allocated(self, index: int = 0) -> int:
        return self.memory_allocated(index)

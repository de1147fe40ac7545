from __future__ import annotations

import pytest
import torch

from pytest_vramleak import Budget, judge_budget
from pytest_vramleak.devices import CpuMeter, CudaMeter, DeviceUnavailable, make_meter, resolve_device

from .fakes import FakeCuda, FakeTorch

MIB = 1024**2


@pytest.mark.parametrize(
    ("spec", "accelerator", "expected"),
    [
        ("auto", "cuda", "cuda:0"),
        ("auto", None, "cpu"),
        (None, None, "cpu"),
        ("cpu", "cuda", "cpu"),
        ("cuda", "cuda", "cuda:0"),
        ("cuda:1", "cuda", "cuda:1"),
        ("CUDA:1", "cuda", "cuda:1"),
    ],
)
def test_resolve_device(spec: str | None, accelerator: str | None, expected: str) -> None:
    assert resolve_device(spec, FakeTorch(FakeCuda(devices=2), accelerator)) == expected


def test_resolve_device_names_a_missing_device() -> None:
    with pytest.raises(DeviceUnavailable, match=r"cuda:3 is not available \(2 cuda device\(s\) present\)"):
        resolve_device("cuda:3", FakeTorch(FakeCuda(devices=2)))
    with pytest.raises(DeviceUnavailable, match="device cuda is not available"):
        resolve_device("cuda", FakeTorch(FakeCuda(available=False), None))


@pytest.mark.parametrize("spec", ["tpu", "cuda:x", "gpu0"])
def test_resolve_device_rejects_unknown_names(spec: str) -> None:
    with pytest.raises(ValueError, match="unknown device"):
        resolve_device(spec, FakeTorch(FakeCuda()))


def test_cuda_meter_reads_allocated_bytes_after_synchronizing() -> None:
    cuda = FakeCuda(devices=2)
    meter = CudaMeter("cuda:1", cuda)
    cuda.allocate(1, 3 * MIB)
    cuda.allocate(0, 7 * MIB)
    meter.settle()
    assert cuda.synchronized == [1]
    assert meter.allocated_bytes() == 3 * MIB
    assert meter.details() == {"reserved_bytes": 3 * MIB}


def test_cuda_meter_clears_cublas_workspaces_before_measuring() -> None:
    cuda = FakeCuda()
    cuda.allocate(0, 8 * MIB)  # a cuBLAS workspace created by the test's first matmul
    meter = CudaMeter("cuda:0", cuda, clear_workspaces=lambda: cuda.free(0, 8 * MIB))
    meter.settle()
    assert meter.allocated_bytes() == 0


def test_cuda_meter_peak_is_measured_above_the_level_at_start() -> None:
    cuda = FakeCuda()
    meter = CudaMeter("cuda:0", cuda)
    cuda.allocate(0, 10 * MIB)
    cuda.allocate(0, 5 * MIB)
    cuda.free(0, 5 * MIB)  # an earlier peak that must not count
    meter.start_peak()
    cuda.allocate(0, 2 * MIB)
    cuda.free(0, 2 * MIB)
    assert meter.stop_peak() == 2 * MIB


def test_cuda_leak_verdict_from_allocator_figures() -> None:
    cuda = FakeCuda()
    meter = CudaMeter("cuda:0", cuda)
    baseline = meter.allocated_bytes()
    cuda.allocate(0, 4 * MIB)
    verdict = judge_budget(Budget(leak=64 * 1024), meter.name, meter.allocated_bytes() - baseline, None)
    assert verdict.outcome == "leaked"
    assert verdict.message == "leaked 4.0 MiB on cuda:0, allowed 64.0 KiB"


def test_cuda_reserved_without_allocated_is_not_a_leak() -> None:
    cuda = FakeCuda()
    meter = CudaMeter("cuda:0", cuda)
    baseline = meter.allocated_bytes()
    cuda.allocate(0, 8 * MIB)
    cuda.free(0, 8 * MIB)  # freed, but the caching allocator keeps the block reserved
    assert meter.details() == {"reserved_bytes": 8 * MIB}
    assert judge_budget(Budget(), meter.name, meter.allocated_bytes() - baseline, None).outcome == "passed"


def test_make_meter_picks_the_device_kind() -> None:
    assert isinstance(make_meter("cpu", torch), CpuMeter)
    meter = make_meter("cuda:0", torch)
    assert isinstance(meter, CudaMeter) and meter.backend is torch.cuda


def test_cpu_meter_peak_sees_memory_freed_before_the_end() -> None:
    meter = CpuMeter(torch)
    meter.start_peak()
    block = torch.ones(MIB // 4)  # 1 MiB
    del block
    small = torch.ones(256)
    peak = meter.stop_peak()
    del small
    assert peak is not None and MIB <= peak < MIB + 64 * 1024


def test_cpu_meter_peak_does_not_count_memory_freed_from_before() -> None:
    earlier = torch.ones(MIB // 4)
    meter = CpuMeter(torch)
    meter.start_peak()
    del earlier
    block = torch.ones(1024)
    peak = meter.stop_peak()
    del block
    assert peak == 4096


def test_cpu_meter_counts_storages_once() -> None:
    meter = CpuMeter(torch)
    meter.settle()
    before = meter.allocated_bytes()
    big = torch.ones(MIB // 4)
    views = [big[:10], big[5:], big.view(2, -1)]
    assert meter.allocated_bytes() - before == MIB
    del big, views

"""Which device a run measures and how its meters read it: the CPU's storages, CUDA's allocator through a fake."""

from __future__ import annotations

import pytest
import torch

from pytest_vramleak import Budget, judge_budget
from pytest_vramleak.meters.devices import (
    CpuMeter,
    CudaMeter,
    DeviceUnavailable,
    explain_reserved,
    make_meter,
    measure_growth,
    resolve_device,
)

from ...fakes import MIB, FakeCuda, FakeTorch


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


def test_auto_is_the_cpu_where_the_accelerator_torch_reports_cannot_start() -> None:
    # A CUDA build that reports a device it cannot initialize (no driver): the header and each
    # test's meter get the CPU, not torch's RuntimeError.
    fake = FakeTorch(FakeCuda(devices=1), "cuda")

    def no_driver() -> int:
        raise RuntimeError("Found no NVIDIA driver on your system")

    fake.accelerator.current_device_index = no_driver  # type: ignore[method-assign]
    assert resolve_device("auto", fake) == "cpu"


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
    assert meter.details() == {"reserved_bytes": 3 * MIB, "inactive_split_bytes": 0, "driver_used_bytes": 3 * MIB}


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
    assert meter.details()["reserved_bytes"] == 8 * MIB
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


def _operators_recorded() -> bool:
    """Whether torch's operator callbacks are on: a user scope reaches a profiler."""
    with torch.autograd.profiler.profile() as profile, torch.autograd.profiler.record_function("probe"):
        pass
    return any(event.name == "probe" for event in profile.function_events)


def test_cpu_meter_peak_records_allocations_alone_and_puts_operators_back(monkeypatch: pytest.MonkeyPatch) -> None:
    autograd = torch._C._autograd
    kinds: list[str] = []

    def disable(options: object, _disable=autograd._disable_profiler_legacy) -> object:
        events = _disable(options)
        kinds.extend(event.kind() for thread in events for event in thread)
        return events

    monkeypatch.setattr(autograd, "_disable_profiler_legacy", disable)
    meter = CpuMeter(torch)
    meter.start_peak()
    block = torch.ones(1024).neg()
    del block
    assert meter.stop_peak() == 8192
    assert kinds.count("memory_alloc") == 4  # two tensors made and freed
    assert kinds.count("push") == 1  # the mark alone: no operator
    assert _operators_recorded()


def test_cpu_meter_peak_leaves_operator_callbacks_off_where_they_were() -> None:
    torch._C._autograd._enable_record_function(False)
    try:
        meter = CpuMeter(torch)
        meter.start_peak()
        meter.stop_peak()
        assert not _operators_recorded()
    finally:
        torch._C._autograd._enable_record_function(True)


def test_a_profiler_started_while_the_cpu_peak_is_measured_records_operators() -> None:
    meter = CpuMeter(torch)
    meter.start_peak()
    assert _operators_recorded()
    assert meter.stop_peak() is None


def test_cpu_meter_counts_storages_once() -> None:
    meter = CpuMeter(torch)
    meter.settle()
    before = meter.allocated_bytes()
    big = torch.ones(MIB // 4)
    views = [big[:10], big[5:], big.view(2, -1)]
    assert meter.allocated_bytes() - before == MIB
    del big, views


def test_first_settle_warms_the_device_once() -> None:
    warmed: list[int] = []
    meter = CudaMeter("cuda:1", FakeCuda(devices=2), warm_up=warmed.append)
    meter.settle()
    meter.settle()
    assert warmed == [1]


def test_allocator_and_driver_both_grew_is_a_leak() -> None:
    cuda = FakeCuda()
    meter = CudaMeter("cuda:0", cuda)
    baseline, driver = meter.allocated_bytes(), meter.driver_bytes()
    cuda.allocate(0, 4 * MIB)
    growth = measure_growth(meter, baseline, driver, allowed=0)
    assert (growth.allocated, growth.driver, growth.measurements) == (4 * MIB, 4 * MIB, 3)
    assert growth.note(0) == "driver-level usage grew 4.0 MiB, the allocator's 4.0 MiB"


def test_allocator_only_growth_is_reported_as_the_allocators_view() -> None:
    cuda = FakeCuda()
    meter = CudaMeter("cuda:0", cuda)
    cuda.allocate(0, 8 * MIB)
    cuda.free(0, 8 * MIB)  # 8 MiB cached: the next allocation needs nothing from the driver
    baseline, driver = meter.allocated_bytes(), meter.driver_bytes()
    cuda.allocate(0, 4 * MIB)
    growth = measure_growth(meter, baseline, driver, allowed=0)
    assert growth.allocated == 4 * MIB and growth.driver == 0
    assert "the allocator's view" in growth.note(0)


def test_driver_only_growth_is_not_the_tests_leak() -> None:
    cuda = FakeCuda()
    meter = CudaMeter("cuda:0", cuda)
    baseline, driver = meter.allocated_bytes(), meter.driver_bytes()
    cuda.driver_extra[0] = 64 * MIB  # kernels compiled at run time grow the context
    growth = measure_growth(meter, baseline, driver, allowed=0)
    assert growth.allocated == 0 and growth.measurements == 1
    assert judge_budget(Budget(), "cuda:0", growth.allocated, None).outcome == "passed"
    assert (
        growth.note(0)
        == "driver-level usage grew 64.0 MiB while the allocator's did not (kernels or libraries loaded into the context): not the test's leak"
    )


def test_false_positive_cleared_by_measuring_again() -> None:
    cuda = FakeCuda()
    meter = CudaMeter("cuda:0", cuda)
    baseline = meter.allocated_bytes()
    cuda.allocate(0, 4 * MIB)
    cuda.pending_frees[0] = [0, 4 * MIB]  # the free lands at the second synchronize
    growth = measure_growth(meter, baseline, None, allowed=0)
    assert (growth.allocated, growth.measurements, growth.driver) == (0, 2, None)


def test_driver_figure_never_asked_of_an_uninitialised_device() -> None:
    cuda = FakeCuda(initialized=False)
    meter = CudaMeter("cuda:0", cuda)
    assert meter.driver_bytes() is None
    assert "driver_used_bytes" not in meter.details()
    assert cuda.asked_driver == []


def test_reserved_without_allocated_is_explained() -> None:
    cuda = FakeCuda()
    cuda.allocate(0, 16 * MIB)
    cuda.free(0, 12 * MIB)
    meter = CudaMeter("cuda:0", cuda)
    assert explain_reserved(meter.details(), meter.allocated_bytes()) == (
        "12.0 MiB reserved but not allocated: blocks the caching allocator keeps for reuse "
        "(torch.cuda.empty_cache() returns them), not a leak; 6.0 MiB of it in split blocks (fragmentation)"
    )
    assert explain_reserved({"reserved_bytes": MIB}, MIB) == ""


def test_each_device_is_measured_on_its_own() -> None:
    cuda = FakeCuda(devices=2)
    first, second = CudaMeter("cuda:0", cuda), CudaMeter("cuda:1", cuda)
    baselines = [(m, m.allocated_bytes(), m.driver_bytes()) for m in (first, second)]
    cuda.allocate(1, 2 * MIB)
    growth = {m.name: measure_growth(m, b, d, allowed=0).allocated for m, b, d in baselines}
    assert growth == {"cuda:0": 0, "cuda:1": 2 * MIB}


@pytest.mark.parametrize(
    ("worker", "devices", "visible", "initialized", "expected", "environ_after"),
    [
        ("gw0", 4, "", False, "CUDA_VISIBLE_DEVICES=0", "0"),
        ("gw5", 4, "", False, "CUDA_VISIBLE_DEVICES=1", "1"),
        ("gw1", 2, "4,6", False, "CUDA_VISIBLE_DEVICES=6", "6"),
        ("gw3", 2, "", True, "cuda:1", ""),
        ("gw0", 1, "", False, None, ""),
        ("master", 4, "", False, None, ""),
    ],
)
def test_pin_worker(
    worker: str, devices: int, visible: str, initialized: bool, expected: str | None, environ_after: str
) -> None:
    from pytest_vramleak.meters.devices import pin_worker

    cuda = FakeCuda(devices=devices, initialized=initialized)
    chosen: list[int] = []
    cuda.set_device = chosen.append  # type: ignore[attr-defined]
    environ = {"CUDA_VISIBLE_DEVICES": visible} if visible else {}
    assert pin_worker(worker, FakeTorch(cuda), environ) == expected
    assert environ.get("CUDA_VISIBLE_DEVICES", "") == (environ_after or visible)
    assert chosen == ([int(expected.partition(":")[2])] if expected and expected.startswith("cuda:") else [])

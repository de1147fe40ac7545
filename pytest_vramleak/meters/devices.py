"""Where memory is measured: one meter per device, all with the same small interface.

- CUDA: the caching allocator's ``memory_allocated`` after a synchronize, the peak from its peak
  statistics. Reserved memory is reported beside it but never counted as a leak: the allocator
  keeps freed blocks cached on purpose.
- Other accelerators (XPU, MPS) through ``torch.accelerator`` and ``torch.mps`` where present.
- CPU: torch keeps no CPU allocator statistics, so allocated bytes are a census of live tensor
  storages (see :mod:`pytest_vramleak.tracking.census`) and the peak comes from the allocation events of
  torch's legacy profiler, which records CPU allocations and frees on the calling thread without
  printing anything.

Every meter takes its torch module as an argument so unit tests can drive the logic with a fake.
"""

from __future__ import annotations

import itertools
import operator
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from ..judging.sizes import format_size
from ..tracking import gc_functions as gc
from ..tracking.census import take_census
from ..tracking.torch_api import default_device

if TYPE_CHECKING:
    from .peaks import PeakBreakdown

_CPU_OUT_OF_MEMORY = ("DefaultCPUAllocator: can't allocate memory", "DefaultCPUAllocator: not enough memory")


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is an allocator running out of memory: ``torch.OutOfMemoryError`` on
    accelerators, the CPU allocator's ``RuntimeError`` on CPU."""
    import sys

    torch = sys.modules.get("torch")
    out_of_memory = getattr(torch, "OutOfMemoryError", None)
    if out_of_memory is not None and isinstance(error, out_of_memory):
        return True
    return type(error) is RuntimeError and any(text in str(error) for text in _CPU_OUT_OF_MEMORY)


def clear_torch_caches(torch: Any) -> None:
    """Free what PyTorch caches for itself and its own test suite clears before measuring: the
    autocast cache, and compiled graphs where ``torch._dynamo`` is in use."""
    torch.clear_autocast_cache()
    import sys

    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        dynamo.reset()


class DeviceUnavailable(Exception):
    """The requested device is not present in this process."""


class Meter(Protocol):
    """Measures one device's memory."""

    name: str

    @property
    def keeps_counters(self) -> bool:
        """Whether the device's allocator counts what it allocates (CUDA, XPU, MPS); where it does
        not (CPU), a check measures with the tracker's ledger of storages."""

    def settle(self) -> None:
        """Collect garbage and wait for queued work, so a measurement sees only what is still held."""

    def allocated_bytes(self) -> int:
        """Bytes of tensor memory allocated on the device now."""

    def start_peak(self) -> None:
        """Start watching for the highest allocation from now on."""

    def stop_peak(self) -> int | None:
        """Most bytes allocated above the level at ``start_peak``; None where it cannot be known."""

    def details(self) -> dict[str, int]:
        """Other figures worth showing beside allocated bytes (e.g. ``reserved_bytes``)."""


def resolve_device(spec: str | None, torch: Any) -> str:
    """Turn ``auto``, ``cpu``, ``cuda``, ``cuda:N``, ``mps`` or ``xpu`` into a device name.

    ``auto`` is the current accelerator where there is one that starts, else ``cpu``. A device that is not
    present raises :class:`DeviceUnavailable` with the reason.
    """
    spec = (spec or "auto").strip().lower()
    if spec == "auto":
        return default_device(torch)
    if spec == "cpu":
        return "cpu"
    kind, _, index_text = spec.partition(":")
    if kind not in ("cuda", "mps", "xpu"):
        raise ValueError(f"unknown device {spec!r}; use auto, cpu, cuda, cuda:N, mps or xpu")
    if index_text and not (index_text.isascii() and index_text.isdigit()):
        raise ValueError(f"unknown device {spec!r}; the index after ':' must be a number")
    backend = getattr(torch, kind, None)
    if backend is None or not backend.is_available():
        raise DeviceUnavailable(f"device {spec} is not available in this process (no {kind} device)")
    if kind == "mps":
        return "mps"
    count = backend.device_count()
    index = int(index_text) if index_text else backend.current_device()
    if index >= count:
        raise DeviceUnavailable(f"device {kind}:{index} is not available ({count} {kind} device(s) present)")
    return f"{kind}:{index}"


def pin_worker(worker_id: str, torch: Any, environ: Any) -> str | None:
    """Give a pytest-xdist worker (``gw0``, ``gw1``, ...) its own GPU: worker K gets GPU K modulo
    the number of GPUs. Before CUDA is initialised this narrows ``CUDA_VISIBLE_DEVICES`` to that
    GPU, so ``cuda`` and ``cuda:0`` mean it for every test on the worker; after, it sets the
    current device. Returns what was done, or None where there is nothing to pin."""
    number = worker_id.removeprefix("gw")
    if not number.isdigit() or not torch.cuda.is_available():
        return None
    count = torch.cuda.device_count()
    if count < 2:
        return None
    index = int(number) % count
    if not torch.cuda.is_initialized():
        visible = [v for v in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
        chosen = visible[index] if len(visible) == count else str(index)
        environ["CUDA_VISIBLE_DEVICES"] = chosen
        return f"CUDA_VISIBLE_DEVICES={chosen}"
    torch.cuda.set_device(index)
    return f"cuda:{index}"


@dataclass
class CudaMeter:
    """The caching allocator of one CUDA device (or any backend with CUDA's memory API)."""

    keeps_counters: ClassVar[bool] = True
    name: str
    backend: Any
    """``torch.cuda``, or a fake with the same functions in unit tests."""
    clear_workspaces: Callable[[], None] | None = None
    """cuBLAS keeps a workspace per handle and stream in the caching allocator, created by the first
    matmul; PyTorch's own leak check clears them before measuring, and so does this meter."""
    warm_up: Callable[[int], None] | None = None
    """Creates the device's context and random-number state (a tiny random tensor, as PyTorch's
    own check does) before the first measurement, so the first test to touch the device is not
    blamed for them."""
    _peak_base: int = 0
    _reserved_base: int = 0
    _pinned_base: int = 0
    _warm: bool = False
    reserved_peak: int | None = None
    """Most bytes reserved by the caching allocator above its level at ``start_peak``."""
    pinned_peak: int | None = None
    """Most bytes of pinned host memory in use above its level at ``start_peak``."""

    @property
    def index(self) -> int:
        return int(self.name.partition(":")[2] or 0)

    def settle(self) -> None:
        if not self._warm:
            self._warm = True
            if self.warm_up is not None:
                self.warm_up(self.index)
        gc.collect()
        if self.clear_workspaces is not None:
            self.clear_workspaces()
        self.backend.synchronize(self.index)

    def allocated_bytes(self) -> int:
        return int(self.backend.memory_allocated(self.index))

    def driver_bytes(self) -> int | None:
        """Device memory in use as the driver sees it, where the context already exists.

        ``mem_get_info`` creates a context on a device that has none (hundreds of MiB), so it is
        asked only of initialised devices.
        """
        if not self.backend.is_initialized():
            return None
        free, total = self.backend.mem_get_info(self.index)
        return int(total - free)

    def start_peak(self) -> None:
        self.settle()
        self.backend.reset_peak_memory_stats(self.index)
        self._peak_base = self.allocated_bytes()
        self._reserved_base = int(self.backend.memory_reserved(self.index))
        pinned = self.pinned_bytes()
        if pinned is not None:
            self.backend.reset_peak_host_memory_stats()
            self._pinned_base = pinned

    def stop_peak(self) -> int | None:
        self.backend.synchronize(self.index)
        if hasattr(self.backend, "max_memory_reserved"):
            self.reserved_peak = max(0, int(self.backend.max_memory_reserved(self.index)) - self._reserved_base)
        stats = self._host_stats()
        if stats is not None and "active_bytes.peak" in stats:
            self.pinned_peak = max(0, int(stats["active_bytes.peak"]) - self._pinned_base)
        return max(0, int(self.backend.max_memory_allocated(self.index)) - self._peak_base)

    def _host_stats(self) -> dict[str, Any] | None:
        """The pinned host allocator's statistics, where the backend keeps them (CUDA)."""
        stats = getattr(self.backend, "host_memory_stats", None)
        if stats is None or not hasattr(self.backend, "reset_peak_host_memory_stats"):
            return None
        try:
            return dict(stats())
        except (RuntimeError, AttributeError):
            return None

    def pinned_bytes(self) -> int | None:
        """Bytes of pinned host memory handed out to tensors (``active_bytes.current``), where known."""
        stats = self._host_stats()
        if stats is None or "active_bytes.current" not in stats:
            return None
        return int(stats["active_bytes.current"])

    def details(self) -> dict[str, int]:
        figures = {"reserved_bytes": int(self.backend.memory_reserved(self.index))}
        stats = self.backend.memory_stats(self.index)
        if "inactive_split_bytes.all.current" in stats:
            figures["inactive_split_bytes"] = int(stats["inactive_split_bytes.all.current"])
        driver = self.driver_bytes()
        if driver is not None:
            figures["driver_used_bytes"] = driver
        return figures


@dataclass(frozen=True)
class Growth:
    """How much an accelerator's memory grew, by the allocator's count and the driver's."""

    allocated: int
    driver: int | None
    """None where the driver's figure could not be read without creating a context."""
    measurements: int

    def note(self, allowed: int) -> str:
        """What the two figures together mean, or an empty string when they agree."""
        if self.driver is None:
            return ""
        driver = f"driver-level usage grew {format_size(self.driver)}"
        if self.allocated > allowed and self.driver <= 0:
            return (
                f"{driver}: the allocator served the leaked tensors from memory it had cached, so this is "
                "the allocator's view; the tensors are alive all the same"
            )
        if self.allocated <= allowed and self.driver > 0:
            return f"{driver} while the allocator's did not (kernels or libraries loaded into the context): not the test's leak"
        return f"{driver}, the allocator's {format_size(self.allocated)}"


def measure_growth(
    meter: Any, baseline_allocated: int, baseline_driver: int | None, allowed: int, *, attempts: int = 3
) -> Growth:
    """Allocator growth since the baseline, re-measured up to ``attempts`` times while it is over
    ``allowed`` (as PyTorch's own check does: memory freed asynchronously can still arrive), then
    confirmed against the driver's figure."""
    measurements = 0
    allocated = 0
    while measurements < attempts:
        measurements += 1
        meter.settle()
        allocated = meter.allocated_bytes() - baseline_allocated
        if allocated <= allowed:
            break
    driver_now = meter.driver_bytes()
    driver = None if driver_now is None or baseline_driver is None else driver_now - baseline_driver
    return Growth(allocated, driver, measurements)


def explain_reserved(details: dict[str, int], allocated: int) -> str:
    """Why memory reserved by the caching allocator but not allocated is not a leak."""
    reserved = details.get("reserved_bytes")
    if reserved is None or reserved <= allocated:
        return ""
    text = (
        f"{format_size(reserved - allocated)} reserved but not allocated: blocks the caching allocator keeps "
        "for reuse (torch.cuda.empty_cache() returns them), not a leak"
    )
    if details.get("inactive_split_bytes"):
        text += f"; {format_size(details['inactive_split_bytes'])} of it in split blocks (fragmentation)"
    return text


@dataclass
class MpsMeter:
    """Apple's MPS device through ``torch.mps``, which keeps no peak statistics."""

    keeps_counters: ClassVar[bool] = True
    backend: Any
    name: str = "mps"

    def settle(self) -> None:
        gc.collect()
        self.backend.synchronize()

    def allocated_bytes(self) -> int:
        return int(self.backend.current_allocated_memory())

    def start_peak(self) -> None:
        self.settle()

    def stop_peak(self) -> int | None:
        return None

    def details(self) -> dict[str, int]:
        return {"driver_allocated_bytes": int(self.backend.driver_allocated_memory())}


_unknown_block_warning_spent = False


@contextmanager
def _quiet_stderr() -> Iterator[None]:
    """File descriptor 2 sent to the null device meanwhile: torch's profiler (kineto) prints
    ``profiler_start`` and ``profiler_stop`` lines there as it starts and stops."""
    saved_stderr = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved_stderr, 2)
        os.close(saved_stderr)


def _spend_unknown_block_warning(torch: Any, enable: Any, disable: Any) -> None:
    """Use up c10's once-per-process "Memory block of unknown size" message where nobody sees it.

    The CPU allocator prints it straight to file descriptor 2 the first time a block allocated
    before profiling is freed while profiling; left alone it would land in a user's test output.
    """
    global _unknown_block_warning_spent
    if _unknown_block_warning_spent:
        return
    _unknown_block_warning_spent = True
    block = torch.ones(16, device="cpu")  # (a CPU block whatever default device the suite set)
    with _quiet_stderr():
        enable()
        try:
            del block
        finally:
            disable()


_OPERATORS_ON = "pytest-vramleak: operator callbacks on"
"""The mark the plain CPU peak records as it starts, seen among the events only where
``RecordFunction`` was on."""


def _mute_operators(autograd: Any) -> None:
    """Turn torch's operator callbacks off on this thread (and the threads it hands work to),
    after recording a mark that shows whether they were on."""
    handle = autograd._record_function_with_args_enter(_OPERATORS_ON)
    autograd._record_function_with_args_exit(handle)
    autograd._enable_record_function(False)


def _unmute_operators(autograd: Any, events: Any) -> None:
    """Put torch's operator callbacks back as they were where the profiler's ``events`` show it
    (the mark is among the first of its thread), on, torch's default, where they are lost."""
    was_on = events is None or any(
        event.name() == _OPERATORS_ON for thread in events for event in itertools.islice(thread, 3)
    )
    autograd._enable_record_function(was_on)


# Where torch's profilers start: (module, name) of each function that enables one on a thread.
_PROFILER_ENTRIES = (
    ("torch.autograd.profiler", "_prepare_profiler"),
    ("torch.autograd.profiler", "_enable_profiler"),
    ("torch.autograd.profiler_legacy", "_enable_profiler_legacy"),
)


@dataclass
class CpuMeter:
    """CPU tensors: a census of live storages, and the profiler's allocation events for the peak.

    Only one profiler runs on a thread. While the meter's runs, torch's functions that start a
    profiler are wrapped: a test that starts its own first stops the meter's, whose peak is then
    not known (None), and the test's profiler starts as it would without the plugin.

    The plain peak needs only the allocation events, so torch's operator callbacks
    (``RecordFunction``) are off on the thread while it is measured: the profiler records 2 events
    for a tensor made and freed, not 8, and keeps none of the operators. A mark recorded as the
    peak starts says whether they were on; they are put back as they were when it stops.
    """

    keeps_counters: ClassVar[bool] = False
    torch: Any
    name: str = "cpu"
    categorize_peak: bool = False
    """Record the peak with torch's memory profiler, which puts each allocation in a category
    (see :mod:`pytest_vramleak.meters.peaks`); slower than the plain allocation events, so only asked
    for tests with a peak budget."""
    peak_breakdown: PeakBreakdown | None = None
    """The last peak's breakdown by category, where it was asked for and could be read."""
    _profiling: bool = False
    _thread: int = 0
    _replaced: list[tuple[Any, str, Any]] = field(default_factory=list)
    _profile: Any = None

    def settle(self) -> None:
        gc.collect()

    def allocated_bytes(self) -> int:
        return take_census("cpu").total_bytes

    def start_peak(self) -> None:
        autograd = self.torch._C._autograd
        self._profiling = False
        self.peak_breakdown = None
        if autograd._profiler_enabled():
            return  # the test's own profiler is running; ours would fail to start
        profiler = self.torch._C._profiler
        config = profiler.ProfilerConfig(
            profiler.ProfilerState.CPU, False, True, False, False, False, profiler._ExperimentalConfig()
        )
        _spend_unknown_block_warning(
            self.torch,
            lambda: autograd._enable_profiler_legacy(config),
            lambda: autograd._disable_profiler_legacy(autograd._ProfilerDisableOptions(True, True)),
        )
        if self.categorize_peak:
            import torch.profiler

            self._profile = torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU],
                profile_memory=True,
                record_shapes=True,
                with_stack=True,
            )  # what torch's memory profiler needs to categorize
            with _quiet_stderr():
                self._profile.start()
        else:
            autograd._enable_profiler_legacy(config)
            _mute_operators(autograd)
        self._profiling = True
        self._thread = threading.get_ident()
        self._step_aside_for_the_tests_profiler()

    def _step_aside_for_the_tests_profiler(self) -> None:
        import sys

        for module_name, name in _PROFILER_ENTRIES:
            module = sys.modules.get(module_name)
            original = getattr(module, name, None)
            if original is None:
                continue

            def starting(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
                if threading.get_ident() == self._thread:
                    self._give_up()
                return _original(*args, **kwargs)

            setattr(module, name, starting)
            self._replaced.append((module, name, original))

    def _put_back(self) -> None:
        while self._replaced:
            module, name, original = self._replaced.pop()
            setattr(module, name, original)

    def _give_up(self) -> None:
        """Stop the meter's profiler, keeping no peak: the test starts one of its own."""
        self._put_back()
        if self._profiling:
            self._profiling = False
            if self._profile is not None:
                profile, self._profile = self._profile, None
                try:
                    with _quiet_stderr():
                        profile.stop()
                except RuntimeError:
                    pass
                return
            autograd = self.torch._C._autograd
            try:
                events = autograd._disable_profiler_legacy(autograd._ProfilerDisableOptions(True, True))
            except RuntimeError:
                events = None
            _unmute_operators(autograd, events)

    def stop_peak(self) -> int | None:
        self._put_back()
        if not self._profiling:
            return None
        self._profiling = False
        if self._profile is not None:
            return self._stop_categorized()
        autograd = self.torch._C._autograd
        try:
            events = autograd._disable_profiler_legacy(autograd._ProfilerDisableOptions(True, True))
        except RuntimeError:
            _unmute_operators(autograd, None)
            return None  # the test stopped or replaced the profiler itself
        _unmute_operators(autograd, events)
        # The running total of the allocation events' memory at its highest, picked and added up in
        # C: a test making 10^6 tensors leaves 8 x 10^6 events.
        every = itertools.chain.from_iterable  # (twice over the lists: no list of 10^7 events more)
        allocations = itertools.compress(
            every(events), map("memory_alloc".__eq__, map(operator.methodcaller("kind"), every(events)))
        )
        peak: int = max(itertools.accumulate(map(operator.methodcaller("cpu_memory_usage"), allocations), initial=0))
        return peak

    def _stop_categorized(self) -> int | None:
        profile, self._profile = self._profile, None
        try:
            with _quiet_stderr():
                profile.stop()
            results = profile.profiler.kineto_results
        except (RuntimeError, AttributeError):
            return None  # the test stopped or replaced the profiler itself
        from .peaks import breakdown  # (the profiler's reading, loaded where a peak is categorized)

        self.peak_breakdown = breakdown(results, "cpu")
        return None if self.peak_breakdown is None else self.peak_breakdown.peak_bytes

    def details(self) -> dict[str, int]:
        return {}


def make_meter(name: str, torch: Any) -> Meter:
    """The meter for a resolved device name (see :func:`resolve_device`)."""
    kind = name.partition(":")[0]
    if kind == "cpu":
        return CpuMeter(torch)
    if kind == "cuda":

        def warm_up(index: int) -> None:
            torch.randn(1, device=f"cuda:{index}")

        return CudaMeter(name, torch.cuda, getattr(torch._C, "_cuda_clearCublasWorkspaces", None), warm_up)
    if kind == "mps":
        return MpsMeter(torch.mps)
    return CudaMeter(name, getattr(torch, kind))  # xpu keeps CUDA's memory API

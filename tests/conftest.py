from __future__ import annotations

import json
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

# Imported here, before any pytester run, so that inline runs share them: pytester restores
# sys.modules after each run, and torch and its lazily imported parts (the optimizers pull in
# torch._dynamo) cannot be imported a second time in one process.
import torch
import torch._dynamo  # noqa: F401
import torch.optim  # noqa: F401

# The same for the plugin's engine, which a session loads as its first test is checked: an inline
# run that loaded it would drop it, and a later test's monkeypatch of one of its modules, by name,
# would patch a copy the next inline run does not use.
import pytest_vramleak.plugin.fixture  # noqa: F401
import pytest_vramleak.plugin.runs  # noqa: F401
import pytest_vramleak.reporting.html_report  # noqa: F401

pytest_plugins = ["pytester"]


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """Run a module's tiny models on one thread: on a busy 2-core runner, two OpenMP threads
    made a step of an MLP take ~85 ms instead of ~0.2 ms. Memory figures do not depend on it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


BIG_HEAP_OBJECTS = 100_000
"""More objects than the holder search once walked from the user's modules for what gc does not
see (a numpy array over a tensor) before it gave up: the heap of a worker that ran a whole suite."""

BIG_HEAP: list[object] = []


@pytest.fixture(params=["small heap", "big heap"])
def heap_size(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run a test as it runs alone, then beside a module that holds many objects, as in a worker
    that ran many test modules before it: what the holder search finds must not depend on it."""
    if request.param == "big heap":
        BIG_HEAP.extend(object() for _ in range(BIG_HEAP_OBJECTS))
    try:
        yield request.param
    finally:
        BIG_HEAP.clear()


def read_report(path: Path) -> dict[str, dict[str, Any]]:
    """The JSON report's tests by test name."""
    document = json.loads(path.read_text())
    assert document["version"] == 2
    return {entry["nodeid"].rsplit("::", 1)[-1]: entry for entry in document["tests"]}


class Elements(HTMLParser):
    """Every start tag of a page with its attributes, and the text inside each tag name."""

    def __init__(self, page: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: dict[str, list[str]] = {}
        self._open: list[str] = []
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag not in ("circle", "rect", "path", "line", "polyline", "meta", "br"):
            self._open.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag in self._open:
            while self._open.pop() != tag:
                pass

    def handle_data(self, data: str) -> None:
        if self._open:
            self.text.setdefault(self._open[-1], []).append(data)

    def all(self, tag: str, **attrs: str) -> list[dict[str, str | None]]:
        return [a for t, a in self.tags if t == tag and all(a.get(k.rstrip("_")) == v for k, v in attrs.items())]


CHECKPOINT_HOOK = "torch.utils.checkpoint._checkpoint_hook.__init__.<locals>.pack_hook"
"""torch.utils.checkpoint's pack hook, which keeps what a checkpointed region saved: the name a holder is given."""


@pytest.fixture
def run_checked(pytester: pytest.Pytester):
    """Run pytester's files with a JSON report; return the run's result and the report by test name."""

    def run(*args: str) -> tuple[pytest.RunResult, dict[str, dict[str, Any]]]:
        report = pytester.path / "vramleak.json"
        result = pytester.runpytest("-p", "no:cacheprovider", f"--vramleak-report={report}", *args)
        return result, read_report(report)

    return run


@pytest.fixture(autouse=True)
def _no_ci_job_summary(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the inner test runs from appending to a real CI job's summary, and from printing as
    pytest does on CI (its short summary then gives each failure's whole text, not one line)."""
    for name in ("GITHUB_STEP_SUMMARY", "CI", "BUILD_NUMBER"):
        monkeypatch.delenv(name, raising=False)


def _measure_through(monkeypatch: pytest.MonkeyPatch, device: str, backend: Any) -> None:
    """Have the plugin resolve every device to ``device`` and measure it through ``backend``'s
    allocator functions (torch.cuda's)."""
    import pytest_vramleak.plugin.state as state
    import pytest_vramleak.plugin.summary as summary
    from pytest_vramleak.meters.devices import CudaMeter

    for module in (state, summary):  # each test's meter and the device option's check; the header
        monkeypatch.setattr(module, "resolve_device", lambda spec, torch: device)
    monkeypatch.setattr(state, "make_meter", lambda name, torch: CudaMeter(name, backend))


@pytest.fixture
def fake_cuda_plugin(monkeypatch: pytest.MonkeyPatch):
    """Point the plugin at a fake CUDA backend; test files reach it as ``from vramleak_fake_cuda import CUDA``."""
    import sys
    import types

    from .fakes import FakeCuda

    def install(devices: int = 1) -> FakeCuda:
        cuda = FakeCuda(devices=devices)
        shared = types.ModuleType("vramleak_fake_cuda")
        shared.CUDA = cuda  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "vramleak_fake_cuda", shared)
        _measure_through(monkeypatch, "cuda:0", cuda)
        return cuda

    return install


@pytest.fixture
def counting_allocator(monkeypatch: pytest.MonkeyPatch) -> None:
    """Measure the CPU as an accelerator is measured: an allocator's counters (see
    :class:`tests.fakes.CountingAllocator`), with the tracker asked only to name what leaked."""
    from .fakes import CountingAllocator

    _measure_through(monkeypatch, "cpu", CountingAllocator())

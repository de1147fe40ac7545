"""Allocation sites: the function a recorded line belongs to, read from the source."""

from __future__ import annotations

import sys
import textwrap
import threading
from pathlib import Path

import pytest

from pytest_vramleak.tracking.sites import enclosing_function, site_text, thread_entry

from .conftest import read_report

SOURCE = textwrap.dedent(
    """\
    import torch

    TABLE = torch.zeros(3)


    def outer():
        def inner():
            return torch.ones(2)

        keep = lambda: torch.ones(1)
        return inner(), keep()


    class Model:
        def forward(self):
            return torch.ones(4)
    """
)


@pytest.mark.parametrize(
    ("line", "function"),
    [(3, ""), (6, "outer"), (8, "inner"), (10, "<lambda>"), (11, "outer"), (14, ""), (16, "forward")],
)
def test_a_line_is_named_by_its_innermost_function(tmp_path: Path, line: int, function: str) -> None:
    path = tmp_path / "model.py"
    path.write_text(SOURCE)
    assert enclosing_function(str(path), line) == function


def test_a_site_without_a_function_shows_its_line_only(tmp_path: Path) -> None:
    path = tmp_path / "model.py"
    path.write_text(SOURCE)
    assert site_text((str(path), 3, "")).endswith("model.py:3")
    assert site_text((str(path), 8, "inner")).endswith("model.py:8 in inner()")


def test_a_file_that_is_gone_or_not_python_names_no_function(tmp_path: Path) -> None:
    assert enclosing_function(str(tmp_path / "missing.py"), 1) == ""
    broken = tmp_path / "broken.py"
    broken.write_text("def (:\n")
    assert enclosing_function(str(broken), 1) == ""


@pytest.mark.parametrize(
    ("frames", "entry"),
    [
        # a thread's stack, innermost first: it starts at threading's bootstrap
        (
            [
                ("feed.py", 9, ""),
                (threading.__file__, 982, ""),
                (threading.__file__, 1045, ""),
                (threading.__file__, 1002, ""),
            ],
            ("feed.py", 9),
        ),
        (
            [("lib.py", 3, ""), ("feed.py", 9, ""), (threading.__file__, 982, ""), (threading.__file__, 1002, "")],
            ("feed.py", 9),
        ),
        ([("test_a.py", 5, ""), ("runner.py", 1, "")], None),  # the main thread's
        ([], None),
    ],
)
def test_a_stack_that_starts_at_a_threads_bootstrap_enters_the_code_the_thread_runs(
    frames: list[tuple[str, int, str]], entry: tuple[str, int] | None
) -> None:
    assert thread_entry(frames) == entry


def test_frames_on_one_line_are_named_innermost_scope_first(pytester: pytest.Pytester) -> None:
    # A lambda (or, before Python 3.12, a comprehension) called on the line that defines it runs
    # in a frame of its own on that line: its caller is the function around it.
    pytester.makepyfile(
        test_it="""
        import torch
        KEEP = []

        def again(n):
            return again(n - 1) if n else torch.ones(32)

        def test_lambda_on_one_line():
            KEEP.append((lambda: torch.ones(256))())

        def test_comprehension():
            KEEP.extend({torch.ones(64) for _ in range(2)})

        def test_recursion_on_one_line():
            KEEP.append(again(1))
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "--vramleak")
    result.assert_outcomes(failed=3)
    # (from Python 3.12 a comprehension runs inline, in the frame of the function around it)
    comprehension = (
        "<setcomp>(), called from test_it.py:11 in test_comprehension()"
        if sys.version_info < (3, 12)
        else "test_comprehension()"
    )
    result.stdout.fnmatch_lines(
        [
            "    allocated at test_it.py:8 in <lambda>(), called from test_it.py:8 in test_lambda_on_one_line()",
            f"    allocated at test_it.py:11 in {comprehension}",
            "    allocated at test_it.py:5 in again(), called from test_it.py:5 in again(), called from test_it.py:14 in test_recursion_on_one_line()",
        ],
        consecutive=False,
    )


NATIVE_THREAD = """
import ctypes
import sys

import pytest

LIBC = ctypes.PyDLL(None)  # calls through PyDLL keep the GIL
START = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)
# ctypes takes the GIL for the new thread as a gloo worker does to drop a tensor's Python object:
# first a thread state, allocated with PyMem_RawCalloc, then the wait for the GIL.
INTO_PYTHON = START(lambda argument: None)
LIBC.pthread_create.argtypes = [ctypes.POINTER(ctypes.c_ulong), ctypes.c_void_p, START, ctypes.c_void_p]
LIBC.usleep.argtypes = [ctypes.c_uint]


@pytest.fixture
def native_thread():
    interval = sys.getswitchinterval()
    sys.setswitchinterval(30.0)  # the waiting thread asks for the GIL no sooner than this
    thread = ctypes.c_ulong()
    yield thread
    if thread.value:
        ctypes.CDLL(None).pthread_join(thread, None)  # lets go of the GIL: the thread runs now
    sys.setswitchinterval(interval)


@pytest.mark.vram_budget
def test_a_thread_waits_for_the_gil_as_the_test_ends(native_thread):
    assert LIBC.pthread_create(ctypes.byref(native_thread), None, INTO_PYTHON, None) == 0
    LIBC.usleep(200_000)  # holding the GIL: the thread is waiting for it when the check stops tracing
"""


@pytest.mark.skipif(sys.platform == "win32", reason="starts a POSIX thread through ctypes")
def test_a_thread_taking_the_gil_as_tracing_stops_does_not_crash(pytester: pytest.Pytester) -> None:
    """tracemalloc's hook on the raw allocator makes a thread without the GIL wait for it; stopped
    meanwhile, tracemalloc let that thread write into freed tables (CPython gh-128679)."""
    pytester.makepyfile(test_it=NATIVE_THREAD)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly", "--vramleak-sites=on")
    result.assert_outcomes(passed=1)
    assert result.ret == 0
    result.stderr.no_fnmatch_line("*Fatal Python error*")


def test_tracing_leaves_the_raw_allocator_as_it_was_and_hooks_the_object_allocator() -> None:
    import ctypes
    import tracemalloc

    from pytest_vramleak.tracking.sites import SiteRecorder

    class Allocator(ctypes.Structure):  # PyMemAllocatorEx
        _fields_ = [(name, ctypes.c_void_p) for name in ("ctx", "malloc", "calloc", "realloc", "free")]

    get = ctypes.PyDLL(ctypes.pythonapi._name, handle=ctypes.pythonapi._handle).PyMem_GetAllocator
    get.restype, get.argtypes = None, [ctypes.c_int, ctypes.POINTER(Allocator)]

    def allocators() -> list[tuple[int | None, ...]]:
        found = []
        for domain in (0, 2):  # PYMEM_DOMAIN_RAW, PYMEM_DOMAIN_OBJ
            allocator = Allocator()
            get(domain, ctypes.byref(allocator))
            found.append(tuple(getattr(allocator, name) for name, _ in Allocator._fields_))
        return found

    before = allocators()
    recorder = SiteRecorder()
    recorder.start()
    try:
        assert tracemalloc.is_tracing()
        raw, objects = allocators()
    finally:
        recorder.stop()
    assert raw == before[0]  # threads without the GIL never wait in tracemalloc
    assert objects != before[1]  # tracemalloc's hook, where sites are read from
    assert allocators() == before


@pytest.mark.parametrize("sites", ["auto", "on"])
def test_a_test_that_stops_tracemalloc_is_told_why_its_sites_are_missing(pytester: pytest.Pytester, sites: str) -> None:
    pytester.makepyfile(
        test_it="""
        import tracemalloc
        import torch
        KEPT = []

        def test_stops_tracing():
            KEPT.append(torch.ones(300_000))
            tracemalloc.stop()
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "--vramleak", f"--vramleak-sites={sites}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "    held by test_it.KEPT[[]4[]]",
            "allocated at: not recorded: the test called tracemalloc.stop(), which ended the tracing that records *",
        ]
    )
    result.stdout.no_fnmatch_line("*--vramleak-sites=on records the first run too*")


COMPILED_LEAK = """
import torch

KEPT = []

@torch.compile(backend="eager")
def scaled(x):
    return x * 2

def test_keeps_compiled_outputs():
    KEPT.append(scaled(torch.ones(4096)))
"""


def test_recording_sites_leaves_compiled_code_alone(pytester: pytest.Pytester) -> None:
    # The run that records where tensors are made traces the user's calls: the trace functions
    # are kept out of torch.compile (torch 2.4 compiled them, with graph breaks and a warning).
    pytester.makepyfile(test_it=COMPILED_LEAK)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--vramleak")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*allocated at test_it.py:*, called from test_it.py:10 in test_keeps_compiled_outputs()"]
    )
    result.stdout.no_fnmatch_line("*warning*")


def test_a_gradient_is_allocated_where_backward_was_called(pytester: pytest.Pytester) -> None:
    # backward() makes a gradient in C++; Python makes its object where it first reads `.grad`,
    # here inside optimizer.step(), or where the test reads it. The site is the backward() line.
    pytester.makepyfile(
        test_it="""
        import torch
        KEPT = []

        def test_keeps_models_and_optimizers():
            model = torch.nn.Linear(32, 32)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            KEPT.append((model, optimizer))
            model(torch.ones(4, 32)).sum().backward()
            optimizer.step()
            assert model.weight.grad is not None
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "--vramleak", "--vramleak-report=r.json")
    result.assert_outcomes(failed=1)
    tests = read_report(pytester.path / "r.json")
    gradients = [group for group in tests["test_keeps_models_and_optimizers"]["tensors"] if group["kind"] == "grad"]
    assert gradients, result.stdout.str()
    for group in gradients:
        assert group["allocated_at"] == ["test_it.py:8 in test_keeps_models_and_optimizers()"], result.stdout.str()


def test_a_storage_kept_without_its_tensors_is_allocated_where_they_were_made(pytester: pytest.Pytester) -> None:
    # The exporter keeps storage objects after the tensors die. One tensor was only ever held by a
    # dict, the other storage was last seen through a view: neither the `untyped_storage()` line
    # nor the view's line allocated the memory.
    pytester.makepyfile(
        test_it="""
        import torch
        WRITTEN = {}

        def export(tensors):
            for t in tensors.values():
                storage = t.untyped_storage()
                WRITTEN.setdefault((storage.data_ptr(), storage.nbytes()), storage)

        def test_export():
            weights = {"a": torch.randn(64, 256), "b": torch.randn(32, 256)}
            weights["a_view"] = weights["a"][:8]
            export(weights)
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "--vramleak", "--vramleak-report=r.json")
    result.assert_outcomes(failed=1)
    groups = read_report(pytester.path / "r.json")["test_export"]["tensors"]
    assert len(groups) == 2, result.stdout.str()
    for group in groups:
        assert group["allocated_at"] == ["test_it.py:10 in test_export()"], result.stdout.str()


def test_a_step_check_says_where_a_kept_view_was_made(pytester: pytest.Pytester) -> None:
    # A loop that caches rows of each batch keeps the batches' storages through views made on
    # another line: the step check names both lines, as a whole-test check does.
    pytester.makepyfile(
        test_it="""
        import torch
        CACHE = {}

        def test_cache_rows(vramleak):
            for step in vramleak.steps(10, warmup=2):
                logits = torch.randn(32, 64)
                CACHE.update(zip(range(step * 32, step * 32 + 32), logits))
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "    allocated at test_it.py:6 in test_cache_rows()",
            "        kept through a view made at test_it.py:7 in test_cache_rows()",
        ]
    )


def test_what_set_up_made_and_the_body_kept_is_sited_at_the_fixture(pytester: pytest.Pytester) -> None:
    """The run that records sites captures them as its body ends: what a fixture made as the test
    set up is captured with the body's tensors."""
    pytester.makepyfile(
        test_it=textwrap.dedent(
            """
            import pytest
            import torch

            KEPT = []

            @pytest.fixture
            def batch():
                return torch.ones(64, 64)

            def test_keeps_the_batch(batch):
                KEPT.append(batch)
                KEPT.append(torch.zeros(32))
            """
        )
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--vramleak", "--vramleak-fail-on=any")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "float32[[]64, 64[]] on cpu: 1 tensor, 16.0 KiB",
            "    allocated at test_it.py:8 in batch()*",
            "float32[[]32[]] on cpu: 1 tensor, 128 B",
            "    allocated at test_it.py:12 in test_keeps_the_batch()*",
        ]
    )


@pytest.mark.parametrize(
    ("module", "failing"),
    [
        ("pytest_vramleak.tracking.sites", "SiteRecorder.capture_objects"),
        ("pytest_vramleak.tracking.tracker", "Tracker.made_since_freeze"),
    ],
)
def test_a_capture_that_fails_as_the_body_ends_leaves_the_sites_to_the_capture_after_the_run(
    pytester: pytest.Pytester, module: str, failing: str
) -> None:
    owner, name = failing.split(".")
    pytester.makeconftest(
        f"""
        import {module} as module

        def unreadable(*args, **kwargs):
            raise RuntimeError("unreadable")

        module.{owner}.{name} = unreadable
        """
    )
    pytester.makepyfile(
        test_it=textwrap.dedent(
            """
            import torch

            KEEP = []

            def test_leaks():
                KEEP.append(torch.ones(1000))
            """
        )
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--vramleak", "--vramleak-fail-on=any")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["float32[[]1000[]] on cpu: 1 tensor, 3.9 KiB", "    allocated at test_it.py:6 in test_leaks()"]
    )
    result.stdout.no_fnmatch_line("*where the tensors were made is not known*")

"""End to end: the cheap per-test accounting sees every way a test can leave a storage behind."""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

LEAKS = {
    # A view of a function-scoped fixture's tensor kept beyond the test keeps the fixture's whole
    # storage: made for this test, alive after it, the test's leak.
    "view_of_a_function_fixture_tensor": """
        VIEWS = []

        @pytest.fixture
        def table():
            return torch.zeros(4096)

        @pytest.mark.vram_budget
        def test_it(table):
            VIEWS.append(table[:10])
        """,
    "function_fixture_tensor_kept": """
        KEEP = []

        @pytest.fixture
        def batch():
            return torch.ones(4096)

        @pytest.mark.vram_budget
        def test_it(batch):
            KEEP.append(batch)
        """,
    "hook_a_function_fixture_registers_on_a_global_module": """
        MODEL = torch.nn.Linear(16, 16)

        @pytest.fixture
        def recorded():
            seen = torch.ones(4096)
            MODEL.register_forward_hook(lambda module, args, out: seen)  # never removed
            return seen

        @pytest.mark.vram_budget
        def test_it(recorded):
            MODEL(torch.ones(1, 16))
        """,
    "gradient_on_module_scoped_model": """
        @pytest.fixture(scope="module")
        def model():
            return torch.nn.Linear(64, 64)

        def test_warm(model):
            pass

        @pytest.mark.vram_budget
        def test_it(model):
            model(torch.ones(2, 64)).sum().backward()

        def test_later(model):  # keeps the module's model, and its gradients, alive after test_it
            pass
        """,
    "gradient_from_backward_on_another_thread": """
        import threading
        MODEL = torch.nn.Linear(64, 64)

        @pytest.mark.vram_budget
        def test_it():  # this thread builds no graph: the backward pass itself is watched
            worker = threading.Thread(target=lambda: MODEL(torch.ones(2, 64)).sum().backward())
            worker.start()
            worker.join()
        """,
    "gradient_through_a_graph_built_before_the_test": """
        MODEL = torch.nn.Linear(64, 64)
        LOSS = MODEL(torch.ones(2, 64)).sum()

        @pytest.mark.vram_budget
        def test_it():
            LOSS.backward()
        """,
    "gradient_retained_by_an_older_non_leaf": """
        WEIGHT = torch.ones(64, requires_grad=True)
        WEIGHT.grad = torch.zeros(64)  # accumulated in place: only the retained gradient is new
        HIDDEN = WEIGHT * 2
        HIDDEN.retain_grad()
        LOSS = HIDDEN.sum()

        @pytest.mark.vram_budget
        def test_it():
            LOSS.backward()
        """,
    "storage_swapped_under_an_old_tensor": """
        WEIGHT = torch.nn.Parameter(torch.zeros(16))

        @pytest.mark.vram_budget
        def test_it():
            WEIGHT.data = torch.ones(4096)
        """,
    "old_tensor_resized_in_place": """
        BUFFER = torch.zeros(16)

        @pytest.mark.vram_budget
        def test_it():
            BUFFER.resize_(1 << 16)
        """,
    "external_memory": """
        KEPT = []

        @pytest.mark.vram_budget
        def test_it():
            KEPT.append(torch.frombuffer(bytearray(1 << 16), dtype=torch.uint8))
        """,
    "tensor_made_on_another_thread": """
        import threading
        KEPT = []

        @pytest.mark.vram_budget
        def test_it():
            worker = threading.Thread(target=lambda: KEPT.append(torch.ones(1 << 14)))
            worker.start()
            worker.join()
        """,
    "storage_swapped_under_a_tensor_an_unchecked_test_made": """
        KEPT = []

        def test_unchecked():
            KEPT.append(torch.zeros(16))

        @pytest.mark.vram_budget
        def test_it():
            KEPT[0].set_(torch.ones(4096).untyped_storage())
        """,
    "old_tensor_grown_through_an_out_argument": """
        BUFFER = torch.empty(0)

        @pytest.mark.vram_budget
        def test_it():
            torch.add(torch.ones(4096), 1, out=BUFFER)
        """,
    "storage_received_from_elsewhere_grown_in_place": """
        SHARED = torch.zeros(16)

        @pytest.mark.vram_budget
        def test_it():
            SHARED.untyped_storage().resize_(1 << 14)
        """,
    "storage_kept_without_its_tensor": """
        KEPT = []

        @pytest.mark.vram_budget
        def test_it():
            KEPT.append(torch.ones(4096).untyped_storage())
        """,
    "sparse_coo": """
        KEPT = []

        @pytest.mark.filterwarnings("ignore:Sparse:UserWarning")  # torch: support in beta
        @pytest.mark.vram_budget
        def test_it():
            KEPT.append(torch.eye(64).to_sparse())
        """,
    "sparse_csr": """
        KEPT = []

        @pytest.mark.filterwarnings("ignore:Sparse:UserWarning")  # torch: support in beta
        @pytest.mark.vram_budget
        def test_it():
            KEPT.append(torch.eye(64).to_sparse_csr())
        """,
    "sparse_csc": """
        KEPT = []

        @pytest.mark.filterwarnings("ignore:Sparse:UserWarning")  # torch: support in beta
        @pytest.mark.vram_budget
        def test_it():
            KEPT.append(torch.eye(64).to_sparse_csc())
        """,
    "sparse_bsr": """
        KEPT = []

        @pytest.mark.filterwarnings("ignore:Sparse:UserWarning")  # torch: support in beta
        @pytest.mark.vram_budget
        def test_it():
            KEPT.append(torch.eye(64).to_sparse_bsr((4, 4)))
        """,
    "nested_tensor": """
        KEPT = []

        @pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning")  # torch: a prototype
        @pytest.mark.vram_budget
        def test_it():
            KEPT.append(torch.nested.nested_tensor([torch.ones(2, 8), torch.ones(5, 8)]))
        """,
    "leak_then_the_test_freezes_the_heap": """
        import gc
        KEPT = []

        @pytest.fixture(scope="module", autouse=True)
        def thaw():  # after the check: leave the process as it was for the tests that follow
            yield
            gc.unfreeze()

        @pytest.mark.vram_budget
        def test_it():
            KEPT.append(torch.ones(4096))
            gc.freeze()
        """,
    "beside_a_fixture_that_frees_what_it_made": """
        KEPT = []

        @pytest.fixture
        def scratch():
            buffers = [torch.ones(1024)]  # made in setup, freed at teardown: offsets nothing
            yield buffers
            buffers.clear()

        @pytest.mark.vram_budget
        def test_before():  # checked: the next test's setup starts from this test's last view
            pass

        @pytest.mark.vram_budget
        def test_it(scratch):
            KEPT.append(torch.ones(1024))
        """,
}


@pytest.mark.parametrize("kind", sorted(LEAKS))
@pytest.mark.parametrize("every_test", [False, True], ids=["marked", "every-test"])
def test_leak_is_seen(pytester: pytest.Pytester, run_checked, kind: str, every_test: bool) -> None:
    pytester.makepyfile(test_it="import pytest, torch\n" + textwrap.dedent(LEAKS[kind]))
    result, report = run_checked("-p", "no:randomly", *(["--vramleak"] if every_test else []))
    assert report["test_it"]["verdict"] == "leaked", result.stdout.str()
    assert report["test_it"]["leaked_bytes"] > 0


NOT_LEAKS = {
    "view_of_a_tensor_an_unchecked_test_made": """
        KEPT = []
        VIEWS = []

        def test_unchecked():
            KEPT.append(torch.zeros(4096))

        @pytest.mark.vram_budget
        def test_it():
            VIEWS.append(KEPT[0][:10])
        """,
    "cyclic_garbage_made_by_the_test": """
        class Node:
            pass

        @pytest.mark.vram_budget
        def test_it():
            node = Node()
            node.me = node
            node.payload = torch.ones(1 << 16)
        """,
    "gradients_replaced_on_a_shared_model": """
        MODEL = torch.nn.Linear(64, 64)
        MODEL(torch.ones(2, 64)).sum().backward()  # gradients exist before the test

        @pytest.mark.vram_budget
        def test_before():  # checked: the next test's setup starts from this test's last view
            MODEL.zero_grad()
            MODEL(torch.ones(2, 64)).sum().backward()

        @pytest.mark.vram_budget
        def test_it():
            MODEL.zero_grad()  # set to None: the step makes new gradients in their place
            MODEL(torch.ones(2, 64)).sum().backward()
        """,
    "bounded_cache_evicts_as_it_adds": """
        from collections import OrderedDict

        CACHE = OrderedDict((f"user-{n}", torch.ones(256)) for n in range(4))

        def remember(key, value, limit=4):
            CACHE[key] = value
            while len(CACHE) > limit:
                CACHE.popitem(last=False)

        @pytest.mark.vram_budget
        def test_it():
            for n in range(4, 8):
                remember(f"user-{n}", torch.ones(256))
        """,
    "test_freezes_the_heap_itself": """
        import gc

        @pytest.mark.vram_budget
        def test_it():
            gc.freeze()
            try:
                scratch = torch.ones(1 << 16)
                del scratch
            finally:
                gc.unfreeze()
        """,
}


@pytest.mark.parametrize("kind", sorted(NOT_LEAKS))
def test_non_leak_passes(pytester: pytest.Pytester, run_checked, kind: str) -> None:
    pytester.makepyfile(test_it="import pytest, torch\n" + textwrap.dedent(NOT_LEAKS[kind]))
    result, report = run_checked()
    assert report["test_it"]["verdict"] == "passed", result.stdout.str()


@pytest.mark.parametrize("age", ["young", "old"])
def test_garbage_from_an_earlier_test_cannot_mask_a_leak(pytester: pytest.Pytester, run_checked, age: str) -> None:
    # Young garbage is collected as the checked test's setup begins; old garbage (a cycle that
    # survived full collections while it was alive) is frozen through the test.
    promote = "gc.collect()  # while the cycle is alive: it moves to the oldest generation" if age == "old" else ""
    pytester.makepyfile(
        test_it=f"""
        import gc
        import pytest, torch

        CACHE = []

        class Node:
            pass

        def test_makes_garbage():
            gc.disable()  # keep the 4 MiB cycle alive until the next test collects it
            node = Node()
            node.me = node
            node.payload = torch.ones(1024, 1024)
            {promote}

        @pytest.mark.vram_budget
        def test_it():
            try:
                gc.collect()  # would free the earlier test's 4 MiB while this test leaks 4 KiB
                CACHE.append(torch.ones(1024))
            finally:
                gc.enable()
        """
    )
    result, report = run_checked("-p", "no:randomly")
    assert report["test_it"]["verdict"] == "leaked"
    assert report["test_it"]["leaked_bytes"] == 4096
    result.stdout.fnmatch_lines(["*held by test_it.CACHE[[]*]"])


def test_a_suite_that_froze_its_heap_is_checked_in_full(pytester: pytest.Pytester, run_checked) -> None:
    # A conftest that freezes the heap after its imports, as some suites do to make gc cheaper.
    pytester.makeconftest(
        """
        import gc, torch
        TABLE = [torch.ones(256) for _ in range(64)]  # frozen with the rest
        gc.freeze()

        def pytest_unconfigure():  # leave the process as it was for the tests that follow
            gc.unfreeze()
        """
    )
    pytester.makepyfile(
        test_it="""
        import pytest, torch
        from conftest import TABLE
        KEPT = []

        @pytest.mark.vram_budget
        def test_leaks():
            KEPT.append(torch.ones(1024))

        @pytest.mark.vram_budget
        def test_replaces_an_entry():
            TABLE[0] = torch.ones(256)

        @pytest.mark.vram_budget
        def test_grows_a_frozen_tensor():
            TABLE[1].resize_(1024)
        """
    )
    result, report = run_checked("-p", "no:randomly")
    assert report["test_leaks"]["verdict"] == "leaked", result.stdout.str()
    assert report["test_leaks"]["leaked_bytes"] == 4096
    assert report["test_leaks"]["baseline_bytes"] >= 64 * 1024  # the frozen tensors are counted
    assert report["test_replaces_an_entry"]["verdict"] == "passed"
    assert report["test_grows_a_frozen_tensor"]["leaked_bytes"] == 3 * 1024
    result.stdout.fnmatch_lines(["*held by test_it.KEPT[[]*]"])


def test_heap_is_never_left_frozen(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import gc
        import pytest, torch

        from pytest_vramleak.tracking.gc_functions import INTERPRETER_FROZEN

        # not 0 when this session runs inside a checked test, nor on Python 3.12 (its own)
        FROZEN_BEFORE = max(gc.get_freeze_count(), INTERPRETER_FROZEN)

        @pytest.mark.vram_budget
        def test_fails():
            assert False

        @pytest.fixture
        def broken():
            raise RuntimeError("set-up failed")

        @pytest.mark.vram_budget
        def test_setup_error(broken):
            pass

        @pytest.mark.vram_budget
        def test_leaks():
            test_leaks.kept = torch.ones(16)

        def test_after():
            assert gc.get_freeze_count() <= FROZEN_BEFORE
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:randomly")
    # test_leaks fails once, for its leak; test_after passes only if nothing is frozen
    result.assert_outcomes(passed=1, failed=2, errors=1)


def test_one_index_serves_every_device() -> None:
    """The tracker indexes the storages of every device: the other GPUs of a process get
    per-storage accounting without a heap walk of their own."""
    import torch

    from pytest_vramleak.tracking.tracker import Tracker

    tracker = Tracker()
    tracker.begin()
    try:
        before = tracker.observe()
        kept = torch.ones(1000)
        tracker.observe(since=before)
        created = tracker.created("cpu", since=before.clock)
        assert [(ref.nbytes, ref() is kept.untyped_storage()) for ref in created] == [(4000, True)]
        assert tracker.created("cuda:0", since=before.clock) == []
    finally:
        tracker.end()


def test_a_collection_that_freed_no_storage_stands_until_the_tracker_reads_again() -> None:
    """Naming after a verdict takes no second full collection where the verdict's freed no storage
    and nothing was read since; one that freed a storage, or a reading after it, calls for another."""
    import torch

    from pytest_vramleak.tracking.tracker import Tracker

    tracker = Tracker()
    tracker.begin()
    try:
        before = tracker.observe()
        cycle: list[object] = [torch.ones(1000)]
        cycle.append(cycle)
        tracker.observe(since=before)
        del cycle
        tracker.settle()
        assert 4000 in [nbytes for _, nbytes, _ in tracker.settled]  # (with any earlier test's garbage)
        assert not tracker.settled_already()
        tracker.settle()
        assert tracker.settled == [] and tracker.settled_already()
        tracker.observe(since=before)
        assert not tracker.settled_already()
    finally:
        tracker.end()


def test_an_indexed_storage_object_lives_as_long_as_its_storage() -> None:
    """Death callbacks and identities rest on torch keeping a storage's Python object while the
    storage lives, once something refers to it weakly."""
    import weakref

    import torch

    tensor = torch.ones(16)
    reference = weakref.ref(tensor.untyped_storage())
    assert reference() is tensor.untyped_storage()
    view = tensor[:4]
    del tensor
    assert reference() is view.untyped_storage()
    del view
    assert reference() is None


@pytest.mark.parametrize("layout", ["to_sparse()", "to_sparse_csr()", "to_sparse_bsr((4, 4))"])
def test_sparse_leaks_are_named(pytester: pytest.Pytester, run_checked, layout: str) -> None:
    pytester.makepyfile(
        test_it=f"""
        import pytest, torch
        KEPT = []

        @pytest.mark.filterwarnings("ignore:Sparse:UserWarning")  # torch: support in beta
        @pytest.mark.vram_budget
        def test_it():
            KEPT.append(torch.eye(64).{layout})
        """
    )
    result, report = run_checked()
    assert report["test_it"]["verdict"] == "leaked"
    result.stdout.fnmatch_lines(["*held by test_it.KEPT[[]*]*"])


def test_nested_tensors_are_checked_named_and_stepped(pytester: pytest.Pytester, run_checked) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest, torch
        KEPT = []

        pytestmark = pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning")  # torch: a prototype

        def ragged():
            return torch.nested.nested_tensor([torch.ones(2, 8), torch.ones(5, 8)])

        @pytest.mark.vram_budget
        def test_leaks():
            KEPT.append(ragged())

        @pytest.mark.vram_budget
        def test_clean():
            ragged().unbind()

        def test_steps(vramleak):
            for step in vramleak.steps(6):
                KEPT.append(ragged())

        @pytest.mark.vram_budget
        def test_runs_out_of_memory():
            kept = ragged()
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        """
    )
    result, report = run_checked("-p", "no:randomly")
    assert report["test_leaks"]["verdict"] == "leaked"
    assert report["test_leaks"]["tensors"][0]["dtype"] == "nested float32"
    assert report["test_clean"]["verdict"] == "passed"
    assert report["test_steps"]["verdict"] == "leaked"
    result.stdout.fnmatch_lines(["nested float32[[]2] on cpu: 1 tensor, *", "*held by test_it.KEPT[[]*]*"])
    result.stdout.fnmatch_lines(["*vramleak: what filled the memory*", "largest tensors:"])
    result.stdout.no_fnmatch_line("*could not be read*")
    result.stdout.no_fnmatch_line("*NestedTensorImpl doesn't support sizes*")


def test_what_a_thread_running_since_before_the_test_holds_is_not_charged(
    pytester: pytest.Pytester, run_checked
) -> None:
    # A background thread of an earlier test makes and holds tensors while a later test runs.
    pytester.makepyfile(
        test_it="""
        import threading
        import pytest, torch

        GO, DONE, STOP = threading.Event(), threading.Event(), threading.Event()

        def loader():
            GO.wait()
            prefetched = torch.ones(4096)  # made while test_clean runs, held in this frame
            DONE.set()
            STOP.wait()

        def test_starts_a_background_thread():
            threading.Thread(target=loader, name="prefetcher", daemon=True).start()

        @pytest.mark.vram_budget
        def test_clean():
            GO.set()
            DONE.wait()

        @pytest.mark.vram_budget
        def test_starts_its_own_thread_that_keeps_memory():
            ready = threading.Event()

            def hold():
                kept = torch.ones(1024)
                ready.set()
                STOP.wait()

            threading.Thread(target=hold, name="holder", daemon=True).start()
            ready.wait()

        def test_stop():
            STOP.set()
        """
    )
    result, report = run_checked("-p", "no:randomly")
    assert report["test_clean"]["verdict"] == "passed", result.stdout.str()
    assert (
        "16.0 KiB held by threads that were running before the test began: not counted" in report["test_clean"]["notes"]
    )
    own = report["test_starts_its_own_thread_that_keeps_memory"]
    assert own["verdict"] == "leaked"
    (chain,) = own["tensors"][0]["held_by"]
    assert chain.startswith("thread 'holder' hold:") and chain.endswith(" local 'kept'")
    result.stdout.no_fnmatch_line("*held from C++*")


def test_a_chain_that_changed_while_it_was_searched_is_not_shown_as_holding() -> None:
    from pytest_vramleak.holders.referrers import CHANGED, FrameLocal, still_holds

    holder = {"batch": [object()]}
    target = holder["batch"][0]
    chain = [holder, holder["batch"], target]
    assert still_holds(chain)
    holder["batch"] = []  # another thread replaced the list
    holder_list = chain[1]
    holder_list.clear()
    assert not still_holds(chain)
    assert CHANGED.startswith("<its holders changed while they were searched")
    local = FrameLocal(None, "x", target)  # type: ignore[arg-type]
    assert still_holds([local, target]) and not still_holds([local, object()])


def test_holders_that_change_during_the_search_are_said_to_have_changed(
    pytester: pytest.Pytester, run_checked, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pytest_vramleak.holders.referrers as referrers

    search = referrers.find_chains

    def search_while_another_thread_empties_the_cache(*args: object, **kwargs: object) -> list[list[object]]:
        chains = search(*args, **kwargs)  # type: ignore[arg-type]
        for chain in chains:
            for holder in chain:
                if type(holder) is list:
                    holder.clear()
        return chains

    monkeypatch.setattr(referrers, "find_chains", search_while_another_thread_empties_the_cache)
    pytester.makepyfile(
        test_it="""
        import pytest, torch
        CACHE = []

        @pytest.mark.vram_budget
        def test_it():
            CACHE.append(torch.ones(1024))
        """
    )
    result, report = run_checked()
    assert report["test_it"]["tensors"][0]["held_by"] == [referrers.CHANGED]
    result.stdout.no_fnmatch_line("*held by test_it.CACHE*")


MANY_LEAVES = """
    import pytest, torch

    # More leaves and storages than a check compares one by one (COMPARED_PER_CHECK).
    PARAMS = torch.nn.ParameterList(torch.nn.Parameter(torch.zeros(1)) for _ in range(2500))
    BUFFERS = [torch.zeros(1) for _ in range(2500)]
    MODEL = torch.nn.Linear(64, 64)
"""


def test_a_gradient_given_to_one_of_many_older_leaves_is_charged_to_the_test(
    pytester: pytest.Pytester, run_checked
) -> None:
    pytester.makepyfile(
        test_it=textwrap.dedent(MANY_LEAVES)
        + textwrap.dedent("""
            @pytest.mark.vram_budget
            def test_it():
                MODEL(torch.ones(2, 64)).sum().backward()
            """)
    )
    result, report = run_checked()
    assert report["test_it"]["verdict"] == "leaked", result.stdout.str()
    assert report["test_it"]["leaked_bytes"] == (64 * 64 + 64) * 4  # the weight's and the bias's gradients


def test_checks_read_only_what_backward_reached_where_leaves_are_many() -> None:
    import torch

    from pytest_vramleak.tracking.tracker import COMPARED_PER_CHECK, Tracker

    params = [torch.nn.Parameter(torch.zeros(1)) for _ in range(COMPARED_PER_CHECK + 1)]
    model = torch.nn.Linear(8, 8)
    tracker = Tracker(defer=True)  # the plugin's: it compares what checks defer between tests
    tracker.begin()
    try:
        before = tracker.observe()
        model(torch.ones(2, 8)).sum().backward()
        tracker.observe(since=before)
        created = tracker.created("cpu", since=before.clock)
        assert sorted(ref.nbytes for ref in created) == [8 * 4, 8 * 8 * 4]
        assert tracker.grad_reads == 0 and tracker.deferred
    finally:
        tracker.end()
    assert tracker.drift() == [] and tracker.grad_reads == 1 and not tracker.deferred
    assert len(params) > COMPARED_PER_CHECK


SCRIPT_WITH_MANY_STORAGES = """
import torch
from torch.autograd.variable import Variable
from pytest_vramleak import LeakCheck

PARAMS = torch.nn.ParameterList(torch.nn.Parameter(torch.zeros(1)) for _ in range(2500))
BUFFERS = [torch.zeros(1) for _ in range(2500)]
MODEL = torch.nn.Linear(64, 64)

def run(body):
    check = LeakCheck("cpu")
    check.begin()
    check.start()
    body()
    check.stop()
    result = check.finish()
    check.close()
    print(result.outcome, result.leaked_bytes)

run(lambda: BUFFERS[0].resize_(4096))  # an older storage grown in place
# a backward the C++ engine runs directly (no check watches it) gives older leaves gradients
run(lambda: Variable._execution_engine.run_backward((MODEL(torch.ones(2, 64)).sum(),), (torch.ones(()),), False, False, (), True, True))
"""


def test_a_check_in_a_script_compares_every_older_tensor_itself(pytester: pytest.Pytester) -> None:
    # Outside pytest nothing compares between checks what a check leaves for later: a check made
    # for a script compares every older storage and gradient as it observes, however many.
    script = pytester.makepyfile(train=SCRIPT_WITH_MANY_STORAGES)
    result = pytester.run(sys.executable, str(script))
    assert result.ret == 0, result.stderr.str()
    assert result.outlines == ["leaked 16380", f"leaked {(64 * 64 + 64) * 4}"]


def test_what_checks_leave_to_later_is_compared_between_tests(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it=textwrap.dedent(MANY_LEAVES)
        + textwrap.dedent("""
            @pytest.mark.vram_budget
            def test_grows():
                BUFFERS[0].resize_(4096)

            @pytest.mark.vram_budget
            def test_unwatched_backward():  # the C++ engine called directly: no check watches it
                from torch.autograd.variable import Variable

                loss = MODEL(torch.ones(2, 64)).sum()
                Variable._execution_engine.run_backward((loss,), (torch.ones(()),), False, False, (), True, True)
            """)
    )
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "-p", "no:randomly", "--vramleak-report=r.json", "--vramleak-report=r.html"
    )
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            "*older tensors grew in place or were given gradients, 16.0 KiB on cpu, during test_it.py::test_grows "
            "(this process holds over 2,000 storages or leaves: checks compare their sizes and gradients between tests, *",
            "    held by test_it.BUFFERS[0]",
            "*older tensors grew in place or were given gradients, 16.2 KiB on cpu, during test_it.py::test_unwatched_backward (*",
        ]
    )
    found = json.loads((pytester.path / "r.json").read_text())["between_checks"]
    assert [(f["where"], f["device"], f["bytes"]) for f in found] == [
        ("test_it.py::test_grows", "cpu", 4096 * 4 - 4),
        ("test_it.py::test_unwatched_backward", "cpu", (64 * 64 + 64) * 4),
    ]
    assert "test_it.BUFFERS[0]" in found[0]["held_by"][0]
    assert "charged to no test" in (pytester.path / "r.html").read_text()


@pytest.fixture
def rebuilds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that grows by one each time the tracker indexes the whole heap."""
    from pytest_vramleak.tracking.tracker import Tracker

    counted: list[int] = []
    rebuild = Tracker._rebuild
    monkeypatch.setattr(Tracker, "_rebuild", lambda self: (counted.append(1), rebuild(self))[1])
    return counted


def test_tests_skipped_or_failing_in_set_up_cost_no_new_index_and_charge_nothing_on(
    pytester: pytest.Pytester, rebuilds: list[int]
) -> None:
    # A test skipped by a marker (or whose fixture fails) ends before its check observes
    # anything: what it made is read then, at the cost of what it made, not by indexing the
    # whole heap again before the next test (0.2 s at 50,000 live tensors, for every such test).
    pytester.makepyfile(
        test_it="""
        import pytest, torch

        KEPT = []

        @pytest.fixture
        def broken():
            KEPT.append(torch.ones(1024))  # kept by a fixture that then fails: not the next test's
            raise RuntimeError("no data")

        @pytest.mark.parametrize("i", range(3))
        def test_runs(i):
            torch.ones(8).sum()

        @pytest.mark.parametrize("i", range(3))
        @pytest.mark.skipif(True, reason="needs a GPU")
        def test_skipped(i):
            pass

        def test_broken(broken):
            pass

        @pytest.mark.parametrize("i", range(3))
        def test_runs_after(i):
            torch.ones(8).sum()
        """
    )
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "-p", "no:randomly", "--vramleak", "--vramleak-fail-on=any", "--vramleak-confirm=0"
    )
    result.assert_outcomes(passed=6, skipped=3, errors=1)
    assert len(rebuilds) == 1  # the first check's


AFTER_UNTRACKED = {
    # Each module checks a test first, so that the check after the unchecked test begins where an
    # earlier check ended: it reads what the untracked code made and changed, without indexing the
    # whole heap again. What that code did is no test's; what the checked test does after it is.
    "tensor_kept_by_the_unchecked_test": (
        "passed",
        """
        KEPT, VIEWS = [], []

        def test_unchecked():
            KEPT.append(torch.zeros(4096))

        @pytest.mark.vram_budget
        def test_it():
            VIEWS.append(KEPT[0][:10])
        """,
    ),
    "tensor_kept_then_collected_into_the_oldest_generation": (
        "passed",
        """
        KEPT, VIEWS = [], []

        def test_unchecked():
            KEPT.append(torch.zeros(4096))
            gc.collect(1)  # moves it out of the young generations

        @pytest.mark.vram_budget
        def test_it():
            VIEWS.append(KEPT[0][:10])
        """,
    ),
    "buffer_grown_in_place_by_the_unchecked_test": (
        "passed",
        """
        BUFFER = torch.zeros(16)

        def test_unchecked():
            BUFFER.resize_(1 << 14)

        @pytest.mark.vram_budget
        def test_it():
            BUFFER.add_(1)
        """,
    ),
    "gradients_given_by_an_unchecked_backward": (
        "passed",
        """
        MODEL = torch.nn.Linear(64, 64)

        def test_unchecked():
            MODEL(torch.ones(2, 64)).sum().backward()

        @pytest.mark.vram_budget
        def test_it():
            MODEL(torch.ones(2, 64)).sum().backward()  # accumulates into the gradients in place
        """,
    ),
    "storage_set_while_the_old_one_lives_on": (
        "passed",
        """
        WEIGHT = torch.zeros(16)
        ALIAS = [WEIGHT.view(16)]

        def test_unchecked():
            WEIGHT.set_(torch.ones(4096).untyped_storage())

        @pytest.mark.vram_budget
        def test_it():
            ALIAS.clear()  # the old storage dies, and the weight is read again
        """,
    ),
    "data_replaced_while_the_old_one_lives_on": (
        "passed",
        """
        WEIGHT = torch.zeros(16)
        ALIAS = [WEIGHT.view(16)]

        def test_unchecked():
            WEIGHT.data = torch.ones(4096)

        @pytest.mark.vram_budget
        def test_it():
            ALIAS.clear()
        """,
    ),
    "leak_after_an_unchecked_test": (
        "leaked",
        """
        KEPT = []

        def test_unchecked():
            KEPT.append(torch.zeros(4096))

        @pytest.mark.vram_budget
        def test_it():
            KEPT.append(torch.ones(4096))
        """,
    ),
    "storage_set_by_both": (
        "leaked",
        """
        WEIGHT = torch.zeros(16)

        def test_unchecked():
            WEIGHT.set_(torch.ones(4096).untyped_storage())

        @pytest.mark.vram_budget
        def test_it():
            WEIGHT.set_(torch.ones(8192).untyped_storage())  # 32 KiB kept, 16 KiB older freed
        """,
    ),
}


NO_AUTOMATIC_COLLECTIONS = """
import gc

def pytest_sessionstart(session):
    gc.disable()  # only the collections the tests and the plugin run: none moves objects by chance

def pytest_sessionfinish(session):
    gc.enable()
"""


@pytest.mark.parametrize("kind", sorted(AFTER_UNTRACKED))
def test_a_check_after_untracked_code_charges_the_test_alone(
    pytester: pytest.Pytester, run_checked, rebuilds: list[int], kind: str
) -> None:
    verdict, body = AFTER_UNTRACKED[kind]
    first = """
        import gc
        import pytest, torch

        @pytest.mark.vram_budget
        def test_a_checked_test_first():
            torch.ones(8).sum()
        """
    pytester.makepyfile(test_it=textwrap.dedent(first) + textwrap.dedent(body))
    pytester.makeconftest(NO_AUTOMATIC_COLLECTIONS)
    result, report = run_checked("-p", "no:randomly")
    assert report["test_it"]["verdict"] == verdict, result.stdout.str()
    # the first check indexes the heap; the one after the unchecked test only where Python's
    # collector moved what that test made out of the young generations
    assert len(rebuilds) == (2 if "collected" in kind else 1)


def test_a_step_check_after_an_unchecked_test_reads_only_what_it_made(
    pytester: pytest.Pytester, rebuilds: list[int]
) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest, torch

        MODEL = torch.nn.Linear(64, 64)
        KEPT = []

        def training(vramleak, keep):
            optimizer = torch.optim.SGD(MODEL.parameters(), lr=0.1)
            for step in vramleak.steps(8, warmup=2):
                optimizer.zero_grad()
                loss = MODEL(torch.randn(8, 64)).pow(2).mean()
                loss.backward()
                optimizer.step()
                if keep:
                    KEPT.append(loss)

        def test_clean_first(vramleak):
            training(vramleak, keep=False)

        def test_unchecked():
            MODEL(torch.ones(2, 64)).sum().backward()
            KEPT.append(torch.ones(4096))

        def test_clean(vramleak):
            training(vramleak, keep=False)

        def test_unchecked_again():
            MODEL.weight.data = MODEL.weight.data.clone()

        def test_leaking(vramleak):
            training(vramleak, keep=True)
        """
    )
    pytester.makeconftest(NO_AUTOMATIC_COLLECTIONS)
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(passed=4, failed=1)
    result.stdout.fnmatch_lines(["*test_leaking*", "*held by test_it.KEPT[[]*]*"])
    assert len(rebuilds) == 1


@contextmanager
def _in_a_body() -> Iterator[Any]:
    """A tracker as a checked test's body begins: set-up observed, the heap frozen again."""
    from pytest_vramleak.tracking.tracker import Tracker

    tracker = Tracker()
    tracker.begin()
    try:
        tracker.observe()
        tracker.freeze_young()
        yield tracker
    finally:
        tracker.end()


def test_what_was_made_since_the_freeze_is_listed_unless_someone_else_froze_the_heap() -> None:
    """The run that records sites lists what the body made from the objects gc tracks unfrozen,
    only while the tracker's own freeze holds: after another party's freeze, what the body made
    before it is frozen too, and nothing is listed (the sites are captured after the run)."""
    import gc

    import torch

    try:
        with _in_a_body() as tracker:
            made = torch.ones(8)
            listed = tracker.made_since_freeze()
            assert listed is not None and [id(obj) for obj in listed] == [id(made)]
            listed.clear()
            gc.freeze()
            assert tracker.made_since_freeze() is None
    finally:
        gc.unfreeze()


def test_nothing_is_listed_as_made_since_the_freeze_where_the_tracker_froze_again_meanwhile() -> None:
    """An observation during the body (a step check's) may freeze the heap again: what the body
    made before is frozen then, and nothing is listed."""
    import torch

    with _in_a_body() as tracker:
        before = torch.ones(8)
        tracker.freeze.refreeze()
        after = torch.ones(8)
        assert tracker.made_since_freeze() is None
        del before, after


def test_the_index_is_let_go_before_pytests_last_collections(pytester: pytest.Pytester) -> None:
    # pytest collects the heap again as it unconfigures (after every plugin has): the index of
    # what the checks read, an object per tensor, is gone by then, and the heap as it was.
    pytester.makeconftest(
        """
        import gc, pytest
        from pytest_vramleak.plugin.state import session_of
        from pytest_vramleak.tracking.refs import Entry, StorageRef

        @pytest.hookimpl(trylast=True)
        def pytest_unconfigure(config):
            tracker = session_of(config).tracker
            index = tracker.index
            left = sum(type(obj) in (Entry, StorageRef) for obj in gc.get_objects())
            print(f"index: {len(index.entries)} tensors, {len(index.storages)} storages; references left: {left}")
            print(f"frozen: {gc.get_freeze_count() > 0 and gc.get_freeze_count() != FROZEN}")

        FROZEN = gc.get_freeze_count()
        """
    )
    pytester.makepyfile(
        test_it="""
        import torch
        KEPT = []

        def test_keeps():
            KEPT.extend(torch.ones(4) for _ in range(300))
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--vramleak", "-s")
    result.stdout.fnmatch_lines(["*LEAKED test_it.py::test_keeps*"])
    result.stdout.fnmatch_lines(["index: 0 tensors, 0 storages; references left: 0", "frozen: False"])

"""Diagnoses follow from the path that holds a leak: each on a path it fits, none on a path it does not."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from .conftest import CHECKPOINT_HOOK, read_report

SUITE = """
import weakref
from unittest import mock
import pytest, torch

LOGGER = mock.Mock()
CACHE = weakref.WeakKeyDictionary()
PLAIN = {}

class Key:
    pass

class Holder:
    pass

def test_mock_keeps_its_calls():
    LOGGER.log(torch.ones(256))

def test_weak_key_value_holds_its_key():
    key = Key()
    CACHE[key] = (key, torch.ones(128))

def test_plain_dict():
    PLAIN["a"] = torch.ones(64)

@pytest.mark.parametrize("callbacks", [[object(), object()]])
def test_appends_to_a_parametrized_list(callbacks):
    callbacks.append(torch.ones(256))

@pytest.mark.parametrize("holder", [Holder()])
def test_sets_state_on_a_parametrized_object(holder):
    holder.state = torch.ones(32)

class Metric:
    pass

@pytest.mark.parametrize("metric", [Metric()])
def test_caches_a_computed_result(metric):
    metric._computed = torch.ones(2)

class MeanMetric:
    def __init__(self):
        self.values = []

    def update(self, value):
        self.values.append(value)

    def reset(self):
        self.values.clear()

class Recorder:
    def __init__(self):
        self.values = []

MEAN = MeanMetric()
RECORDER = Recorder()

def test_updates_a_metric_never_reset():
    MEAN.update(torch.ones(16))
    MEAN.update(torch.ones(16))

def test_records_on_an_object_without_reset():
    RECORDER.values.append(torch.ones(16))
    RECORDER.values.append(torch.ones(16))
"""

MOCK = "a unittest.mock mock keeps the arguments of every call"
WEAK = (
    "a weak-key dictionary (WeakKeyDictionary, torch's WeakTensorKeyDictionary) keeps each value while its key is alive"
)
APPENDED = "the test (or code it called) added entries to a list or dict that pytest keeps as a parametrize value"
STATE = "an object pytest keeps as a parametrize value for the whole session kept what the test computed on it"
COMPUTE = "a metric's cached compute() result"
RESET = "MEAN.values accumulates what every update adds (a metric's or a meter's state) until MEAN.reset() is called"
FALLBACK = "PLAIN['a'] keeps these tensors: it hangs from module test_it"


@pytest.fixture(scope="module")
def diagnoses(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    # One run in a process of its own for every case: what the tests leak on purpose stays there.
    folder = tmp_path_factory.mktemp("diagnoses")
    (folder / "test_it.py").write_text(textwrap.dedent(SUITE))
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:randomly",
        "--vramleak",
        "--vramleak-fail-on=any",
        "--vramleak-confirm=0",
        "--vramleak-report=r.json",
    ]
    result = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=300)
    assert result.returncode == pytest.ExitCode.TESTS_FAILED, result.stdout + result.stderr
    tests = json.loads((folder / "r.json").read_text())["tests"]
    return {t["nodeid"].split("::")[1].split("[")[0]: [d for g in t["tensors"] for d in g["diagnoses"]] for t in tests}


@pytest.mark.parametrize(
    ("test", "expected", "absent"),
    [
        ("test_mock_keeps_its_calls", MOCK, [WEAK, APPENDED, STATE]),
        ("test_weak_key_value_holds_its_key", WEAK, [MOCK, APPENDED, STATE]),
        ("test_appends_to_a_parametrized_list", APPENDED, [STATE, COMPUTE, MOCK]),
        ("test_sets_state_on_a_parametrized_object", STATE, [APPENDED, COMPUTE]),
        ("test_caches_a_computed_result", COMPUTE, [APPENDED]),
        ("test_plain_dict", FALLBACK, [MOCK, WEAK, APPENDED, STATE]),
        ("test_updates_a_metric_never_reset", RESET, [FALLBACK, "a module-level container"]),
        ("test_records_on_an_object_without_reset", "a module-level container gained 2 entries", ["reset()"]),
    ],
)
def test_a_diagnosis_follows_from_the_path(
    diagnoses: dict[str, list[str]], test: str, expected: str | None, absent: list[str]
) -> None:
    found = " | ".join(diagnoses[test])
    if expected is not None:
        assert expected in found
    for phrase in absent:
        assert phrase not in found


CREATE_GRAPH = "backward(create_graph=True) gave these gradients autograd graphs of their own"


def test_a_gradient_with_a_graph_of_its_own_is_named_as_create_graphs_cycle(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import torch

        MODEL = torch.nn.Linear(64, 64)
        PLAIN = torch.nn.Linear(64, 64)
        FIXED = torch.nn.Linear(64, 64)

        def test_second_order_through_backward():
            loss = MODEL(torch.randn(8, 64)).pow(2).sum()
            loss.backward(create_graph=True)

        def test_first_order():
            loss = PLAIN(torch.randn(8, 64)).pow(2).sum()
            loss.backward()

        def test_second_order_through_autograd_grad():
            loss = FIXED(torch.randn(8, 64)).pow(2).sum()
            grads = torch.autograd.grad(loss, list(FIXED.parameters()), create_graph=True)
            sum(g.pow(2).sum() for g in grads).backward()
            FIXED.zero_grad(set_to_none=True)
        """
    )
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--vramleak", "-W", "ignore::UserWarning", "--vramleak-report=r.json"
    )
    tests = read_report(pytester.path / "r.json")
    leak = tests["test_second_order_through_backward"]
    assert leak["verdict"] == "leaked", result.stdout.str()
    diagnosed = {holder: tensor["diagnoses"] for tensor in leak["tensors"] for holder in tensor["held_by"]}
    assert any(finding.startswith(CREATE_GRAPH) for finding in diagnosed["test_it.MODEL.weight.grad"])
    # the graphs the gradients were made by, which nothing in Python holds, get the same cause,
    # whether credited to the gradients (as their graph bytes) or in groups of their own
    graphs = [tensor["diagnoses"] for tensor in leak["tensors"] if tensor["graph_bytes"]]
    assert graphs and all(any(f.startswith(CREATE_GRAPH) for f in findings) for findings in graphs)
    assert not any("instead of loss.grad_fn" in f for findings in diagnosed.values() for f in findings)
    # first-order gradients kept on a module's model are kept once, and not this cycle
    assert tests["test_first_order"]["verdict"] == "passed"
    assert not any(
        f.startswith(CREATE_GRAPH) for tensor in tests["test_first_order"]["tensors"] for f in tensor["diagnoses"]
    )
    assert tests["test_second_order_through_autograd_grad"]["verdict"] == "passed"


THREAD_LEAK = """
import queue, threading
import torch

def _pin_loop(inbox, outbox, done):
    kept = []
    while not done.is_set():
        try:
            batch = inbox.get(timeout=0.01)
        except queue.Empty:
            continue
        pinned = batch.clone()
        kept.append(pinned)  # the loop keeps every batch it handed on
        outbox.put(pinned.sum().item())

def _plain_loop(inbox, outbox, done):
    while not done.is_set():
        try:
            batch = inbox.get(timeout=0.01)
        except queue.Empty:
            continue
        outbox.put(batch.sum().item())
        del batch

def _feed(loop, stop):
    inbox, outbox, done = queue.Queue(), queue.Queue(), threading.Event()
    thread = threading.Thread(target=loop, args=(inbox, outbox, done), daemon=True, name="pin_memory")
    thread.start()
    for _ in range(8):
        inbox.put(torch.ones(64, 1024))
        outbox.get()
    if stop:
        done.set()
        thread.join()

def test_loader_thread_keeps_batches():
    _feed(_pin_loop, stop=False)  # never stopped: its frame keeps `kept`

def test_loader_thread_stopped():
    _feed(_plain_loop, stop=True)
"""


def test_a_tensor_a_thread_the_test_started_keeps_is_named_with_the_thread(pytester: pytest.Pytester) -> None:
    # The thread of each run of the test has the name of the last run's, which still runs: the
    # tensors are the test's all the same, named with the thread that holds them.
    pytester.makepyfile(test_it=THREAD_LEAK)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly", "--vramleak")
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(
        [
            "*test_loader_thread_keeps_batches*",
            "float32[[]64, 1024[]] on cpu: *",
            "    held by thread 'pin_memory' _pin_loop:* local 'kept'[[]*",
            "    diagnosis: the thread 'pin_memory' is still running, and a frame of it keeps these tensors*",
        ]
    )
    result.stdout.no_fnmatch_line("*held by threads that were running before the test began*")
    result.stdout.no_fnmatch_line("*LEAKED*test_loader_thread_stopped*")


FINALIZER_LEAK = """
import weakref
import torch

def release(handle):
    pass

class Trainer:
    def __init__(self, bound):
        self.state = torch.ones(64, 1024)
        self.handle = object()
        callback = (self.close,) if bound else (release, self.handle)
        self._finalizer = weakref.finalize(self, *callback)

    def close(self):
        pass

def test_finalizer_with_a_bound_method():
    Trainer(bound=True)

def test_finalizer_with_a_function():
    Trainer(bound=False)
"""


def test_a_finalizer_that_keeps_its_object_is_named_and_diagnosed(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_it=FINALIZER_LEAK)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly", "--vramleak")
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(
        [
            "*test_finalizer_with_a_bound_method*",
            "float32[[]64, 1024[]] on cpu: *",
            "    held by weakref.finalize._registry[[]<finalize key>[]].func.__self__.state",
            "    diagnosis: weakref.finalize keeps its callback and arguments until it runs*",
        ]
    )
    result.stdout.no_fnmatch_line("*LEAKED*test_finalizer_with_a_function*")


CHECKPOINT_LEAK = """
import torch
from torch.utils.checkpoint import checkpoint

MODEL = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024))
OUTPUTS = []

def test_checkpointed_output_kept_with_its_graph():
    x = torch.randn(512, 1024, requires_grad=True)
    OUTPUTS.append(checkpoint(MODEL, x, use_reentrant=False).sum())

def test_checkpointed_output_kept_detached():
    x = torch.randn(512, 1024, requires_grad=True)
    OUTPUTS.append(checkpoint(MODEL, x, use_reentrant=False).sum().detach())
"""


def test_a_checkpointed_graph_and_what_checkpoints_hooks_keep_are_named(pytester: pytest.Pytester) -> None:
    # the graph keeps the region's input (2.0 MiB), checkpoint's hooks its RNG state; nothing is
    # recomputed by reading the graph (the activations a recomputation makes are not listed)
    pytester.makepyfile(test_it=CHECKPOINT_LEAK)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "no:randomly", "--vramleak", "--vramleak-confirm=0"
    )
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(
        [
            "*test_checkpointed_output_kept_with_its_graph*",
            "*(the test kept 2.0 MiB)",
            "float32[[]] on cpu: 1 tensor, 4 B, and the autograd graph behind it: 1 saved tensors, 2.0 MiB",
            "    held by test_it.OUTPUTS[[]0[]]",
            "    diagnosis: autograd graph kept alive: * a graph that goes through a torch.utils.checkpoint region*",
            "uint8[[]*[]] on cpu: 1 tensor, *",
            f"    held by <function {CHECKPOINT_HOOK} held outside Python's gc> -> closure var 'frame'*",
            "    diagnosis: torch.utils.checkpoint keeps what a checkpointed region saved or recomputed for backward*",
        ]
    )
    result.stdout.no_fnmatch_line("float32[[]512, 1024[]] on cpu: *")
    result.stdout.no_fnmatch_line("*diagnosis: a closure (a callback, a logger) captured it*")
    result.stdout.no_fnmatch_line("*LEAKED*test_checkpointed_output_kept_detached*")


CLASS_ATTRIBUTE_LEAK = """
import torch

class Shared:
    CACHE = {}  # one dict for every instance, alive as long as the class

    def embed(self, key):
        return self.CACHE.setdefault(key, torch.ones(1024))

class Own:
    def __init__(self):
        self.cache = {}  # each instance's own, gone with it

    def embed(self, key):
        return self.cache.setdefault(key, torch.ones(1024))

def test_class_attribute_cache():
    for _ in range(4):
        Shared().embed(len(Shared.CACHE))  # a new key each time: the cache grows with every run

def test_instance_attribute_cache():
    for _ in range(4):
        own = Own()
        own.embed(len(own.cache))
"""


def test_a_class_attribute_shared_by_every_instance_is_told_from_a_module_level_container(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_it=CLASS_ATTRIBUTE_LEAK)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly", "--vramleak")
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(
        [
            "*test_class_attribute_cache*",
            "    held by test_it.Shared.CACHE[[]*[]]",
            "    diagnosis: Shared.CACHE is a class attribute, not an instance attribute*",
        ]
    )
    result.stdout.no_fnmatch_line("*a module-level container gained*")
    result.stdout.no_fnmatch_line("*LEAKED*test_instance_attribute_cache*")


MODULE_HOOK_LEAK = """
import torch

HOOKED = torch.nn.Linear(64, 64)
PLAIN = torch.nn.Linear(64, 64)

def capture_activations(module, inputs, output):
    if not hasattr(module, "activations"):
        module.activations = []
    module.activations.append(inputs[0].detach())

HOOKED.register_forward_hook(capture_activations)

def test_hook_stores_on_its_module():
    with torch.no_grad():
        HOOKED(torch.ones(32, 64))

def test_module_stores_without_a_hook():
    PLAIN.history = getattr(PLAIN, "history", [])
    PLAIN.history.append(torch.ones(32, 64))
"""


def test_a_hook_storing_on_its_module_is_named_and_a_module_storing_without_one_is_not(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_it=MODULE_HOOK_LEAK)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly", "--vramleak")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(
        [
            "*test_hook_stores_on_its_module*",
            "    held by test_it.HOOKED.activations[[]*]",
            "    diagnosis: a module hook keeps what it is given (a forward hook of a Linear, capture_activations(), "
            "is registered on the module whose .activations holds these tensors)*",
            "*test_module_stores_without_a_hook*",
            "    held by test_it.PLAIN.history[[]*]",
        ]
    )
    assert sum("a module hook keeps" in line for line in result.stdout.lines) == 1


def test_an_object_on_a_cycle_kept_from_outside_gc_is_named_as_the_owner(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import ctypes
        import torch

        class Monitor:
            def __init__(self):
                self.history = []
                self.handler = self.on_event  # the bound method refers back to the monitor

            def on_event(self):
                print(len(self.history))

        def test_registers_a_monitor():
            monitor = Monitor()
            monitor.history.append(torch.ones(64))
            # what a C extension does with a callback it is given: a reference gc does not see
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(monitor.handler))
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--vramleak", "--vramleak-fail-on=any")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "    allocated at test_it.py:14 in test_registers_a_monitor()",
            "    held by <Monitor on a reference cycle kept from outside Python's gc>.history[[]0[]]",
            "    diagnosis: nothing in Python reaches the object that keeps these tensors: it lies on a reference cycle*",
        ]
    )


def test_a_timer_not_ended_and_a_queue_not_drained_are_named_with_their_fixes(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import queue
        import threading
        import torch

        RESULTS = queue.Queue()

        def test_schedules_a_report():
            timer = threading.Timer(3600, print, args=(torch.ones(64),))
            timer.daemon = True
            timer.start()

        def test_puts_outputs_nobody_gets():
            RESULTS.put(torch.ones(32))
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--vramleak", "--vramleak-fail-on=any")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(
        [
            "    held by thread 'Thread-*' (Timer, not ended).args[[]0[]]",
            "    diagnosis: the thread 'Thread-*' (Timer, not ended) keeps its target, its arguments*: cancel the timer*",
            "    held by test_it.RESULTS.queue[[]*[]]",
            "    diagnosis: a queue.Queue keeps every item put on it*",
        ]
    )


def test_a_mutable_default_and_a_numpy_array_of_objects_are_named_with_their_fixes(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import numpy
        import torch

        SLOTS = numpy.empty(8, dtype=object)
        COUNT = [0]

        def remember(x, seen=[]):
            seen.append(x)

        def test_remembers():
            remember(torch.ones(64))

        def test_fills_a_slot():
            SLOTS[COUNT[0]] = torch.ones(32)
            COUNT[0] += 1
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--vramleak")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(
        [
            "    held by test_it.remember.__defaults__[[]0[]][[]4[]]",
            "    diagnosis: a default argument of remember() is made once*",
            "    held by test_it.SLOTS[[]4[]]",
            "    diagnosis: SLOTS[[]4[]] keeps these tensors: it hangs from module test_it*",
        ]
    )


def test_records_kept_with_every_row_of_their_batch_are_told_the_list_not_a_small_view(
    pytester: pytest.Pytester,
) -> None:
    # airctic/icevision#692: a metric keeps each prediction record, and each record its image, a
    # row of the batch. Every row is kept, so a copy of each would save nothing.
    pytester.makepyfile(
        test_it="""
        import torch

        class Record:
            def __init__(self, img, scores):
                self.components = [img, scores]

        RECORDS = []

        def test_validation_epoch():
            for _ in range(4):
                images = torch.rand(8, 3, 32, 32)
                RECORDS.extend(Record(img, img.mean((1, 2))) for img in images)
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--vramleak")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["    diagnosis: what RECORDS[[]*[]] holds keeps these tensors: it hangs from module test_it*"]
    )
    result.stdout.no_fnmatch_line("*a view keeps its whole storage*")


def test_a_figure_pyplot_keeps_open_is_named_with_its_fix(pytester: pytest.Pytester) -> None:
    # torchmetrics' plot tests: a tensor given as ticks is kept by the tick locator's numpy array,
    # a dozen levels below pyplot's table of open figures, and each run opens one more figure.
    # The fixed twin closes its figure.
    pytester.makepyfile(
        test_it="""
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import torch

        def test_plots_and_leaves_it_open():
            fig, ax = plt.subplots()
            ax.plot(torch.ones(3))
            ax.set_xticks(torch.arange(3))

        def test_plots_and_closes_it():
            fig, ax = plt.subplots()
            ax.plot(torch.ones(3))
            ax.set_xticks(torch.arange(3))
            plt.close(fig)
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--vramleak", "--vramleak-fail-on=any")
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(
        [
            "LEAKED test_it.py::test_plots_and_leaves_it_open*",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "    held by pyplot figure * (open)._localaxes[[]0[]].xaxis.major._locator.locs.base",
            "    diagnosis: pyplot figure * is still open: pyplot keeps every figure it made until it is closed*"
            "plt.close(fig)*",
        ]
    )
    result.stdout.no_fnmatch_line("*held outside Python's gc*")


DEEP_NODES = textwrap.dedent(
    """
    import json
    import torch

    class Node:
        __slots__ = ("child",)

        def __init__(self, child):
            self.child = child

    def deep(value):  # twelve objects above the value
        for _ in range(12):
            value = Node(value)
        return value
    """
)


def test_a_holder_the_walk_from_the_users_modules_reaches_is_named_though_another_is_not(
    pytester: pytest.Pytester,
) -> None:
    # optuna/optuna#5183: each trial's model is a dozen levels below the test's STUDY. The walk
    # from the user's modules reaches it; one held as deep below json is beyond every walk, and
    # what the first walk found must not be lost for it.
    pytester.makepyfile(
        test_it=DEEP_NODES
        + textwrap.dedent(
            """
            STUDY = []

            def test_keeps_deep():
                STUDY.append(deep(torch.ones(256)))
                json.__dict__.setdefault("_kept_by_test_it", []).append(deep(torch.ones(128)))
            """
        )
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--vramleak", "--vramleak-fail-on=any")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "float32[[]256[]] on cpu: 1 tensor*",
            "    held by test_it.STUDY[[]*[]].child.child.child.child.child.child.child.child.child.child.child.child",
            "float32[[]128[]] on cpu: 1 tensor*",
            "    held by <Node 8 levels up, where the search for holders stopped>.child.child*",
        ]
    )


def test_a_holder_deeper_than_the_search_is_not_said_to_be_held_outside_gc(pytester: pytest.Pytester) -> None:
    # Twelve objects deep below a module no test owns (json): the search backwards stops at its
    # depth and the walk forwards from every module gives up before; where it stopped is said,
    # not that nothing gc sees holds it.
    pytester.makepyfile(
        test_it=DEEP_NODES
        + textwrap.dedent(
            """
            def test_keeps_deep():
                json.__dict__.setdefault("_kept_by_test_it", []).append(deep(torch.ones(256)))
            """
        )
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--vramleak", "--vramleak-fail-on=any")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["    held by <Node 8 levels up, where the search for holders stopped>.child.child*"])
    result.stdout.no_fnmatch_line("*held outside Python's gc*")

"""The diagnosis rules as decision tables: each on a holder path built by hand that it fits, none on a path alike."""

from __future__ import annotations

import pytest

from pytest_vramleak.holders import diagnosis
from pytest_vramleak.holders.diagnosis import Rule
from pytest_vramleak.holders.paths import (
    AUTOCAST_CACHE_PATH,
    HELD_IN_CPP_PATH,
    Edge,
    EdgeKind,
    HolderPath,
    Root,
    RootKind,
    own_graph_path,
    own_view_path,
    thread_autocast_path,
)
from pytest_vramleak.tracking.census import KEEPS_ITS_OUTPUT, SAVED_A_VIEW_OF_ITS_OUTPUT

from ...conftest import CHECKPOINT_HOOK

CHECKPOINT_UNPACK = "torch.utils.checkpoint._checkpoint_hook.__init__.<locals>.unpack_hook"


def _group(*paths: HolderPath, **fields: object) -> object:
    from pytest_vramleak.holders.snapshot import TensorGroup

    group = TensorGroup("float32", (64,), "cpu", bytes=256, count=int(fields.pop("count", 1)))  # type: ignore[arg-type]
    group.holders = list(paths)
    for name, value in fields.items():
        setattr(group, name, value)
    return group


def module(name: str, *edges: Edge) -> HolderPath:
    return HolderPath(Root("module", name, "module", name=name), edges)


def root(kind: RootKind, label: str, *edges: Edge, type_name: str = "", thread: str = "") -> HolderPath:
    return HolderPath(Root(kind, label, type_name or kind, thread=thread), edges)


def attr(name: str, to: str = "Tensor") -> Edge:
    return Edge("attribute", name, to)


def item(key: str, to: str = "Tensor") -> Edge:
    return Edge("item", key, to)


def edge(kind: EdgeKind, name: str = "", to: str = "Tensor") -> Edge:
    return Edge(kind, name, to)


def _logged_row(index: str) -> HolderPath:
    """A loss a logger's history keeps in its row ``index`` (wandb/wandb#354)."""
    return module(
        "test_it",
        attr("RUN", "Run"),
        attr("history", "History"),
        attr("rows", "list"),
        item(index, "dict"),
        item("'loss'"),
    )


def _local_entry(name: str, index: str) -> HolderPath:
    """Entry ``index`` of the list a test's frame keeps in its local ``name``."""
    return HolderPath(Root("frame local", f"test_it:9 local {name!r}", "frame local", name=name), (item(index),))


PYTEST_SELF = "self (the TestModel instance pytest keeps until the session ends)"


# Each rule: the words its diagnosis starts with, a group whose path it fits, and one whose path
# looks alike (a name that reads the same, a near type) that it must not be given.
def _spectral_norm_state(entry: str) -> HolderPath:
    """The path to the state of ``NET[0]``'s weight's parametrization ``entry``."""
    return module(
        "test_it",
        attr("NET", "Sequential"),
        attr("0", "ParametrizedLinear"),
        attr("parametrizations", "ModuleDict"),
        attr("weight", "ParametrizationList"),
        attr(entry, "_SpectralNorm"),
        attr("_v"),
    )


EVERY_DIAGNOSIS: dict[str, tuple[Rule, str, object, object]] = {
    "history": (
        diagnosis.kept_history,
        "autograd history kept",
        _group(module("test_it", attr("TRAINER", "Trainer"), attr("total_loss")), kind="history", nodes=40),
        _group(module("test_it", attr("TRAINER", "Trainer"), attr("total_loss_history", "list"), item("0"))),
    ),
    "history in a gradient": (
        diagnosis.kept_history_in_a_gradient,
        "autograd history kept in a gradient",
        _group(module("test_it", attr("MODEL", "Linear"), edge("gradient", "grad")), kind="history", grad_graph=True),
        _group(module("test_it", attr("MODEL", "Linear"), edge("gradient", "grad")), kind="history"),
    ),
    "graph carried by a loop": (
        diagnosis.graph_carried_by_a_loop,
        "autograd graph kept alive: 1.0 KiB in 4 saved tensors behind a tensor a running loop",
        _group(root("frame local", "test_it:9 local 'hidden'"), kind="graph", graph_bytes=1024, graph_tensors=4),
        _group(root("frame local", "test_it:9 local 'hidden'"), kind="tensor"),
    ),
    "graph kept": (
        diagnosis.graph_kept,
        "autograd graph kept alive: 1.0 KiB in 4 saved tensors behind a tensor that still has its grad_fn",
        _group(module("test_it", attr("LOSSES", "list"), item("0")), graph_bytes=1024, graph_tensors=4),
        _group(module("test_it", attr("LOSSES", "list"), item("0"))),
    ),
    "a tensor written into with values that carry their graph": (
        diagnosis.written_with_a_graph,
        "BANK was written into with values that carry their autograd graph (its grad_fn is CopySlices: "
        "tensor[index] = value, .copy_(), index_put_()), so it keeps every write's graph, 1.0 KiB in 4 saved tensors",
        _group(module("test_it", attr("BANK")), graph_bytes=1024, graph_tensors=4, grad_fn="CopySlices"),
        _group(module("test_it", attr("BANK")), graph_bytes=1024, graph_tensors=4, grad_fn="AddBackward0"),
    ),
    "a value a console or a doctest echoed": (
        diagnosis.echoed_value,
        "builtins._ is where sys.displayhook keeps the last value an interactive console or a doctest echoed",
        _group(module("builtins", attr("_"))),
        _group(module("builtins", attr("_kept"))),
    ),
    "graph kept by state set again from itself": (
        diagnosis.graph_kept,
        "autograd graph kept alive: 1.0 KiB in 4 saved tensors behind MODEL[1].running_mean, a tensor that still has "
        "its grad_fn: a state set from a computation made with autograd on",
        _group(
            module("test_it", attr("MODEL", "Sequential"), attr("1", "MeanOnlyBatchNorm"), attr("running_mean")),
            graph_bytes=1024,
            graph_tensors=4,
        ),
        _group(module("test_it", attr("MODEL", "Sequential"), attr("1", "MeanOnlyBatchNorm"), attr("running_mean"))),
    ),
    "graph kept by entries a container gains": (
        diagnosis.graph_kept,
        "autograd graph kept alive: 1.0 KiB in 4 saved tensors behind tensors that still have their grad_fn, kept in "
        "RUN.history.rows (RUN.history.rows[40], ...): each keeps the graph of the step that made it",
        _group(
            _logged_row("40"),
            _logged_row("41"),
            graph_bytes=1024,
            graph_tensors=4,
            count=2,
        ),
        _group(
            _logged_row("40"),
            _logged_row("41"),
            count=2,
        ),
    ),
    "graph kept by a value stored as it was computed": (
        diagnosis.graph_kept,
        "autograd graph kept alive: 1.0 KiB in 4 saved tensors behind LOSSES['step-4'], a tensor that still has its "
        "grad_fn: a loss or an output stored as it was computed keeps the graph of the step that made it",
        _group(module("test_it", attr("LOSSES", "dict"), item("'step-4'")), graph_bytes=1024, graph_tensors=4, part=5),
        _group(
            module("test_it", attr("LOSSES", "dict"), item("'step-4'")),
            graph_bytes=1024,
            graph_tensors=4,
            part=5,
            graph_of_other_parts=512,
        ),
    ),
    "graph kept by a value computed from its last value": (
        diagnosis.graph_kept,
        "autograd graph kept alive: 1.0 KiB in 4 saved tensors behind STATE['h'], a tensor that still has its "
        "grad_fn, whose graph holds what other runs of the test computed",
        _group(
            module("test_it", attr("STATE", "dict"), item("'h'")),
            graph_bytes=1024,
            graph_tensors=4,
            part=5,
            graph_of_other_parts=512,
        ),
        _group(module("test_it", attr("STATE", "dict"), item("'h'")), graph_bytes=1024, graph_tensors=4, part=5),
    ),
    "graph kept by entries a frame's local gains": (
        diagnosis.graph_kept,
        "autograd graph kept alive: 1.0 KiB in 4 saved tensors behind tensors that still have their grad_fn, kept in "
        "predictions (predictions[2], ...)",
        _group(
            *(_local_entry("predictions", index) for index in ("2", "3")), graph_bytes=1024, graph_tensors=4, count=2
        ),
        _group(
            *(_local_entry("predictions", index) for index in ("2", "2")), graph_bytes=1024, graph_tensors=4, count=2
        ),
    ),
    "what a fixture put in doctest_namespace": (
        diagnosis.fixture_state,
        "doctest_namespace is pytest's own session-scoped dict of the names doctests see",
        _group(
            HolderPath(
                Root("fixture", "fixture 'doctest_namespace' (session scope)", "fixture", name="doctest_namespace"),
                (item("'model'", "Linear"), attr("weight", "Parameter")),
            )
        ),
        _group(
            HolderPath(
                Root("fixture", "fixture 'cache' (session scope)", "fixture", name="cache"),
                (item("'model'", "Linear"), attr("weight", "Parameter")),
            )
        ),
    ),
    "a gradient of a tensor that is no parameter": (
        diagnosis.gradient_of_an_input,
        "backward() wrote a gradient into IMAGES[15], a tensor that is no parameter",
        _group(module("test_it", attr("IMAGES", "list"), item("15"), edge("gradient", "grad")), kind="grad"),
        _group(
            module("test_it", attr("MODEL", "Linear"), attr("weight", "Parameter"), edge("gradient", "grad")),
            kind="grad",
        ),
    ),
    "graph kept through torch.utils.checkpoint": (
        diagnosis.graph_kept,
        "autograd graph kept alive: 1.0 KiB in 4 saved tensors behind a tensor that still has its grad_fn, a graph "
        "that goes through a torch.utils.checkpoint region",
        _group(
            module("test_it", attr("LOSSES", "list"), item("0")),
            graph_bytes=1024,
            graph_tensors=4,
            graph_hooks={CHECKPOINT_UNPACK},
        ),
        _group(module("test_it", attr("LOSSES", "list"), item("0")), graph_bytes=1024, graph_tensors=4),
    ),
    "pack hook kept its output": (
        diagnosis.pack_hook_kept_its_output,
        "a torch.autograd.graph.saved_tensors_hooks pack hook returned the tensor it was given as it is",
        _group(
            own_graph_path(["test_it.<lambda>"], False),
            kind="graph",
            graph_bytes=1024,
            graph_tensors=2,
            graph_hooks={KEEPS_ITS_OUTPUT, "test_it.<lambda>"},
        ),
        # a pack hook that moved what it packed elsewhere (an offload): the graph holds no output of its own
        _group(HELD_IN_CPP_PATH, kind="graph", graph_bytes=1024, graph_tensors=2, graph_hooks={"test_it.unpack"}),
    ),
    "a custom Function saved a view of its output": (
        diagnosis.saved_a_view_of_its_output,
        "autograd.Function test_it.ScaleFlat saved a view of its own output for backward",
        _group(
            own_view_path(["test_it.ScaleFlat"]),
            kind="graph",
            graph_bytes=1024,
            graph_tensors=2,
            graph_hooks={SAVED_A_VIEW_OF_ITS_OUTPUT + "test_it.ScaleFlat"},
        ),
        # a custom Function that saved its input: the graph holds no output of its own
        _group(HELD_IN_CPP_PATH, kind="graph", graph_bytes=1024, graph_tensors=2),
    ),
    "autocast region of another thread": (
        diagnosis.autocast_region_left_open,
        "an autocast region that thread 'inference-server' keeps open around its whole loop",
        _group(thread_autocast_path("inference-server", 7, "serve_forever() (server.py)"), cls="Parameter"),
        _group(AUTOCAST_CACHE_PATH, cls="Parameter"),  # the test's own thread: a region it left open
    ),
    "grad_fn kept": (
        diagnosis.grad_fn_kept,
        "an autograd node (a grad_fn) was kept",
        _group(
            module("test_it", attr("NODES", "list"), item("0", "SumBackward0"), edge("autograd node", "SumBackward0"))
        ),
        _group(module("test_it", attr("autograd_graph_of_sums", "list"), item("0"))),
    ),
    "numpy array": (
        diagnosis.numpy_array,
        "a numpy array made by tensor.numpy()",
        _group(module("test_it", attr("ARRAYS", "list"), item("0", "ndarray"), edge("array base"))),
        _group(module("test_it", attr("OBJECTS", "ndarray"), item("4"))),  # an array of Python objects
    ),
    "module hook": (
        diagnosis.hook_keeps,
        "a module hook keeps what it is given",
        _group(
            module(
                "test_it",
                attr("MODEL", "Linear"),
                edge("hook dict", "_forward_hooks", "OrderedDict"),
                item("0", "function"),
                edge("closure variable", "seen", "list"),
                item("0"),
            )
        ),
        _group(module("test_it", attr("MODEL", "Linear"), attr("my_forward_hooks", "dict"), item("0"))),
    ),
    "tensor hook": (
        diagnosis.hook_keeps,
        "a tensor's hook (register_hook) keeps what it is given",
        _group(
            module(
                "test_it",
                attr("PARAM", "Parameter"),
                edge("tensor hooks", "_backward_hooks", "OrderedDict"),
                item("4", "function"),
                edge("closure variable", "big"),
            )
        ),
        _group(
            module(
                "test_it",
                attr("MODEL", "Linear"),
                edge("hook dict", "_backward_hooks", "OrderedDict"),
                item("4", "function"),
                edge("closure variable", "big"),
            )
        ),
    ),
    "lru_cache": (
        diagnosis.lru_cache,
        "functools.lru_cache / functools.cache keeps every result it returned",
        _group(module("test_it", attr("embed", "_lru_cache_wrapper"), edge("lru_cache", to="dict"), item("(3,)"))),
        _group(module("test_it", attr("lru_cache", "dict"), item("'embed'"))),
    ),
    "sys.last_traceback": (
        diagnosis.last_error,
        "sys.last_traceback / sys.last_value keep the last reported error's frames",
        _group(
            module(
                "sys",
                attr("last_traceback", "traceback"),
                edge("traceback frame", "test_fit:12", "frame"),
                edge("local", "batch"),
            )
        ),
        _group(module("test_it", attr("last_traceback", "list"), item("0"))),
    ),
    "pytest-rerunfailures": (
        diagnosis.rerunfailures_failure,
        "pytest-rerunfailures keeps each failure's traceback on its test item",
        _group(
            module(
                "_pytest.main",
                attr("items", "list"),
                item("1", "Function"),
                attr("_rerun_condition_excinfos", "dict"),
                item("'call'", "list"),
                item("0", "ExceptionInfo"),
                attr("_traceback", "Traceback"),
                edge("traceback frame", "test_fit:12", "frame"),
                edge("local", "batch"),
            )
        ),
        _group(
            module(
                "test_it",
                attr("ERRORS", "list"),
                item("0", "RuntimeError"),
                edge("traceback", to="traceback"),
                edge("traceback frame", "test_fit:12", "frame"),
                edge("local", "batch"),
            )
        ),
    ),
    "stored exception": (
        diagnosis.stored_exception,
        "a stored exception keeps its traceback",
        _group(
            module(
                "test_it",
                attr("ERRORS", "list"),
                item("0", "RuntimeError"),
                edge("traceback", to="traceback"),
                edge("traceback frame", "test_fit:12", "frame"),
                edge("local", "batch"),
            )
        ),
        _group(module("test_it", attr("ERRORS", "list"), item("0", "RuntimeError"), attr("args", "tuple"), item("0"))),
    ),
    "closure": (
        diagnosis.closure,
        "a closure (a callback, a logger) captured it",
        _group(module("test_it", attr("CALLBACKS", "list"), item("0", "function"), edge("closure variable", "batch"))),
        _group(module("test_it", attr("CALLBACKS", "dict"), item("'closure var batch'"))),
    ),
    "a thread's frame": (
        diagnosis.thread_frame,
        "the thread 'pin_memory' is still running, and a frame of it keeps these tensors",
        _group(root("thread local", "thread 'pin_memory' _loop:8 local 'kept'", item("0"), thread="pin_memory")),
        _group(root("frame local", "test_fit:8 local 'kept'", item("0"))),
    ),
    "atexit": (
        diagnosis.exit_callback,
        "atexit keeps every callback registered with it, and what the callback refers to, until the interpreter exits",
        _group(root("atexit", "atexit callback MetricsWriter.flush -> __self__", attr("pending", "list"), item("0"))),
        _group(module("test_it", attr("WRITER", "MetricsWriter"), attr("pending", "list"), item("0"))),
    ),
    "saved_tensors_hooks pack hook": (
        diagnosis.saved_tensors_stored_by_a_pack_hook,
        "Offload.pack is a pack hook of torch.autograd.graph.saved_tensors_hooks that keeps each tensor autograd saves",
        _group(
            module(
                "test_it",
                Edge("attribute", "OFFLOAD", "Offload", pack_hook="Offload.pack"),
                attr("storage", "dict"),
                item("12"),
            )
        ),
        _group(module("test_it", attr("OFFLOAD", "Offload"), attr("storage", "dict"), item("12"))),
    ),
    "weakref.finalize": (
        diagnosis.finalizer_keeps_its_object,
        "weakref.finalize keeps its callback and arguments until it runs",
        _group(
            module(
                "weakref",
                attr("finalize", "type"),
                attr("_registry", "dict"),
                item("<finalize key>", "finalize._Info"),
                attr("func", "method"),
                attr("__self__", "Trainer"),
                attr("state"),
            )
        ),
        _group(module("test_it", attr("TRAINER", "Trainer"), attr("finalize_state", "dict"), item("'state'"))),
    ),
    "torch.utils.checkpoint's hooks": (
        diagnosis.checkpoint_hooks,
        "torch.utils.checkpoint keeps what a checkpointed region saved or recomputed for backward",
        _group(
            HolderPath(
                Root("outside gc", "<function ... held outside Python's gc>", "function", name=CHECKPOINT_HOOK),
                (edge("closure variable", "frame", "_CheckpointFrame"), attr("recomputed", "defaultdict")),
            )
        ),
        _group(
            HolderPath(
                Root("outside gc", "<function ... held outside Python's gc>", "function", name="test_it.pack_hook"),
                (edge("closure variable", "frame", "_CheckpointFrame"), attr("recomputed", "defaultdict")),
            )
        ),
    ),
    "fixture gradients": (
        diagnosis.fixture_gradients,
        "backward() gave the model that fixture 'model' (module scope) keeps for many tests its gradients",
        _group(
            root("fixture", "fixture 'model' (module scope)", attr("weight", "Parameter"), edge("gradient", "grad")),
            kind="grad",
        ),
        _group(
            module("test_it", attr("fixture_cache", "dict"), item("'model'", "Linear"), attr("weight")), kind="grad"
        ),
    ),
    "fixture state": (
        diagnosis.fixture_state,
        "state kept on a value that fixture 'data' (module scope) shares",
        _group(root("fixture", "fixture 'data' (module scope)", attr("cache", "list"), item("0"))),
        _group(
            module("test_it", attr("fixtures_seen", "dict"), item("'data'", "Data"), attr("cache", "list"), item("0"))
        ),
    ),
    "an open pyplot figure": (
        diagnosis.open_figure,
        "pyplot figure 3 is still open: pyplot keeps every figure it made until it is closed",
        _group(
            root(
                "pyplot figure",
                "pyplot figure 3 (open)",
                attr("_localaxes", "list"),
                item("0", "Axes"),
                attr("xaxis", "XAxis"),
                attr("major", "Ticker"),
                attr("_locator", "FixedLocator"),
                attr("locs", "ndarray"),
                edge("array base", "base"),
                type_name="Figure",
            )
        ),
        # a figure the test keeps in a module's list (closing it in pyplot would free nothing)
        _group(module("test_it", attr("FIGURES", "list"), item("0", "Figure"), attr("_localaxes", "list"), item("0"))),
    ),
    "pytest's test instance": (
        diagnosis.test_instance,
        "pytest keeps each test's class instance until the session ends, and with it what the test set on self (self.t)",
        _group(root("pytest instance", PYTEST_SELF, attr("t"), type_name="pytest")),
        _group(root("frame local", "test_fit:12 local 'self'", attr("t"))),
    ),
    "a test class's list": (
        diagnosis.test_class_attribute,
        "TestModel.outputs is a class attribute, not an instance attribute: pytest makes a fresh "
        "instance for every test, but the test class and what its attributes hold live until the session ends, so what every test adds "
        "to it stays: clear it in teardown_method (self.outputs.clear()), or give each test its own (self.outputs = [] "
        "in setup_method)",
        _group(root("test class", "TestModel", attr("outputs", "list"), item("4"), type_name="pytest")),
        _group(root("pytest instance", PYTEST_SELF, attr("outputs", "list"), item("4"), type_name="pytest")),
    ),
    "a TestCase class's dict": (
        diagnosis.test_class_attribute,
        "TestModel.cache is a class attribute, not an instance attribute: pytest makes a fresh "
        "instance for every test, but the test class and what its attributes hold live until the session ends, so what every test adds "
        "to it stays: clear it in tearDown (self.cache.clear()), or give each test its own (self.cache = {} in setUp)",
        _group(root("TestCase class", "TestModel", attr("cache", "dict"), item("'a'"), type_name="pytest")),
        _group(module("test_it", attr("TestModel", "type"), attr("cache", "dict"), item("'a'"))),
    ),
    "a test class's tensor": (
        diagnosis.test_class_attribute,
        "TestModel.weights is a class attribute, not an instance attribute: pytest makes a fresh "
        "instance for every test, but the test class and what its attributes hold live until the session ends: set it back to None in "
        "teardown_class, or set it on self in setup_method",
        _group(root("test class", "TestModel", attr("weights"), type_name="pytest")),
        _group(root("test class", "TestModel", edge("class internals"), type_name="pytest")),
    ),
    "record_property": (
        diagnosis.record_property,
        "pytest keeps every record_property value",
        _group(root("record_property", "record_property values of test_fit", item("0", "tuple"), item("1"))),
        _group(module("test_it", attr("record_property_values", "list"), item("0"))),
    ),
    "pytest's warnings": (
        diagnosis.recorded_warning,
        "pytest keeps every warning it recorded",
        _group(
            root(
                "pytest warnings",
                "the warnings pytest recorded",
                item("0", "WarningMessage"),
                attr("message", "UserWarning"),
                attr("args", "tuple"),
                item("0"),
            )
        ),
        _group(module("test_it", attr("WARNINGS", "list"), item("0", "UserWarning"), attr("args", "tuple"), item("0"))),
    ),
    "a parametrized list appended to": (
        diagnosis.parametrized_list_appended_to,
        "the test (or code it called) added entries to a list or dict that pytest keeps as a parametrize value",
        _group(root("parametrize", "parametrize value callbacks of test_fit", item("2"))),
        _group(module("test_it", attr("CALLBACKS", "list"), item("2"))),
    ),
    "state on a parametrized object": (
        diagnosis.parametrized_object_state,
        "an object pytest keeps as a parametrize value for the whole session kept what the test computed on it (a cached",
        _group(root("parametrize", "parametrize value holder of test_fit", attr("state"))),
        _group(module("test_it", attr("HOLDER", "Holder"), attr("state"))),
    ),
    "unittest.mock": (
        diagnosis.mock_calls,
        "a unittest.mock mock keeps the arguments of every call",
        _group(module("test_it", attr("LOGGER", "Mock"), attr("_mock_call_args"))),
        _group(module("test_it", attr("DATA", "MockData"), attr("items", "list"), item("0"))),
    ),
    "WeakKeyDictionary": (
        diagnosis.weak_key_value_holds_its_key,
        "a weak-key dictionary (WeakKeyDictionary, torch's WeakTensorKeyDictionary) keeps each value while its key",
        _group(
            module("test_it", attr("CACHE", "WeakKeyDictionary"), attr("data", "dict"), item("...", "tuple"), item("1"))
        ),
        _group(module("test_it", attr("CACHE", "WeakValueDictionary"), attr("data", "dict"), item("..."))),
    ),
    "torch's WeakTensorKeyDictionary": (
        diagnosis.weak_key_value_holds_its_key,
        "a weak-key dictionary (WeakKeyDictionary, torch's WeakTensorKeyDictionary) keeps each value while its key",
        _group(module("test_it", attr("OFFLOADED", "WeakIdKeyDictionary"), attr("data", "dict"), item("<WeakIdRef>"))),
        _group(module("test_it", attr("OFFLOADED", "WeakIdKeyDictionary"), attr("refs", "dict"), item("<WeakIdRef>"))),
    ),
    "a signal handler": (
        diagnosis.signal_handler,
        "the signal module keeps the SIGUSR1 handler (Trainer.__init__.<locals>.handler) until another handler",
        _group(
            root(
                "signal handler",
                "the SIGUSR1 handler (Trainer.__init__.<locals>.handler)",
                edge("closure variable", "self", "Trainer"),
                attr("model", "Linear"),
                attr("weight", "Parameter"),
            )
        ),
        _group(
            module(
                "test_it",
                attr("HANDLERS", "list"),
                item("0", "function"),
                edge("closure variable", "self", "Trainer"),
                attr("model", "Linear"),
                attr("weight", "Parameter"),
            )
        ),
    ),
    "itertools.tee": (
        diagnosis.tee_buffer,
        "itertools.tee keeps every item one branch has read until every other branch has read it too",
        _group(
            module(
                "test_it",
                attr("TRAIN", "_tee"),
                edge("reference", "_tee", "_tee_dataobject"),
                edge("reference", "_tee_dataobject"),
            )
        ),
        _group(module("test_it", attr("TRAIN", "_tee"), edge("reference", "_tee", "generator"), edge("local", "x"))),
    ),
    "a Pickler's memo": (
        diagnosis.pickle_memo,
        "a pickle.Pickler keeps every object it has pickled in its memo",
        _group(
            module(
                "test_it",
                attr("PICKLER", "Pickler"),
                edge("reference", "Pickler", "TypedStorage"),
                attr("_untyped_storage", "UntypedStorage"),
            )
        ),
        _group(module("test_it", attr("PICKLER", "Pickler"), attr("dispatch_table", "dict"), item("'t'"))),
    ),
    "an event loop not run": (
        diagnosis.loop_not_run,
        "a callback scheduled on an asyncio event loop (call_soon, call_soon_threadsafe, call_later) keeps its",
        _group(
            module(
                "test_it",
                attr("LOOP", "_UnixSelectorEventLoop"),
                attr("_ready", "deque"),
                item("4", "Handle"),
                attr("_args", "tuple"),
                item("0"),
            )
        ),
        _group(module("test_it", attr("JOBS", "deque"), item("4", "Job"), attr("_args", "tuple"), item("0"))),
    ),
    "an ExitStack not closed": (
        diagnosis.exit_stack_not_closed,
        "a contextlib.ExitStack keeps every callback and context manager given to it",
        _group(
            module(
                "test_it",
                attr("RESOURCES", "ExitStack"),
                attr("_exit_callbacks", "deque"),
                item("4", "tuple"),
                item("1", "function"),
                edge("closure variable", "args", "tuple"),
                item("0"),
            )
        ),
        _group(module("test_it", attr("RESOURCES", "Pool"), attr("_exit_callbacks", "deque"), item("4"))),
    ),
    "a mode left on torch's stack": (
        diagnosis.mode_left_on_the_stack,
        "a mode entered and not exited stays on torch's mode stack",
        _group(
            root(
                "mode stack",
                "torch's TorchFunctionMode stack[0] (Recorder, entered and not exited)",
                attr("outputs", "list"),
                item("0"),
            )
        ),
        _group(module("test_it", attr("RECORDER", "Recorder"), attr("outputs", "list"), item("0"))),
    ),
    "a module made at run time": (
        diagnosis.module_made_at_run_time,
        "sys.modules['generated_layer_4'] is a module the code made",
        _group(root("run-time module", "sys.modules['generated_layer_4']", attr("WEIGHTS"), type_name="module")),
        _group(module("generated_layer", attr("WEIGHTS"))),
    ),
    "pruned again": (
        diagnosis.pruned_again,
        "torch.nn.utils.prune keeps every pruning applied to a parameter (its method and its mask) in a PruningContainer",
        _group(
            module(
                "test_it",
                attr("MODEL", "Linear"),
                edge("hook dict", "_forward_pre_hooks", "OrderedDict"),
                item("4", "PruningContainer"),
                attr("_pruning_methods", "tuple"),
                item("4", "CustomFromMask"),
                attr("mask"),
            )
        ),
        _group(
            module(
                "test_it",
                attr("MODEL", "Linear"),
                edge("hook dict", "_forward_pre_hooks", "OrderedDict"),
                item("4", "function"),
                edge("closure variable", "seen", "list"),
                item("0"),
            )
        ),
    ),
    "gc.garbage": (
        diagnosis.collector_saved_garbage,
        "gc.garbage keeps these tensors: while gc.DEBUG_SAVEALL is on",
        _group(module("gc", attr("garbage", "list"), item("106", "Node"), attr("value"))),
        _group(module("test_it", attr("garbage", "list"), item("106", "Node"), attr("value"))),
    ),
    "a frame kept": (
        diagnosis.kept_frame,
        "a frame object is kept (a tracer or profiler storing the frames it is given",
        _group(module("test_it", attr("FRAMES", "dict"), edge("dict key", to="frame"), edge("local", "hidden"))),
        _group(
            module(
                "test_it",
                attr("ERROR", "RuntimeError"),
                edge("traceback", to="traceback"),
                edge("traceback frame", "forward:3", "frame"),
                edge("local", "hidden"),
            )
        ),
    ),
    "work pending in an executor": (
        diagnosis.pending_work,
        "work submitted to a concurrent.futures executor keeps its function and arguments until a worker runs it",
        _group(
            root(
                "thread local",
                "thread 'upload_0' _worker:83 local 'work_queue'",
                edge("reference", "SimpleQueue", "SimpleQueue"),
                item("3", "_WorkItem"),
                attr("args", "tuple"),
                item("0", "dict"),
                item("'weight'"),
                thread="upload_0",
            )
        ),
        _group(module("test_it", attr("JOBS", "list"), item("3", "Job"), attr("args", "tuple"), item("0"))),
    ),
    "a done asyncio task": (
        diagnosis.done_task_result,
        "an asyncio Task, or a Future (asyncio's or concurrent.futures'), keeps its result",
        _group(module("test_it", attr("BACKGROUND", "set"), edge("set element", "", "Task"), attr("_result"))),
        _group(module("test_it", attr("BACKGROUND", "set"), edge("set element", "", "Job"), attr("_result"))),
    ),
    "a mutable default argument": (
        diagnosis.mutable_default_argument,
        "a default argument of remember() is made once",
        _group(
            module("test_it", attr("remember", "function"), attr("__defaults__", "tuple"), item("0", "list"), item("4"))
        ),
        _group(module("test_it", attr("remember", "function"), attr("__wrapped__", "function"), item("4"))),
    ),
    "a queue not drained": (
        diagnosis.queue_not_drained,
        "a queue.Queue keeps every item put on it",
        _group(module("test_it", attr("RESULTS", "Queue"), attr("queue", "deque"), item("4"))),
        _group(module("test_it", attr("RESULTS", "Results"), attr("queue", "deque"), item("4"))),
    ),
    "a thread not ended": (
        diagnosis.thread_not_ended,
        "the thread 'Thread-3 (print)' (Timer, not ended) keeps its target",
        _group(root("thread", "thread 'Thread-3 (print)' (Timer, not ended)", attr("args", "tuple"), item("0"))),
        _group(module("test_it", attr("TIMERS", "list"), item("0", "Timer"), attr("args", "tuple"), item("0"))),
    ),
    "a context variable": (
        diagnosis.context_variable,
        "the ContextVar 'request' keeps the value it was set to",
        _group(root("context", "the context of thread 'MainThread'", edge("context variable", "'request'"))),
        _group(root("outside gc", "<Context held outside Python's gc>", edge("reference", "hamt", "hamt"))),
    ),
    "a cycle kept from outside gc": (
        diagnosis.cycle_kept_from_outside,
        "nothing in Python reaches the object that keeps these tensors",
        _group(root("kept cycle", "<Metric on a reference cycle kept from outside Python's gc>", attr("x"))),
        _group(root("outside gc", "<Metric held outside Python's gc>", attr("x"))),
    ),
    "a cycle found while the suite had frozen the heap": (
        diagnosis.cycle_frozen,
        "nothing in Python reaches the object that keeps these tensors: it lies on a reference cycle, and the heap "
        "was frozen (gc.freeze())",
        _group(
            root(
                "frozen cycle",
                "<Client on a reference cycle frozen with the heap (gc.freeze()), or kept from outside Python's gc>",
                attr("state"),
            )
        ),
        _group(root("kept cycle", "<Client on a reference cycle kept from outside Python's gc>", attr("state"))),
    ),
    "held from C++, made by the test": (
        diagnosis.held_in_cpp_for_the_test,
        "nothing in Python refers to these tensors the test made",
        _group(HELD_IN_CPP_PATH, made_inside_library=False),
        _group(HELD_IN_CPP_PATH, made_inside_library=None),
    ),
    "autocast region left open": (
        diagnosis.autocast_region_left_open,
        "an autocast region entered and never exited",
        _group(AUTOCAST_CACHE_PATH, made_inside_library=False),
        _group(HELD_IN_CPP_PATH, made_inside_library=False),
    ),
    "class attribute": (
        diagnosis.class_attribute,
        "Model.CACHE is a class attribute, not an instance attribute",
        _group(module("test_it", attr("Model", "type"), attr("CACHE", "dict"), item("'a'"))),
        _group(module("test_it", attr("MODEL", "Model"), attr("cache", "dict"), item("'a'"))),
    ),
    "a registry of classes": (
        diagnosis.class_attribute,
        "Model._subclasses keeps every class added to it (a registry that __init_subclass__ or a metaclass fills)",
        _group(
            module("test_it", attr("Model", "type"), attr("_subclasses", "list"), item("4", "type"), attr("embedding"))
        ),
        _group(module("test_it", attr("Model", "type"), attr("_instances", "list"), item("4", "Model"), attr("w"))),
    ),
    "class attribute set to a tensor": (
        diagnosis.class_attribute,
        "Registry.last is a class attribute, not an instance attribute: it lives as long as the class",
        _group(module("test_it", attr("Registry", "type"), attr("last"))),
        _group(module("test_it", attr("REGISTRY", "Registry"), attr("last"))),
    ),
    "tensors kept with their graphs": (
        diagnosis.tensors_kept_with_their_graphs,
        "each of the 3 tensors kept carries the autograd graph that made it",
        _group(
            *(module("test_it", attr("LOSSES", "list"), item(str(index))) for index in range(3)), count=3, with_graph=3
        ),
        _group(
            *(module("test_it", attr("LOSSES", "list"), item(str(index))) for index in range(3)), count=3, with_graph=2
        ),
    ),
    "module-level container": (
        diagnosis.module_level_container,
        "a module-level container gained 3 entries",
        _group(*(module("test_it", attr("CACHE", "dict"), item(f"'{key}'")) for key in "abc"), count=3),
        _group(module("test_it", attr("CACHE", "dict"), item("'a'")), count=1),
    ),
    "PyTorch's compile cache": (
        diagnosis.torch_cache,
        "held by a cache PyTorch keeps itself",
        _group(module("test_it", attr("__compiled_fn_3_7f00", "function"), attr("__closure__", "tuple"), item("0"))),
        _group(module("test_it", attr("__compiled_fn_cache", "list"), item("0"))),
    ),
    "a global module hook": (
        diagnosis.global_module_hook,
        "a global module hook (torch.nn.modules.module._global_forward_hooks",
        _group(
            module(
                "torch.nn.modules.module",
                edge("hook dict", "_global_forward_hooks", "OrderedDict"),
                item("0", "function"),
                edge("closure variable", "seen", "cell"),
                item("0"),
            )
        ),
        _group(
            module(
                "test_it",
                attr("MODEL", "Linear"),
                edge("hook dict", "_global_forward_hooks", "OrderedDict"),
                item("0", "function"),
                edge("closure variable", "seen", "cell"),
                item("0"),
            )
        ),
    ),
    "a hook on an autograd node": (
        diagnosis.hook_on_an_autograd_node,
        "a hook registered on an autograd node (tensor.grad_fn.register_hook) is kept by the node in C++",
        _group(
            HolderPath(
                Root("outside gc", "<OrderedDict held outside Python's gc>", "OrderedDict"),
                (item("4", "partial"), attr("args", "tuple"), item("0", "Strategy"), attr("covar")),
            )
        ),
        _group(
            HolderPath(
                Root("outside gc", "<OrderedDict held outside Python's gc>", "OrderedDict"),
                (item("4", "Strategy"), attr("covar")),
            )
        ),
    ),
    "a hook bound to a tensor": (
        diagnosis.hook_bound_to_a_tensor,
        "a hook registered on a tensor (register_hook, register_post_accumulate_grad_hook) stays with the tensor, "
        "here a parameter",
        _group(
            module(
                "test_it",
                attr("MODEL", "Linear"),
                attr("weight", "Parameter"),
                edge("tensor hooks", "_post_accumulate_grad_hooks", "OrderedDict"),
                item("0", "partial"),
                attr("args", "tuple"),
                item("0", "GradientLog"),
                attr("norms", "list"),
                item("0"),
            )
        ),
        _group(
            module(
                "test_it",
                attr("MODEL", "Linear"),
                attr("weight", "Parameter"),
                edge("reference", "Parameter", "OrderedDict"),
                item("0", "GradientLog"),
                attr("norms", "list"),
                item("0"),
            )
        ),
    ),
    "a memoizing wrapper that keeps its dict on the object": (
        diagnosis.memoizing_wrapper,
        "a memoizing wrapper keeps every result it returned in a dict it sets on the object "
        "(TRAIN_SET._memoize__cache)",
        _group(
            module(
                "test_it",
                attr("TRAIN_SET", "SafeDataset"),
                attr("_memoize__cache", "dict"),
                item("(<function key>, (4,), <frozenset key>)"),
            )
        ),
        # an object's table keyed by tuples that name no function: not a memo
        _group(module("test_it", attr("GRID", "Grid"), attr("cells", "dict"), item("(4, 2)"))),
    ),
    "a parametrization registered again": (
        diagnosis.parametrization_stacked,
        "NET[0].parametrizations.weight holds one parametrization more each time one is registered on NET[0].weight",
        _group(_spectral_norm_state("1")),
        # the first parametrization of a tensor, registered once
        _group(_spectral_norm_state("0")),
    ),
    "a deque filling": (
        diagnosis.deque_filling,
        "agent.buffer is a collections.deque, which keeps every entry appended until it holds its maxlen of them",
        _group(
            HolderPath(
                Root("fixture", "fixture 'agent' (session scope)", "fixture", "agent"),
                (attr("buffer", "deque"), item("16", "Transition"), attr("obs")),
            )
        ),
        # a list the fixture's value keeps: not a deque
        _group(
            HolderPath(
                Root("fixture", "fixture 'agent' (session scope)", "fixture", "agent"),
                (attr("buffer", "list"), item("16", "Transition"), attr("obs")),
            )
        ),
    ),
    "an exception's arguments": (
        diagnosis.exception_arguments,
        "a stored exception keeps the tensors it was given (ERRORS[4].batch)",
        _group(
            module(
                "test_it",
                attr("ERRORS", "list"),
                Edge("item", "4", "NonFiniteLossError", exception=True),
                attr("batch"),
            )
        ),
        # an object of a class named like an exception that is none
        _group(module("test_it", attr("ERRORS", "list"), item("4", "NonFiniteLossError"), attr("batch"))),
    ),
    "an attribute per value": (
        diagnosis.attribute_per_value,
        "ROTARY.cos_sin_516 is named from a number (516)",
        _group(module("test_it", attr("ROTARY", "Rotary"), attr("cos_sin_516"))),
        # an attribute set again and again under one name
        _group(module("test_it", attr("ROTARY", "Rotary"), attr("cos_sin"))),
    ),
    "a distribution kept with its graph": (
        diagnosis.distribution_kept_with_its_graph,
        "DISTS[4] is a torch.distributions object",
        _group(
            module(
                "test_it", attr("DISTS", "list"), Edge("item", "4", "Categorical", distribution=True), attr("probs")
            ),
            kind="graph",
            graph_bytes=1024,
            graph_tensors=2,
        ),
        # a distribution made from detached parameters: no graph kept
        _group(
            module("test_it", attr("DISTS", "list"), Edge("item", "4", "Categorical", distribution=True), attr("probs"))
        ),
    ),
    "a memoizing wrapper": (
        diagnosis.memoizing_wrapper,
        "a memoizing wrapper keeps every result it returned in a dict it closes over ('cache')",
        _group(
            module(
                "test_it",
                attr("Dataset", "type"),
                attr("__getitem__", "function"),
                edge("closure variable", "cache", "cell"),
                item("(<Dataset key>, 4)"),
            )
        ),
        _group(
            module(
                "test_it",
                attr("CALLBACKS", "list"),
                item("0", "function"),
                edge("closure variable", "seen", "cell"),
                item("'loss'"),
            )
        ),
    ),
    "models kept in a registry": (
        diagnosis.models_kept_in_a_registry,
        "ACCELERATOR._models keeps every model put in it, with its parameters",
        _group(
            module(
                "test_it",
                attr("ACCELERATOR", "Accelerator"),
                attr("_models", "list"),
                item("0", "Linear"),
                attr("weight", "Parameter"),
            )
        ),
        _group(module("test_it", attr("MODEL", "Sequential"), attr("0", "Linear"), attr("weight", "Parameter"))),
    ),
    "submodules kept in a ModuleDict": (
        diagnosis.models_kept_in_a_registry,
        "PEFT_MODEL.adapters gained submodules ('adapter_0') and keeps each with its parameters",
        _group(
            module(
                "test_it",
                attr("PEFT_MODEL", "PeftModel"),
                attr("adapters", "ModuleDict"),
                attr("adapter_0", "Linear"),
                attr("weight", "Parameter"),
            )
        ),
        _group(
            module(
                "test_it",
                attr("PEFT_MODEL", "PeftModel"),
                attr("adapters", "ModuleDict"),
                attr("adapter_0", "Linear"),
                attr("weight", "Parameter"),
                edge("gradient", "grad"),
            ),
            kind="grad",
        ),
    ),
    "optimizer state": (
        diagnosis.optimizer_state,
        "optimizer.state keeps the state of each parameter it stepped (Adam's exp_avg and exp_avg_sq), keyed by the "
        "parameter itself, for as long as the optimizer lives: parameters added to it (add_param_group, as a model "
        "grows) and parameters replaced",
        _group(
            module(
                "test_it",
                attr("OPTIMIZER", "Adam"),
                attr("state", "defaultdict"),
                item("<Parameter key>", "dict"),
                item("'exp_avg'"),
            )
        ),
        _group(
            module("test_it", attr("TRAINER", "Trainer"), attr("state", "dict"), item("'best'", "dict"), item("'w'"))
        ),
    ),
    "optimizers kept in a registry": (
        diagnosis.optimizer_state,
        "ACCELERATOR._optimizers keeps every optimizer put in it, and with each its state",
        _group(
            module(
                "test_it",
                attr("ACCELERATOR", "Accelerator"),
                attr("_optimizers", "list"),
                item("0", "Adam"),
                attr("state", "defaultdict"),
                item("<Parameter key>", "dict"),
                item("'exp_avg'"),
            )
        ),
        _group(
            module(
                "test_it",
                attr("OPTIMIZER", "Adam"),
                attr("state", "defaultdict"),
                item("<Parameter key>", "dict"),
                item("'exp_avg'"),
            )
        ),
    ),
    "compiled models cached": (
        diagnosis.compiled_models_cached,
        "_COMPILED is a cache of torch.compile'd models (OptimizedModule)",
        _group(
            module(
                "test_it", attr("_COMPILED", "dict"), item("1", "OptimizedModule"), attr("_orig_mod", "Net"), attr("s")
            )
        ),
        _group(module("test_it", attr("MODEL", "OptimizedModule"), attr("_orig_mod", "Net"), attr("s"))),
    ),
    "a log record's arguments": (
        diagnosis.log_record_arguments,
        "a logging handler that buffers records",
        _group(
            module(
                "test_it",
                attr("LOGGER", "Logger"),
                attr("handlers", "list"),
                item("0", "MemoryHandler"),
                attr("buffer", "list"),
                item("0", "LogRecord"),
                attr("args", "tuple"),
                item("0"),
            )
        ),
        _group(module("test_it", attr("RECORDS", "list"), item("0", "Record"), attr("args", "tuple"), item("0"))),
    ),
    "a handler on a logger": (
        diagnosis.handler_on_a_logger,
        "a handler added to a logger (logger.addHandler) stays as long as the logger",
        _group(
            module(
                "logging",
                attr("root", "RootLogger"),
                attr("manager", "Manager"),
                attr("loggerDict", "dict"),
                item("'stats'", "Logger"),
                attr("handlers", "list"),
                item("0", "StatsHandler"),
                attr("model", "Linear"),
                attr("weight", "Parameter"),
            )
        ),
        _group(
            module(
                "test_it",
                attr("PIPELINE", "Pipeline"),
                attr("handlers", "list"),
                item("0", "Step"),
                attr("model", "Linear"),
                attr("weight", "Parameter"),
            )
        ),
    ),
    "a warning's arguments": (
        diagnosis.warning_arguments,
        "a warning made with a tensor among its arguments",
        _group(
            module(
                "test_it",
                attr("TRAINER", "Trainer"),
                attr("caught", "list"),
                item("0", "WarningMessage"),
                attr("message", "LossSpike"),
                attr("args", "tuple"),
                item("1"),
            )
        ),
        _group(
            root(
                "pytest warnings",
                "the warnings pytest recorded",
                item("0", "WarningMessage"),
                attr("message", "UserWarning"),
                attr("args", "tuple"),
                item("0"),
            )
        ),
    ),
    "itertools.cycle": (
        diagnosis.itertools_cycle,
        "itertools.cycle keeps every item of its first pass",
        _group(module("test_it", attr("BATCHES", "cycle"), edge("reference", "cycle", "list"), item("0"))),
        _group(module("test_it", attr("SCHEDULE", "Cycle"), attr("items", "list"), item("0"))),
    ),
    "a suspended generator a container keeps": (
        diagnosis.suspended_generator,
        "an unfinished generator keeps the locals of its suspended frame (its inputs, what it computed last) for as "
        "long as it lives, here ACTIVE_STREAMS[4]: run it to its end, close() it",
        _group(
            module(
                "test_it", attr("ACTIVE_STREAMS", "dict"), item("4", "generator"), edge("suspended local", "batches")
            )
        ),
        _group(module("test_it", attr("ACTIVE_STREAMS", "dict"), item("4", "list"), item("0"))),
    ),
    "a suspended generator": (
        diagnosis.suspended_generator,
        "an unfinished generator keeps the locals of its suspended frame (a shuffle buffer, batches read ahead) for "
        "as long as the iterator that runs it lives, here LOOP._iterator",
        _group(
            module(
                "test_it",
                attr("LOOP", "Loop"),
                attr("_iterator", "_SingleProcessDataLoaderIter"),
                attr("_dataset_fetcher", "_IterableDatasetFetcher"),
                attr("dataset_iter", "generator"),
                edge("reference", "generator", "list"),
                item("0"),
            )
        ),
        _group(
            root(
                "frame local",
                "_multicall:147 local 'teardowns'",
                item("0", "generator"),
                edge("reference", "generator", "method"),
                attr("__self__", "catching_logs"),
                attr("handlers", "list"),
                item("0"),
            )
        ),
    ),
    "threading.local": (
        diagnosis.threading_local,
        "_LOCAL is a threading.local",
        _group(
            module(
                "test_it",
                attr("_LOCAL", "_local"),
                attr("masks", "dict"),
                item("0"),
            )
        ),
        _group(module("test_it", attr("LOCAL_CACHE", "dict"), item("'masks'", "dict"), item("0"))),
    ),
    "a small view of a large storage": (
        diagnosis.small_view_of_a_large_storage,
        "a view keeps its whole storage: these tensors' elements take 256 B, the storages they view 1.0 MiB",
        _group(module("test_it", attr("LAST", "dict"), item("'cls_token'")), bytes=1 << 20),
        _group(module("test_it", attr("LAST", "dict"), item("'cls_token'"))),
    ),
    "lru_cache on a method": (
        diagnosis.lru_cache,
        "functools.lru_cache / functools.cache keeps every result it returned, and the arguments of every call as "
        "its keys: Detector.anchors is a method cached on its class, so every self it was called with",
        _group(
            module(
                "test_it",
                attr("Detector", "type"),
                attr("anchors", "_lru_cache_wrapper"),
                edge("lru_cache", to="dict"),
                item("(<Detector key>, 2048)"),
            )
        ),
        _group(module("test_it", attr("anchors", "_lru_cache_wrapper"), edge("lru_cache", to="dict"), item("(2048,)"))),
    ),
    "lru_cache under a property": (
        diagnosis.lru_cache,
        "functools.lru_cache / functools.cache under @property keeps every result it returned, and every self it "
        "was read on as its key: AnchorGenerator.anchors is cached on its class",
        _group(
            module(
                "test_it",
                attr("AnchorGenerator", "type"),
                attr("anchors", "property"),
                attr("fget", "_lru_cache_wrapper"),
                edge("lru_cache", to="dict"),
                item("(<AnchorGenerator key>,)"),
            )
        ),
        # a property whose getter is a plain function, over a cache of its own module
        _group(module("test_it", attr("anchors", "_lru_cache_wrapper"), edge("lru_cache", to="dict"), item("(2048,)"))),
    ),
    "lru_cache of a model's parameters": (
        diagnosis.lru_cache,
        "functools.lru_cache / functools.cache keeps every result it returned, and the arguments of every call as "
        "its keys: its results hold a model's parameters",
        _group(
            module(
                "test_it",
                attr("params_of", "_lru_cache_wrapper"),
                edge("lru_cache", to="dict"),
                item("'w'", "Parameter"),
            ),
            cls="Parameter",
        ),
        _group(module("test_it", attr("embed", "_lru_cache_wrapper"), edge("lru_cache", to="dict"), item("(3,)"))),
    ),
    "create_graph cycle": (
        diagnosis.create_graph_cycle,
        "backward(create_graph=True) gave these gradients autograd graphs of their own",
        _group(
            module("test_it", attr("MODEL", "Linear"), attr("weight", "Parameter"), edge("gradient", "grad")),
            kind="grad",
            grad_graph=True,
        ),
        _group(
            module("test_it", attr("MODEL", "Linear"), attr("weight", "Parameter"), edge("gradient", "grad")),
            kind="grad",
        ),
    ),
    "accumulator never reset": (
        diagnosis.accumulator_never_reset,
        "METRIC.preds accumulates what every update adds (a metric's or a meter's state) until METRIC.reset() is called",
        _group(
            module("test_it", Edge("attribute", "METRIC", "BinaryAUROC", resets=True), attr("preds", "list"), item("0"))
        ),
        _group(module("test_it", attr("METRIC", "BinaryAUROC"), attr("preds", "list"), item("0"))),
    ),
    "accumulator a fixture shares, never reset": (
        diagnosis.accumulator_never_reset,
        "val_metric.preds accumulates what every update adds (a metric's or a meter's state) until "
        "val_metric.reset() is called",
        _group(
            HolderPath(
                Root("fixture", "fixture 'val_metric' (module scope)", "fixture", "val_metric", resets=True),
                (attr("preds", "list"), item("0")),
            )
        ),
        _group(
            HolderPath(
                Root("fixture", "fixture 'val_metric' (module scope)", "fixture", "val_metric"),
                (attr("preds", "list"), item("0")),
            )
        ),
    ),
    "what keeps it": (
        diagnosis.what_keeps_it,
        "KEEP['m'] keeps these tensors: it hangs from module test_it, alive as long as the process, "
        "and the code added this entry and never removed it",
        _group(module("test_it", attr("KEEP", "dict"), item("'m'"))),
        _group(HELD_IN_CPP_PATH),
    ),
    "what keeps it: a dict's key": (
        diagnosis.what_keeps_it,
        "REPORTER.names -> dict key keeps these tensors: it hangs from module test_it, alive as long as the process, "
        "and a dict keeps its keys as it keeps its values, and these are keys: key it by a name or id(tensor)",
        _group(module("test_it", attr("REPORTER", "Reporter"), attr("names", "dict"), edge("dict key"))),
        _group(module("test_it", attr("REPORTER", "Reporter"), attr("names", "dict"), item("'hidden'"))),
    ),
}


def test_a_metrics_defaults_are_not_taken_for_an_accumulated_state() -> None:
    # torchmetrics keeps each state's starting value in Metric._defaults, which reset() copies
    # from: one entry per state, however many updates ran. Calling reset() frees none of it.
    defaults = _group(
        module(
            "test_it",
            Edge("attribute", "METRIC", "MeanSquaredError", resets=True),
            attr("_defaults", "dict"),
            item("'sum'"),
        )
    )
    assert diagnosis.accumulator_never_reset(defaults, []) is None  # type: ignore[arg-type]
    assert not any("accumulates what every update adds" in finding for finding in diagnosis.diagnose(defaults))  # type: ignore[arg-type]


@pytest.mark.parametrize("name", sorted(EVERY_DIAGNOSIS))
def test_every_diagnosis_is_given_on_its_path_and_not_on_a_path_alike(name: str) -> None:
    rule, words, fits, alike = EVERY_DIAGNOSIS[name]
    assert any(finding.startswith(words) for finding in diagnosis.diagnose(fits)), diagnosis.diagnose(fits)  # type: ignore[arg-type]
    assert not any(finding.startswith(words) for finding in diagnosis.diagnose(alike)), diagnosis.diagnose(alike)  # type: ignore[arg-type]
    assert (rule(fits, []) or "").startswith(words)  # type: ignore[arg-type]
    assert not (rule(alike, []) or "").startswith(words)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "name",
    [
        "unittest.mock",
        "module-level container",
        "class attribute",
        "closure",
        "atexit",
        "itertools.cycle",
        "saved_tensors_hooks pack hook",
    ],
)
def test_what_keeps_it_is_said_only_where_no_other_rule_fits(name: str) -> None:
    fits = EVERY_DIAGNOSIS[name][2]
    found = diagnosis.diagnose(fits)  # type: ignore[arg-type]
    assert found and not any(" keeps these tensors: it hangs from " in line for line in found)


def test_every_named_holder_gets_a_diagnosis() -> None:
    paths = [
        module("test_it", attr("STATE", "Store"), attr("last")),
        root("frame local", "worker:12 local 'batches'", item("3")),
        root("fixture", "fixture 'model' (module scope)", attr("cache", "dict"), item("3")),
        module("test_it", attr("RING", "deque"), edge("container item", "deque")),
    ]
    for path in paths:
        assert diagnosis.diagnose(_group(path)), path  # type: ignore[arg-type]
    # a running function's own local, as an out-of-memory error finds it: its business until it returns
    assert diagnosis.what_keeps_it(_group(root("frame local", "test_it:9 local 'activations'")), []) is None  # type: ignore[arg-type]
    # nothing named in Python: no holder to quote
    assert diagnosis.what_keeps_it(_group(HELD_IN_CPP_PATH), []) is None  # type: ignore[arg-type]


def test_a_finalizer_is_not_told_it_is_a_class_attribute() -> None:
    fits = EVERY_DIAGNOSIS["weakref.finalize"][2]
    assert diagnosis.class_attribute(fits, []) is None  # type: ignore[arg-type]


@pytest.mark.parametrize("method", ["function", "_lru_cache_wrapper"])
def test_a_method_a_class_defines_is_not_told_it_is_a_class_attribute(method: str) -> None:
    # a memoizing decorator's cache, or lru_cache's, on a method: the cache is the cause, not the class
    held = module("test_it", attr("Dataset", "type"), attr("__getitem__", method), edge("closure variable", "cache"))
    assert diagnosis.class_attribute(_group(held), []) is None  # type: ignore[arg-type]


def test_a_test_instance_is_not_blamed_where_a_hook_holds_the_same_tensors() -> None:
    # each instance's hook appends its own view of an output: the last run's instance holds one,
    # the earlier instances' hooks the others; letting go of self.outputs would free nothing
    instance = root("pytest instance", PYTEST_SELF, attr("outputs", "list"), item("0"), type_name="pytest")
    hooked = module(
        "test_it",
        attr("MODEL", "Linear"),
        edge("hook dict", "_forward_hooks", "OrderedDict"),
        item("0", "function"),
        edge("closure variable", "self"),
        attr("outputs", "list"),
        item("3"),
    )
    assert diagnosis.test_instance(_group(instance, hooked), []) is None  # type: ignore[arg-type]
    assert diagnosis.test_instance(_group(instance), []) is not None  # type: ignore[arg-type]
    assert diagnosis.hook_keeps(_group(instance, hooked), []) is not None  # type: ignore[arg-type]


def test_every_rule_has_a_case_on_its_path_and_off_it() -> None:
    covered = {rule for rule, *_ in EVERY_DIAGNOSIS.values()}
    assert covered == {*diagnosis.SOLE_RULES, *diagnosis.RULES}


def test_each_rule_says_in_one_sentence_what_it_recognises() -> None:
    for rule in [*diagnosis.SOLE_RULES, *diagnosis.RULES]:
        doc = rule.__doc__ or ""
        assert doc.strip() and doc.count(". ") == 0 and doc.endswith("."), rule.__name__


def test_a_thread_running_an_executors_pending_work_is_not_told_to_stop() -> None:
    # an executor's worker is meant to run; what its queue keeps is work not run yet
    fits = EVERY_DIAGNOSIS["work pending in an executor"][2]
    assert diagnosis.thread_frame(fits, []) is None  # type: ignore[arg-type]
    assert diagnosis.thread_frame(EVERY_DIAGNOSIS["a thread's frame"][2], []) is not None  # type: ignore[arg-type]


def test_a_pruning_container_is_not_told_it_is_a_hook_the_user_added() -> None:
    fits = EVERY_DIAGNOSIS["pruned again"][2]
    assert diagnosis.hook_keeps(fits, []) is None  # type: ignore[arg-type]


def test_what_keeps_it_quotes_the_entry_the_code_can_remove_not_a_tuples() -> None:
    # an output kept in a dict holds its KV cache in tuples: the entry to drop is the dict's
    kept = module(
        "test_it",
        attr("RESULTS", "dict"),
        item("4", "Result"),
        attr("meta", "dict"),
        item("'hf_output'", "GenerateOutput"),
        attr("past_key_values", "tuple"),
        item("0", "tuple"),
        item("0"),
    )
    found = diagnosis.what_keeps_it(_group(kept), [])  # type: ignore[arg-type]
    assert found is not None and found.startswith("what RESULTS[4].meta['hf_output'] holds keeps these tensors")
    # a path through tuples alone: its last entry still
    only = module("test_it", attr("PAIRS", "tuple"), item("1", "tuple"), item("0"))
    found = diagnosis.what_keeps_it(_group(only), [])  # type: ignore[arg-type]
    assert found is not None and found.startswith("PAIRS[1][0] keeps these tensors")


def test_what_keeps_it_quotes_the_entry_that_differs_between_the_groups_holders() -> None:
    # airctic/icevision#692: a metric keeps whole records, each holding its image: the list of
    # records gains them, not each record's list of components
    def record(index: str) -> HolderPath:
        return module(
            "test_it",
            attr("METRIC", "COCOMetric"),
            attr("_records", "list"),
            item(index, "Record"),
            attr("components", "list"),
            item("0", "ImageRecordComponent"),
            attr("img"),
        )

    found = diagnosis.what_keeps_it(_group(record("135"), record("143"), count=2), [])  # type: ignore[arg-type]
    assert found is not None and found.startswith("what METRIC._records[135] holds keeps these tensors")
    # one holder alone: its last entry, as before
    found = diagnosis.what_keeps_it(_group(record("135")), [])  # type: ignore[arg-type]
    assert found is not None and found.startswith("what METRIC._records[135].components[0] holds")


def test_views_that_together_cover_their_storage_are_not_a_small_view_of_it() -> None:
    # every row of each batch kept: the 1 MiB the storages take is all viewed
    held = module("test_it", attr("ROWS", "list"), item("0"))
    small = _group(held, bytes=1 << 20)
    assert diagnosis.small_view_of_a_large_storage(small, []) is not None  # type: ignore[arg-type]
    covered = _group(held, bytes=1 << 20, viewed=1 << 20)
    assert diagnosis.small_view_of_a_large_storage(covered, []) is None  # type: ignore[arg-type]
    # rows of a batch of which only a few are kept are still told
    few = _group(held, bytes=1 << 20, viewed=1 << 16)
    assert diagnosis.small_view_of_a_large_storage(few, []) is not None  # type: ignore[arg-type]


def test_a_tensor_a_picklers_memo_holds_itself_is_told_the_memo() -> None:
    # the C Pickler's memo read as a reference: the tensor pickled can be what it leads to
    held = module("test_it", attr("PICKLER", "Pickler"), edge("reference", "Pickler"))
    assert (diagnosis.pickle_memo(_group(held), []) or "").startswith("a pickle.Pickler keeps every object")  # type: ignore[arg-type]


def test_an_exit_stacks_callback_is_not_told_it_is_a_closure() -> None:
    fits = EVERY_DIAGNOSIS["an ExitStack not closed"][2]
    assert diagnosis.closure(fits, []) is None  # type: ignore[arg-type]


def test_the_interpreters_own_keeping_is_not_module_state() -> None:
    assert diagnosis.kept_by_the_interpreter(EVERY_DIAGNOSIS["gc.garbage"][2].holders[0])  # type: ignore[attr-defined]
    assert diagnosis.kept_by_the_interpreter(EVERY_DIAGNOSIS["sys.last_traceback"][2].holders[0])  # type: ignore[attr-defined]
    assert not diagnosis.kept_by_the_interpreter(module("test_it", attr("garbage", "list"), item("0")))


def test_threads_older_than_the_check_are_told_apart_by_ident_not_name() -> None:
    from pytest_vramleak.holders.naming import held_by_threads

    path = HolderPath(
        Root("thread local", "thread 'pin_memory' _loop:8 local 'kept'", thread="pin_memory", thread_id=7)
    )
    group = _group(path)
    assert held_by_threads(group, {7})  # type: ignore[arg-type]
    assert not held_by_threads(group, {8})  # type: ignore[arg-type]  # another thread of the same name
    assert not held_by_threads(_group(root("frame local", "test_fit:8 local 'kept'")), {7})  # type: ignore[arg-type]


def test_what_keeps_a_kept_model_is_the_entry_it_was_added_as_not_its_parameters_attribute() -> None:
    held = module(
        "test_it",
        attr("MODELS", "list"),
        item("4", "Net"),
        attr("encoder", "Sequential"),
        attr("0", "Linear"),
        attr("weight", "Parameter"),
    )
    found = diagnosis.what_keeps_it(_group(held), [])  # type: ignore[arg-type]
    assert found is not None
    # the same words for each of the model's tensors: a report says "as above" after the first
    assert found.startswith("what MODELS[4] holds keeps these tensors: ")
    assert "the code added this entry and never removed it" in found


def test_a_property_over_a_cache_is_no_class_attribute_to_set_to_none() -> None:
    # alisaifee/coredis#376: the class holds the property, code, not a value set on it
    fits = EVERY_DIAGNOSIS["lru_cache under a property"][2]
    found = diagnosis.diagnose(fits)  # type: ignore[arg-type]
    assert found and not any("class attribute" in line for line in found), found


def test_a_wide_fixtures_value_gets_the_diagnosis_that_fits_with_its_fix_spelled_as_the_test_names_it() -> None:
    # mmasana/FACIL#8: heads added to a model a session-scoped fixture gives every test
    heads = _group(
        HolderPath(
            Root("fixture", "fixture 'net' (session scope)", "fixture", "net"),
            (attr("heads", "ModuleList"), attr("4", "Linear"), attr("weight", "Parameter")),
        )
    )
    found = diagnosis.diagnose(heads)  # type: ignore[arg-type]
    assert any("del net.heads[name]" in line for line in found), found
    assert not any("fixture 'net' (session scope).heads" in line for line in found), found
    assert not any(line.startswith("state kept on a value that fixture") for line in found), found
    # a cache on the fixture's value that nothing more specific explains gets the fixture's advice
    cache = _group(root("fixture", "fixture 'data' (module scope)", attr("cache", "list"), item("0")))
    assert diagnosis.diagnose(cache)[0].startswith("state kept on a value that fixture 'data'")  # type: ignore[arg-type]


def test_a_callable_object_kept_as_a_tensors_hook_is_a_hook_bound_to_the_tensor() -> None:
    # NeuroBench/neurobench#184: register_post_accumulate_grad_hook(Tracker(p)) each run, never removed
    tracker = _group(
        HolderPath(
            Root("fixture", "fixture 'model' (session scope)", "fixture", "model"),
            (
                attr("weight", "Parameter"),
                edge("tensor hooks", "_post_accumulate_grad_hooks", "OrderedDict"),
                item("8", "GradSquareTracker"),
                attr("sq_sum"),
            ),
        )
    )
    found = diagnosis.diagnose(tracker)  # type: ignore[arg-type]
    assert found[0].startswith("a hook registered on a tensor"), found
    assert "handle.remove()" in found[0]


def test_copies_of_a_model_appended_to_a_list_are_models_kept_in_a_registry() -> None:
    # lisa-lab/pylearn2#1567: copy.deepcopy(model) appended at each improvement, a Sequential's layer
    snapshots = _group(
        HolderPath(
            Root("fixture", "fixture 'saver' (session scope)", "fixture", "saver"),
            (attr("snapshots", "list"), item("4", "Sequential"), attr("0", "Linear"), attr("weight", "Parameter")),
        )
    )
    found = diagnosis.diagnose(snapshots)  # type: ignore[arg-type]
    assert found[0].startswith("saver.snapshots keeps every model put in it"), found
    assert "copy.deepcopy(model)" in found[0]


@pytest.mark.parametrize(
    ("fields", "advice"),
    [
        ({}, None),
        ({"shape": ()}, "(.item() for a number)"),
        ({"with_graph": 1, "count": 1}, "(.detach() for a value without its graph)"),
        ({"device": "cuda:0"}, "(.cpu() for a value off the device)"),
        ({"shape": (), "with_graph": 1, "count": 1, "device": "cuda"}, "(.item() for a number, .detach().cpu() for a"),
    ],
    ids=["a tensor on CPU", "a number", "with its graph", "on a GPU", "a loss on a GPU"],
)
def test_the_fallback_says_what_to_keep_instead_only_where_it_applies(fields: dict, advice: str | None) -> None:
    from pytest_vramleak.holders.snapshot import TensorGroup

    group = TensorGroup(**{"dtype": "float32", "shape": (2, 512), "device": "cpu", **fields})  # type: ignore[arg-type]
    group.holders = [module("test_it", attr("CACHE", "dict"), item("'user-42'"))]
    (found,) = diagnosis.diagnose(group)  # type: ignore[arg-type]
    assert found.startswith("CACHE['user-42'] keeps these tensors"), found
    if advice is None:
        assert "keep only what is needed" not in found
    else:
        assert f"keep only what is needed {advice}" in found


@pytest.mark.parametrize(
    "path",
    [
        root("test class", "TestKeeps", attr("shared", "list"), item("4", "Linear"), attr("weight", "Parameter")),
        module(
            "test_it", attr("Keeper", "type"), attr("shared", "list"), item("4", "Linear"), attr("weight", "Parameter")
        ),
    ],
)
def test_models_a_class_attribute_keeps_are_told_once_as_the_class_attribute(path: HolderPath) -> None:
    group = _group(path)
    findings = diagnosis.diagnose(group)  # type: ignore[arg-type]
    assert len(findings) == 1 and "is a class attribute" in findings[0], findings
    assert diagnosis.models_kept_in_a_registry(group, []) is None  # type: ignore[arg-type]

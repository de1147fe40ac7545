"""Naming what holds an object, one kind of edge at a time, without running the holders' code."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import gc
import sys
import types
from typing import Any, NamedTuple

import numpy
import pytest
import torch

from pytest_vramleak.holders.referrers import key_text, name_holders, without_python_holders

HERE = __name__


def holder_of(get_target: Any) -> str | None:
    """Name the holder of ``get_target()``, held by no local variable of the caller meanwhile."""
    return name_holders([get_target()])[0]


def test_module_global_dict_key() -> None:
    module = types.ModuleType("vramleak_fake_cache")
    module.CACHE = {"user-42": torch.ones(3)}  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    try:
        assert holder_of(lambda: module.CACHE["user-42"]) == "vramleak_fake_cache.CACHE['user-42']"  # type: ignore[attr-defined]
    finally:
        del sys.modules[module.__name__]


class Model(torch.nn.Module):
    shared = torch.ones(2)

    def __init__(self) -> None:
        super().__init__()
        self.encoder = torch.nn.Sequential(torch.nn.Linear(2, 2))
        self.register_buffer("running", torch.zeros(2))
        self.history: list[torch.Tensor] = []


MODEL = Model()
MODEL.history.extend(torch.ones(1) for _ in range(4))


class Transition(NamedTuple):
    obs: torch.Tensor
    reward: float


REPLAY = [Transition(torch.ones(1), 1.0)]


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        (lambda: MODEL.history[3], f"{HERE}.MODEL.history[3]"),
        (lambda: MODEL.encoder[0].weight, f"{HERE}.MODEL.encoder[0].weight"),
        (lambda: MODEL.running, f"{HERE}.MODEL.running"),
        (lambda: Model.shared, f"{HERE}.Model.shared"),
        (lambda: REPLAY[0].obs, f"{HERE}.REPLAY[0].obs"),
    ],
    ids=["list index", "submodule and parameter", "buffer", "class attribute", "named tuple field"],
)
def test_attributes_modules_and_indexes(target: Any, expected: str) -> None:
    assert holder_of(target) == expected


def make_callback() -> Any:
    outputs: list[torch.Tensor] = []

    def callback() -> None:
        outputs.append(torch.ones(1))

    return callback


CALLBACK = make_callback()
CALLBACK()


def test_closure_variable() -> None:
    assert holder_of(lambda: CALLBACK.__closure__[0].cell_contents[0]) == f"{HERE}.CALLBACK -> closure var 'outputs'[0]"


@functools.cache
def features(n: int) -> torch.Tensor:
    return torch.ones(n)


@functools.lru_cache(maxsize=8)
def bounded_features(n: int) -> torch.Tensor:
    return torch.ones(n)


def test_lru_cache_wrappers() -> None:
    assert holder_of(lambda: features(5)) == f"{HERE}.features -> lru_cache[5]"
    assert holder_of(lambda: bounded_features(5)) == f"{HERE}.bounded_features -> lru_cache entry"


def fail_with_local() -> None:
    activations = torch.ones(7)  # noqa: F841 - kept alive by the traceback
    raise ValueError("boom")


try:
    fail_with_local()
except ValueError as error:
    STORED_ERROR = error


def test_exception_traceback_frame_local() -> None:
    line = STORED_ERROR.__traceback__.tb_next.tb_frame.f_lineno  # type: ignore[union-attr]
    assert (
        holder_of(lambda: STORED_ERROR.__traceback__.tb_next.tb_frame.f_locals["activations"])
        == f"{HERE}.STORED_ERROR.__traceback__.tb_next.tb_frame (fail_with_local:{line}) local 'activations'"
    )


def test_running_frame_local() -> None:
    kept = [torch.ones(2)]
    line = sys._getframe().f_lineno + 1
    assert holder_of(lambda: kept[0]) == f"test_running_frame_local:{line} local 'kept'[0]"


ARRAYS: list[Any] = []
ARRAYS_BY_NAME: dict[str, Any] = {}


def keep_array_in_a_list() -> tuple[Any, Any, str]:
    ARRAYS.append(torch.ones(8).numpy())
    return ARRAYS, lambda: ARRAYS[0].base, f"{HERE}.ARRAYS[0].base"


def keep_array_in_a_dict() -> tuple[Any, Any, str]:
    ARRAYS_BY_NAME["batch"] = torch.ones(8).numpy()  # a dict of arrays only: gc does not track it
    return ARRAYS_BY_NAME, lambda: ARRAYS_BY_NAME["batch"].base, f"{HERE}.ARRAYS_BY_NAME['batch'].base"


def keep_array_in_a_tuple() -> tuple[Any, Any, str]:
    ARRAYS.append((torch.ones(8).numpy(), numpy.zeros(2)))
    gc.collect()  # which stops tracking a tuple of arrays only
    return ARRAYS[0], lambda: ARRAYS[0][0].base, f"{HERE}.ARRAYS[0][0].base"


@pytest.mark.parametrize("keep", [keep_array_in_a_list, keep_array_in_a_dict, keep_array_in_a_tuple])
def test_a_numpy_array_over_a_tensor_is_named_through_its_base_whatever_the_heap_holds(
    keep: Any, heap_size: str
) -> None:
    # gc sees neither the array nor the tensor it keeps as its base: nothing gc tracks refers to
    # the tensor, and a walk from the modules meets the array later the more the process holds
    container, get_base, expected = keep()
    try:
        assert keep is keep_array_in_a_list or not gc.is_tracked(container)
        del container
        assert holder_of(get_base) == expected
    finally:
        ARRAYS.clear()
        ARRAYS_BY_NAME.clear()


def test_a_numpy_array_a_running_frame_has_as_a_local_is_named_through_its_base(heap_size: str) -> None:
    array = torch.ones(8).numpy()
    base_id = id(array.base)  # (a closure over ``array`` would hold it in a cell gc sees)
    line = sys._getframe().f_lineno + 1
    assert holder_of(lambda: next(o for o in gc.get_objects() if id(o) == base_id)) == (
        f"{sys._getframe().f_code.co_name}:{line} local 'array'.base"
    )


class Slotted:
    __slots__ = ("tensor",)

    def __init__(self) -> None:
        self.tensor = torch.ones(1)


SLOTTED = Slotted()


def test_slot_attribute() -> None:
    assert holder_of(lambda: SLOTTED.tensor) == f"{HERE}.SLOTTED.tensor"


class Hostile:
    """Every hook a careless scan might call raises."""

    def __init__(self) -> None:
        self.payload = torch.ones(3)

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"__getattr__({name!r}) ran")

    def __getattribute__(self, name: str) -> Any:
        if name in ("payload", "__dict__"):
            raise AssertionError(f"__getattribute__({name!r}) ran")
        return object.__getattribute__(self, name)

    def __eq__(self, other: object) -> bool:
        raise AssertionError("__eq__ ran")

    def __hash__(self) -> int:
        raise AssertionError("__hash__ ran")

    def __repr__(self) -> str:
        raise AssertionError("__repr__ ran")

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        raise AssertionError("__class__ ran")


class HostileKey:
    __hash__ = object.__hash__

    def __eq__(self, other: object) -> bool:
        raise AssertionError("__eq__ ran")

    def __repr__(self) -> str:
        raise AssertionError("__repr__ ran")


HOSTILE = Hostile()
HOSTILE_KEYS = {HostileKey(): torch.ones(2)}


def test_naming_runs_no_user_code() -> None:
    assert holder_of(lambda: object.__getattribute__(HOSTILE, "__dict__")["payload"]) == f"{HERE}.HOSTILE.payload"
    assert holder_of(lambda: next(iter(HOSTILE_KEYS.values()))) == f"{HERE}.HOSTILE_KEYS[<HostileKey key>]"


def test_several_targets_sharing_a_path() -> None:
    assert name_holders([MODEL.history[1], MODEL.running]) == [f"{HERE}.MODEL.history[1]", f"{HERE}.MODEL.running"]


def test_a_done_asyncio_tasks_result_and_exception_are_named_through_the_task() -> None:
    async def infer() -> Any:
        return torch.ones(3)

    async def fail() -> None:
        activations = torch.ones(3)
        raise ValueError(activations.shape)

    module = types.ModuleType("vramleak_fake_server")
    loop = asyncio.new_event_loop()
    try:
        module.TASKS = [loop.create_task(infer()), loop.create_task(fail())]  # type: ignore[attr-defined]
        loop.run_until_complete(asyncio.wait(module.TASKS))  # type: ignore[attr-defined]
        sys.modules[module.__name__] = module
        assert holder_of(lambda: module.TASKS[0].result()) == "vramleak_fake_server.TASKS[0]._result"  # type: ignore[attr-defined]
        assert without_python_holders([module.TASKS[0].result()]) == set()  # type: ignore[attr-defined]
        local = holder_of(lambda: module.TASKS[1].exception().__traceback__.tb_frame.f_locals["activations"])  # type: ignore[attr-defined]
        assert local is not None
        assert local.startswith("vramleak_fake_server.TASKS[1]._exception.__traceback__.tb_frame (fail:")
        assert local.endswith("local 'activations'")
    finally:
        sys.modules.pop(module.__name__, None)
        loop.close()


REQUEST: contextvars.ContextVar[Any] = contextvars.ContextVar("request")


def test_a_context_variables_value_is_named_through_the_variable() -> None:
    REQUEST.set({"batch": torch.ones(3)})  # (in this thread's context: no token kept in a local)
    try:
        assert (
            holder_of(lambda: REQUEST.get()["batch"])
            == "the context of thread 'MainThread'[ContextVar 'request']['batch']"
        )
    finally:
        REQUEST.set(None)
    copied = contextvars.copy_context()
    copied.run(REQUEST.set, {"batch": torch.ones(3)})
    held = holder_of(lambda: copied[REQUEST]["batch"])
    assert held is not None and held.endswith(" local 'copied'[ContextVar 'request']['batch']")


OBJECTS = numpy.empty((2, 3), dtype=object)


def test_a_numpy_array_of_python_objects_is_named_by_the_items_position() -> None:
    OBJECTS[1, 2] = {"batch": torch.ones(3)}
    try:
        assert holder_of(lambda: OBJECTS[1, 2]["batch"]) == f"{HERE}.OBJECTS[1, 2]['batch']"
        assert without_python_holders([OBJECTS[1, 2]["batch"]]) == set()
    finally:
        OBJECTS[1, 2] = None


KEPT = [torch.ones(1)]


def test_object_nothing_refers_to() -> None:
    local = torch.ones(1)
    assert without_python_holders([KEPT[0]]) == set()
    assert without_python_holders([local]) == set()
    lonely = [object()]
    assert without_python_holders(lonely) == {id(lonely[0])}


@pytest.mark.parametrize(
    ("key", "text"),
    [
        ("a", "'a'"),
        (3, "3"),
        (None, "None"),
        ((1, "b"), "(1, 'b')"),
        ((1,), "(1,)"),
        (b"x", "b'x'"),
        ("x" * 100, "'" + "x" * 27 + "..." + "x" * 28 + "'"),  # 60 characters, the middle left out
        # keys that differ at their end stay apart
        ("/data/" + "shards/" * 10 + "0001.pt", "'/data/shards/shards/shards/...shards/shards/shards/0001.pt'"),
        ("/data/" + "shards/" * 10 + "0002.pt", "'/data/shards/shards/shards/...shards/shards/shards/0002.pt'"),
    ],
)
def test_key_text(key: Any, text: str) -> None:
    assert key_text(key) == text


def test_key_text_of_an_object_with_a_name() -> None:
    import torch.fx

    graph = torch.fx.symbolic_trace(torch.nn.ReLU()).graph
    node = next(node for node in graph.nodes if node.op == "call_function" or node.op == "call_module")
    assert key_text(node) == f"<Node {node.name!r}>"
    assert key_text(torch.nn.Parameter(torch.ones(1))) == "<Parameter key>"  # (whose class defines a name too)
    assert key_text(object()) == "<object key>"


def test_a_long_chain_is_shown_with_its_middle_left_out() -> None:
    from pytest_vramleak.holders.paths import MAX_STEPS_SHOWN, Edge, HolderPath, Root

    steps = (*[Edge("attribute", "next", "Node")] * 5000, Edge("attribute", "payload", "Tensor"))
    text = HolderPath(Root("module", "test_it.HEAD", "module"), steps).render()
    assert text.startswith("test_it.HEAD.next.next") and text.endswith(".next.next.payload")
    assert f" ... {5002 - MAX_STEPS_SHOWN:,} steps ... " in text
    assert len(text) < 300
    short = HolderPath(
        Root("module", "test_it", "module"), (Edge("attribute", "CACHE", "dict"), Edge("item", "'user-42'", "Tensor"))
    )
    assert short.render() == "test_it.CACHE['user-42']"


def test_a_walk_from_a_frame_local_goes_only_through_its_value() -> None:
    # The record standing for a running frame's local refers to its own class, whose methods reach
    # the whole plugin: a walk on from there made chains that start at a local which does not hold
    # the next object (on Python 3.10, a weakref.finalize leak read "its holders changed").
    from pytest_vramleak.holders.edges import FrameLocal
    from pytest_vramleak.holders.referrers import _search_forward

    value = {"kept": [1.5]}
    local = FrameLocal(sys._getframe(), "value", value)
    reached_through_the_class = FrameLocal.__init__
    found = _search_forward({id(value["kept"]), id(reached_through_the_class)}, [local], set(), ())
    assert found.keys() == {id(value["kept"])}
    assert found[id(value["kept"])] == [local, value, value["kept"]]


def test_a_threading_local_reads_as_its_attribute() -> None:
    # its table of each thread's attributes, keyed by the thread, read as "-> <_local>[<ReferenceType key>]['masks']"
    import threading

    holder = types.ModuleType("holder_module")
    holder.LOCAL = threading.local()  # type: ignore[attr-defined]
    holder.LOCAL.masks = {"a": torch.ones(2)}  # type: ignore[attr-defined]
    sys.modules["holder_module"] = holder
    try:
        assert name_holders([holder.LOCAL.masks["a"]]) == ["holder_module.LOCAL.masks['a']"]  # type: ignore[attr-defined]
    finally:
        del sys.modules["holder_module"]


def test_a_handler_on_a_named_logger_is_held_by_that_logger() -> None:
    import logging

    class Keeps(logging.Handler):
        def __init__(self, tensor: torch.Tensor) -> None:
            super().__init__()
            self.tensor = tensor

    logging.getLogger("vramleak-test-stats").addHandler(Keeps(torch.ones(3)))  # (no local of ours holds it)
    try:
        named = holder_of(lambda: logging.getLogger("vramleak-test-stats").handlers[0].tensor)
    finally:
        logging.getLogger("vramleak-test-stats").handlers.clear()
    assert named == "logging.getLogger('vramleak-test-stats').handlers[0].tensor"


def test_signal_handlers_are_roots_named_by_their_signal() -> None:
    import signal

    from pytest_vramleak.holders.referrers import find_chains, signal_handlers

    class Trainer:
        def __init__(self) -> None:
            self.weights = [torch.ones(3)]

        def on_signal(self, signum: int, frame: object) -> None:
            pass

    previous = signal.signal(signal.SIGUSR1, Trainer().on_signal)
    try:
        # Python's own handler (SIGINT's default_int_handler), SIG_DFL and SIG_IGN are no roots
        # (a plugin's may be: pytest-timeout's SIGALRM handler)
        roots = [root for root in signal_handlers() if "SIGINT" not in root.label and "SIGALRM" not in root.label]
        assert [root.label for root in roots] == [
            "the SIGUSR1 handler (test_signal_handlers_are_roots_named_by_their_signal.<locals>.Trainer.on_signal)"
        ]
        assert roots[0].role == "signal handler"
        # gc sees no holder of the bound method the signal module keeps: the search starts there
        chain = find_chains([signal.getsignal(signal.SIGUSR1).__self__.weights[0]], named=roots)[0]  # type: ignore[union-attr]
        assert chain[0] is roots[0]
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert not [root for root in signal_handlers() if "SIGUSR1" in root.label]


def test_modes_left_on_torchs_stacks_are_roots_named_by_their_place() -> None:
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    from pytest_vramleak.holders.referrers import find_chains, torch_mode_stacks

    class Recorder(TorchFunctionMode):
        def __init__(self) -> None:
            super().__init__()
            self.outputs = [torch.ones(3)]

    class Passing(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            return func(*args, **(kwargs or {}))

    assert torch_mode_stacks() == []
    Recorder().__enter__()
    passing = Passing()
    passing.__enter__()
    try:
        roots = torch_mode_stacks()
        assert [root.label for root in roots] == [
            "torch's TorchFunctionMode stack[0] (test_modes_left_on_torchs_stacks_are_roots_named_by_their_place"
            ".<locals>.Recorder, entered and not exited)",
            "torch's TorchDispatchMode stack[0] (test_modes_left_on_torchs_stacks_are_roots_named_by_their_place"
            ".<locals>.Passing, entered and not exited)",
        ]
        assert {root.role for root in roots} == {"mode stack"}
        # torch keeps the mode in C++: gc sees no holder of it, the search starts at the stack
        chain = find_chains([roots[0].value.outputs[0]], named=roots)[0]
        assert chain[0] is roots[0]
    finally:
        passing.__exit__(None, None, None)
        torch._C._pop_torch_function_stack()
    assert torch_mode_stacks() == []


def test_an_autograd_nodes_anomaly_metadata_is_not_named_as_a_holder() -> None:
    # under anomaly mode (the run that records sites turns it on), a node made in a double backward
    # keeps the node whose backward made it in its metadata dict ('parent_'): the graph's own
    # bookkeeping, held from C++, which must not stand for the holder of what the graph keeps
    import warnings

    from pytest_vramleak.holders.referrers import _anomaly_metadata

    model = torch.nn.Linear(3, 3)
    with warnings.catch_warnings():  # (anomaly mode's own warning, and create_graph's)
        warnings.simplefilter("ignore", UserWarning)
        with torch.autograd.detect_anomaly(check_nan=False):
            model(torch.ones(2, 3)).tanh().pow(2).sum().backward(create_graph=True)
    assert model.weight.grad is not None and model.weight.grad.grad_fn is not None
    metadata = model.weight.grad.grad_fn.metadata
    assert _anomaly_metadata(metadata)
    assert not _anomaly_metadata({"parent_": 1, "config": 2})  # a dict of the user's
    assert not _anomaly_metadata({"traceback_": "..."})
    model.weight.grad = model.bias.grad = None  # (the cycle create_graph makes)

"""Diagnoses follow from the path that holds a leak: each on a path it fits, none on a path it does not."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from .conftest import read_report

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
"""

MOCK = "a unittest.mock mock keeps the arguments of every call"
WEAK = "a WeakKeyDictionary keeps each value while its key is alive"
APPENDED = "the test (or code it called) added entries to a list or dict that pytest keeps as a parametrize value"
STATE = "an object pytest keeps as a parametrize value for the whole session kept what the test computed on it"
COMPUTE = "a metric's cached compute() result"


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
        ("test_plain_dict", None, [MOCK, WEAK, APPENDED, STATE]),
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


def _group(*chains: str, paths: list[list[tuple[str, str]]] | None = None, **fields: object) -> object:
    from pytest_vramleak.holders.snapshot import TensorGroup

    group = TensorGroup("float32", (64,), "cpu", bytes=256, count=int(fields.pop("count", 1)))  # type: ignore[arg-type]
    group.held_by = list(chains)
    group.held_by_paths = paths if paths is not None else [[(chain, "Tensor")] for chain in chains]
    for name, value in fields.items():
        setattr(group, name, value)
    return group


PYTEST_SELF = "self (the TestModel instance pytest keeps until the session ends)"
# Each diagnosis: the words it starts with, a group whose path it fits, and one whose path looks
# alike (a name that reads the same, a near type) that it must not be given.
EVERY_DIAGNOSIS = {
    "history": (
        "autograd history kept",
        _group("test_it.TRAINER.total_loss", kind="history", nodes=40),
        _group("test_it.TRAINER.total_loss_history[0]"),
    ),
    "graph carried by a loop": (
        "autograd graph kept alive: 1.0 KiB in 4 saved tensors behind a tensor a running loop",
        _group("test_it:9 local 'hidden'", kind="graph", graph_bytes=1024, graph_tensors=4),
        _group("test_it:9 local 'hidden'", kind="tensor"),
    ),
    "graph kept": (
        "autograd graph kept alive: 1.0 KiB in 4 saved tensors behind a tensor that still has its grad_fn",
        _group("test_it.LOSSES[0]", graph_bytes=1024, graph_tensors=4),
        _group("test_it.LOSSES[0]"),
    ),
    "grad_fn kept": (
        "an autograd node (a grad_fn) was kept",
        _group("test_it.NODES[0] -> autograd graph of SumBackward0"),
        _group("test_it.autograd_graph_of_sums[0]"),
    ),
    "numpy array": (
        "a numpy array made by tensor.numpy()",
        _group("test_it.ARRAYS[0].base", paths=[[("test_it.ARRAYS", "list"), ("[0]", "ndarray"), (".base", "Tensor")]]),
        _group("test_it.HOLDER.base", paths=[[("test_it.HOLDER", "Base"), (".base", "Tensor")]]),
    ),
    "module hook": (
        "a module hook keeps what it is given",
        _group("test_it.MODEL._forward_hooks[0] -> closure var 'seen'[0]"),
        _group("test_it.MODEL.my_forward_hooks[0]"),
    ),
    "tensor hook": (
        "a tensor's hook (register_hook) keeps what it is given",
        _group(
            "test_it.PARAM._backward_hooks[4] -> closure var 'big'",
            paths=[
                [
                    ("test_it", "module"),
                    (".PARAM", "Parameter"),
                    ("._backward_hooks", "OrderedDict"),
                    ("[4]", "function"),
                    (" -> closure var 'big'", "Tensor"),
                ]
            ],
        ),
        _group(
            "test_it.MODEL._backward_hooks[4] -> closure var 'big'",
            paths=[
                [
                    ("test_it", "module"),
                    (".MODEL", "Linear"),
                    ("._backward_hooks", "OrderedDict"),
                    ("[4]", "function"),
                    (" -> closure var 'big'", "Tensor"),
                ]
            ],
        ),
    ),
    "closure": (
        "a closure (a callback, a logger) captured it",
        _group("test_it.CALLBACKS[0] -> closure var 'batch'"),
        _group("test_it.CALLBACKS['closure var batch']"),
    ),
    "fixture gradients": (
        "backward() through the model fixture 'model' (module scope)",
        _group("fixture 'model' (module scope).weight.grad", kind="grad"),
        _group("fixture_cache['model'].weight.grad", kind="grad"),
    ),
    "fixture state": (
        "state kept on a value that fixture 'data' (module scope) shares",
        _group("fixture 'data' (module scope).cache[0]"),
        _group("fixtures_seen['data'].cache[0]"),
    ),
    "pytest's test instance": (
        "pytest keeps each test's class instance until the session ends, and with it what the test set on self (self.t)",
        _group(f"{PYTEST_SELF}.t"),
        _group("test_fit:12 local 'self'.t"),
    ),
    "record_property": (
        "pytest keeps every record_property value",
        _group("record_property values of test_fit[0][1]"),
        _group("test_it.record_property_values[0]"),
    ),
    "pytest's warnings": (
        "pytest keeps every warning it recorded",
        _group("the warnings pytest recorded[0].message.args[0]"),
        _group("test_it.WARNINGS[0].args[0]"),
    ),
    "a parametrized list appended to": (
        "the test (or code it called) added entries to a list or dict that pytest keeps as a parametrize value",
        _group(
            "parametrize value callbacks of test_fit[2]",
            paths=[[("parametrize value callbacks of test_fit", "parametrize"), ("[2]", "Tensor")]],
        ),
        _group("test_it.CALLBACKS[2]", paths=[[("test_it.CALLBACKS", "module"), ("[2]", "Tensor")]]),
    ),
    "state on a parametrized object": (
        "an object pytest keeps as a parametrize value for the whole session kept what the test computed on it (a cached",
        _group(
            "parametrize value holder of test_fit.state",
            paths=[[("parametrize value holder of test_fit", "parametrize"), (".state", "Tensor")]],
        ),
        _group("test_it.HOLDER.state", paths=[[("test_it.HOLDER", "module"), (".state", "Tensor")]]),
    ),
    "unittest.mock": (
        "a unittest.mock mock keeps the arguments of every call",
        _group("test_it.LOGGER._mock_call_args", paths=[[("test_it.LOGGER", "Mock"), ("._mock_call_args", "Tensor")]]),
        _group("test_it.DATA.items[0]", paths=[[("test_it.DATA", "MockData"), (".items[0]", "Tensor")]]),
    ),
    "WeakKeyDictionary": (
        "a WeakKeyDictionary keeps each value while its key is alive",
        _group(
            "test_it.CACHE.data[...][1]",
            paths=[[("test_it.CACHE", "WeakKeyDictionary"), (".data", "dict"), ("[...]", "tuple"), ("[1]", "Tensor")]],
        ),
        _group(
            "test_it.CACHE.data[...]",
            paths=[[("test_it.CACHE", "WeakValueDictionary"), (".data", "dict"), ("[...]", "Tensor")]],
        ),
    ),
    "held from C++, made by the test": (
        "nothing in Python refers to these tensors the test made",
        _group(
            HELD_FROM_CPP_TEXT
            := "<no Python reference: held from C++, e.g. by a hook or cache inside torch or an extension>",
            made_inside_library=False,
        ),
        _group(HELD_FROM_CPP_TEXT, made_inside_library=None),
    ),
    "module-level container": (
        "a module-level container gained 3 entries",
        _group("test_it.CACHE['a']", "test_it.CACHE['b']", "test_it.CACHE['c']", count=3),
        _group("test_it.CACHE['a']", count=1),
    ),
    "PyTorch's compile cache": (
        "held by a cache PyTorch keeps itself",
        _group("test_it.__compiled_fn_3_7f00.__closure__[0]"),
        _group("test_it.__compiled_fn_cache[0]"),
    ),
    "create_graph cycle": (
        "backward(create_graph=True) gave these gradients autograd graphs of their own",
        _group("test_it.MODEL.weight.grad", kind="grad", grad_graph=True),
        _group("test_it.MODEL.weight.grad", kind="grad"),
    ),
}


@pytest.mark.parametrize("name", sorted(EVERY_DIAGNOSIS))
def test_every_diagnosis_is_given_on_its_path_and_not_on_a_path_alike(name: str) -> None:
    from pytest_vramleak.holders.diagnosis import diagnose

    words, fits, alike = EVERY_DIAGNOSIS[name]
    assert any(finding.startswith(words) for finding in diagnose(fits)), diagnose(fits)
    assert not any(finding.startswith(words) for finding in diagnose(alike)), diagnose(alike)

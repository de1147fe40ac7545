"""Diagnoses follow from the path that holds a leak: each on a path it fits, none on a path it does not."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

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
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", "--vramleak", "--vramleak-fail-on=any", "--vramleak-confirm=0", "--vramleak-report=r.json"]
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
def test_a_diagnosis_follows_from_the_path(diagnoses: dict[str, list[str]], test: str, expected: str | None, absent: list[str]) -> None:
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
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--vramleak", "-W", "ignore::UserWarning", "--vramleak-report=r.json")
    tests = {test["nodeid"].rpartition("::")[2]: test for test in json.loads((pytester.path / "r.json").read_text())["tests"]}
    leak = tests["test_second_order_through_backward"]
    assert leak["outcome"] == "leaked", result.stdout.str()
    diagnosed = {holder: tensor["diagnoses"] for tensor in leak["tensors"] for holder in tensor["held_by"]}
    assert any(finding.startswith(CREATE_GRAPH) for finding in diagnosed["test_it.MODEL.weight.grad"])
    # the graphs the gradients were made by, which nothing in Python holds, get the same cause
    graphs = [findings for holder, findings in diagnosed.items() if holder.startswith("<")]
    assert graphs and all(any(f.startswith(CREATE_GRAPH) for f in findings) for findings in graphs)
    assert not any("instead of loss.grad_fn" in f for findings in diagnosed.values() for f in findings)
    # first-order gradients kept on a module's model are kept once, and not this cycle
    assert tests["test_first_order"]["outcome"] == "passed"
    assert not any(f.startswith(CREATE_GRAPH) for tensor in tests["test_first_order"]["tensors"] for f in tensor["diagnoses"])
    assert tests["test_second_order_through_autograd_grad"]["outcome"] == "passed"

"""What a short training loop's failure costs and says: holders named in a few passes over the heap,
allocation sites that lead with the user's line, and no holder or diagnosis made of the plugin's own lists."""

from __future__ import annotations

import fnmatch
import json
import os
import sys
import types
import zipfile
from pathlib import Path

import pytest

from pytest_vramleak.holders.diagnosis import diagnose
from pytest_vramleak.holders.paths import Edge, HolderPath, Root, RootKind
from pytest_vramleak.holders.snapshot import TensorGroup

COUNTING_CONFTEST = """
import json, sys
import pytest_vramleak.steps as steps
from pytest_vramleak.tracking import gc_functions

PASSES = {"get_referrers": 0, "get_objects": 0, "get_referents": 0, "collect": 0}
EXPLAINING = []


# Audit hooks see the calls without putting a Python frame (and its argument
# tuple, one more referrer of what is searched for) between the plugin and gc.
def audit(event, args):
    if not EXPLAINING:
        return
    if event == "gc.get_referrers":
        PASSES["get_referrers"] += 1
    elif event == "gc.get_objects" and args[0] is None:
        PASSES["get_objects"] += 1
    elif event == "gc.get_referents" and len(args[0]) >= 10000:
        PASSES["get_referents"] += 1


# (the plugin sets gc.callbacks aside while it collects: its collector function is watched)
_collect = gc_functions._collect


def collected(generation=2):
    if EXPLAINING and generation == 2:
        PASSES["collect"] += 1
    return _collect(generation)


sys.addaudithook(audit)
gc_functions._collect = collected
explain = steps._Loop.explain


def counted(self, *args, **kwargs):
    EXPLAINING.append(True)
    try:
        return explain(self, *args, **kwargs)
    finally:
        EXPLAINING.clear()


steps._Loop.explain = counted


def pytest_sessionfinish():
    with open("passes.json", "w") as stream:
        json.dump(PASSES, stream)
"""

LEAKING_LOOP = """
import torch

torch.set_num_threads(1)


def make_step(kept):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    optimizer = torch.optim.Adam(model.parameters())
    inputs, labels = torch.randn(64, 256), torch.randint(0, 10, (64,))

    def step(index):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(inputs), labels)
        loss.backward()
        optimizer.step()
        kept.append(model(inputs).sum())  # an output kept with its graph

    return step


def test_leaks(vramleak):
    step = make_step([])
    for index in vramleak.steps(6, warmup=2):
        step(index)
"""

MOST_PASSES = 6
"""Full passes over the heap that naming the leaking loop's holders may take: one listing of its
objects, one pass for who holds the tensors found, one per level up to the test's local (three:
the list, the closure's cell, the closure). Each costs some 20-35 ms in a pytest process that
imported torch; the search took 17 before (0.8 s over the bare loop)."""


def test_a_leaking_loop_is_explained_in_a_few_passes_over_the_heap(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(COUNTING_CONFTEST)
    pytester.makepyfile(test_loop=LEAKING_LOOP)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "float32[[][]] on cpu: 3 tensors, 12 B, and the autograd graph behind them: 3 saved tensors, 384.0 KiB",
            "    allocated at test_loop.py:* in step(), called from test_loop.py:* in test_leaks()",
            "    held by test_leaks:* local 'step' -> closure var 'kept'[[]2[]]",
            "    held by test_leaks:* local 'step' -> closure var 'kept'[[]3[]]",
            "    held by test_leaks:* local 'step' -> closure var 'kept'[[]4[]]",
            "    diagnosis: autograd graph kept alive: * behind a tensor that still has its grad_fn*",
            "    diagnosis: a closure (a callback, a logger) captured it and lives on*",
        ]
    )
    passes = json.loads((pytester.path / "passes.json").read_text())
    assert passes["collect"] == 0, passes  # every tensor has a root: garbage cannot be on its chain
    assert sum(passes.values()) <= MOST_PASSES, passes


def test_a_tensor_copy_deepcopy_made_is_placed_at_the_users_line(
    pytester: pytest.Pytester, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The standard library loaded from where sysconfig does not place it (a zip of it, as in
    # embedded or bundled Pythons; here copy.py alone, outside the working folder): copy.py's
    # frames are library frames all the same.
    import copy

    archive = tmp_path_factory.mktemp("python-zip") / "stdlib.zip"
    with zipfile.ZipFile(archive, "w") as stream:
        stream.write(copy.__file__, "copy.py")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(archive), os.environ.get("PYTHONPATH")])))
    pytester.makepyfile(
        test_copies="""
        import copy
        import torch

        def test_copy_comes_from_the_zip():
            assert copy.__file__.endswith("stdlib.zip" + __import__("os").sep + "copy.py"), copy.__file__

        def test_snapshots(vramleak):
            model = torch.nn.Linear(64, 64)
            snapshots = []
            for step in vramleak.steps(8, warmup=2):
                snapshots.append(copy.deepcopy(model.weight))
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "    allocated at test_copies.py:* in test_snapshots()",
            "    held by test_snapshots:* local 'snapshots'[[]2[]]",
        ]
    )
    result.stdout.no_fnmatch_line("*copy.py*")


def test_a_stdlib_named_module_of_the_users_is_not_taken_for_the_standard_library(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_vramleak.tracking.sites import frame_kind_of_file

    # a project's tests in a package named "test", imported from the working folder
    package = tmp_path / "test"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "test_model.py").write_text("")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "test", types.ModuleType("test"))
    vars(sys.modules["test"])["__file__"] = str(package / "__init__.py")
    vars(sys.modules["test"])["__path__"] = [str(package)]
    assert frame_kind_of_file(str(package / "test_model.py")) == "user"


GRAD_FN_KEPT = "an autograd node (a grad_fn) was kept"
OWN_LIST = "*held by <list held outside Python's gc>*"


def test_a_loop_that_keeps_its_outputs_is_not_told_it_keeps_a_grad_fn(pytester: pytest.Pytester) -> None:
    # The tensors the ReLU saved for backward have Python objects that nothing in Python holds:
    # they were once named "held by <list held outside Python's gc>[19] -> autograd graph of
    # ReluBackward0" (a list of the plugin's own) and blamed on a kept loss.grad_fn.
    pytester.makepyfile(test_loop=LEAKING_LOOP)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "    held by test_leaks:* local 'step' -> closure var 'kept'[[]2[]]",
            "    diagnosis: autograd graph kept alive: *",
        ]
    )
    result.stdout.no_fnmatch_line(OWN_LIST)
    result.stdout.no_fnmatch_line(f"*{GRAD_FN_KEPT}*")


CREATE_GRAPH_LOOP = """
import torch

def test_create_graph_each_step(vramleak):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    inputs = torch.randn(8, 32)
    for step in vramleak.steps(8, warmup=2):
        loss = model(inputs).pow(2).sum()
        loss.backward(create_graph=True)
"""


def test_a_loop_that_keeps_no_grad_fn_is_not_told_it_does(pytester: pytest.Pytester) -> None:
    # backward(create_graph=True) gives each gradient a graph of its own, kept from C++ (the
    # parameter's .grad): the plugin's own lists of what it names hold none of it.
    pytester.makepyfile(test_second_order=CREATE_GRAPH_LOOP)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly", "-W", "ignore::UserWarning")
    result.assert_outcomes(failed=1)
    # what grew is still named: each gradient's history, and the graphs behind them
    result.stdout.fnmatch_lines(["autograd history of a float32[[]32, 32[]] tensor on cpu: * nodes made by the test*"])
    result.stdout.fnmatch_lines(["autograd graph of a float32[[]4, 32[]] tensor on cpu: * saved tensors*"])
    result.stdout.no_fnmatch_line(OWN_LIST)
    result.stdout.no_fnmatch_line(f"*{GRAD_FN_KEPT}*")


def test_a_gradient_that_keeps_history_is_named_through_its_parameter(pytester: pytest.Pytester) -> None:
    # Each backward(create_graph=True) adds its graph to the gradients' own: the history grows in
    # the parameters' .grad, an edge gc does not show, and create_graph is the cause to name.
    pytester.makepyfile(test_second_order=CREATE_GRAPH_LOOP)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly", "-W", "ignore::UserWarning")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "autograd history of a float32[[]32, 32[]] tensor on cpu: * nodes made by the test*",
            "    held by test_create_graph_each_step:* local 'model'[[]0[]].weight.grad",
            "    diagnosis: autograd history kept in a gradient: backward(create_graph=True) gave it a graph of *",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "autograd graph of a float32[[]4, 32[]] tensor on cpu: * saved tensors*",
            "*",
            "    diagnosis: backward(create_graph=True) gave these gradients*",
        ]
    )
    result.stdout.no_fnmatch_line("*total += loss*")


def test_an_autograd_node_only_the_plugin_lists_is_no_kept_grad_fn(pytester: pytest.Pytester) -> None:
    # A leaf kept after backward(create_graph=True): its gradient's graph saved a tensor that only
    # autograd nodes hold, and no code of the test holds those nodes.
    pytester.makepyfile(
        test_leaf="""
        import torch

        KEPT = []

        def test_leaf_kept_after_create_graph():
            weight = torch.randn(64, 64, requires_grad=True)
            (weight @ torch.randn(64, 8)).pow(2).sum().backward(create_graph=True)
            KEPT.append(weight)
        """
    )
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "no:randomly", "--vramleak", "-W", "ignore::UserWarning"
    )
    result.stdout.fnmatch_lines(["*held by test_leaf.KEPT[[]*[]].grad"])
    # the tensor the graph saved is named, as a graph of its own or in its owner's group
    saved = "autograd graph of a float32[[]64, 8[]] tensor on cpu: 1 saved tensors*"
    credited = "float32[[]64, 64[]] gradient on cpu: 1 tensor, 16.0 KiB, and their autograd graph's * saved tensors, *"
    assert any(fnmatch.fnmatch(line, pattern) for line in result.outlines for pattern in (saved, credited)), (
        result.stdout.str()
    )
    result.stdout.no_fnmatch_line(OWN_LIST)
    result.stdout.no_fnmatch_line(f"*{GRAD_FN_KEPT}*")


def _node_path(kind: RootKind, label: str, first: Edge, node: str) -> HolderPath:
    return HolderPath(Root(kind, label, kind), (first, Edge("item", "0", node), Edge("autograd node", node, "Tensor")))


@pytest.mark.parametrize(
    ("path", "blamed"),
    [
        (_node_path("module", "test_it", Edge("attribute", "NODES", "list"), "SumBackward0"), True),
        (
            HolderPath(
                Root("frame local", "test_it:12 local 'nodes'", "frame local", "nodes"),
                (Edge("item", "0", "SumBackward0"), Edge("autograd node", "SumBackward0", "Tensor")),
            ),
            True,
        ),
        (
            HolderPath(
                Root("outside gc", "<list held outside Python's gc>", "list"),
                (Edge("item", "0", "AddBackward0"), Edge("autograd node", "AddBackward0", "Tensor")),
            ),
            False,
        ),
        (
            HolderPath(
                Root("outside gc", "<SavedTensorHooks held outside Python's gc>", "SavedTensorHooks"),
                (Edge("attribute", "pack", "function"), Edge("autograd node", "MulBackward0", "Tensor")),
            ),
            False,
        ),
    ],
)
def test_a_kept_grad_fn_is_blamed_only_where_the_code_holds_the_node(path: HolderPath, blamed: bool) -> None:
    group = TensorGroup("float32", (8, 64), "cpu", bytes=2048, count=1, holders=[path])
    assert any(GRAD_FN_KEPT in line for line in diagnose(group)) is blamed


def test_gradient_owners_are_found_frozen_and_without_a_warning() -> None:
    import gc
    import warnings

    import torch

    from pytest_vramleak.holders.snapshot import _gradient_owners

    weight = torch.nn.Parameter(torch.randn(4, 4))
    (weight * 2).sum().backward()
    not_a_leaf = weight * 3  # its gradient is not kept: torch warns where it is read
    gc.freeze()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            owners = _gradient_owners([weight.grad])
    finally:
        gc.unfreeze()
    assert owners == {id(weight.grad): weight}
    owners.clear()
    del not_a_leaf

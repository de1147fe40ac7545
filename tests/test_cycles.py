"""Memory left to the cycle collector, fixtures' leftovers, and --vramleak-strict-cycles."""

from __future__ import annotations

import inspect

import pytest

from .conftest import read_report


def test_cycles_and_fixture_leftovers_are_reported_not_failed(pytester: pytest.Pytester, run_checked) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest, torch

        REGISTRY = []

        @pytest.fixture(scope="module")
        def model():
            net = torch.nn.Linear(256, 256)
            REGISTRY.append(net)  # outlives the fixture's teardown
            return net

        class Node:
            pass

        def test_uses_model(model):
            model(torch.ones(1, 256))

        def test_makes_cycles():
            node = Node()
            node.me = node
            node.payload = torch.ones(1024, 256)
        """
    )
    result, report = run_checked("--vramleak", "-p", "no:randomly")
    result.assert_outcomes(passed=2)
    assert report["test_makes_cycles"]["cycle_bytes"] == 1024 * 1024
    result.stdout.fnmatch_lines(
        [
            "*= vramleak summary =*",
            "fixture 'model' (module scope, test_it.py) still holds 257.0 KiB it allocated, after its teardown",
            "    held by test_it.REGISTRY[[]0].weight",
            "    held by test_it.REGISTRY[[]0].bias",
            "test_it.py::test_makes_cycles: 1.0 MiB lived in reference cycles until garbage collection*",
            "    (--vramleak-strict-cycles fails such a test, and names each cycle, what on it held the tensors and "
            "where they were made)",
        ]
    )


def test_fixture_kept_by_the_last_failed_tests_traceback_is_diagnosed(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest, torch

        @pytest.fixture(scope="module")
        def model():
            return torch.nn.Linear(256, 256)

        def test_uses(model):
            assert model(torch.ones(1, 256)).shape == (1, 256)

        @pytest.mark.allow_vram_leak  # (a checked test's failure is let go as it is checked)
        def test_fails(model):
            assert model(torch.ones(1, 256)).sum() > 10**6
        """
    )
    # In a process of its own: an inline run's recorder would keep the failed test's report too.
    # (pytest-rerunfailures, where installed, keeps the failure too: the test after this one.)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:rerunfailures", "--vramleak")
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(
        [
            "fixture 'model' (module scope, test_it.py) still holds 257.0 KiB it allocated, after its teardown",
            "    held by sys.last_*(test_fails:*) local 'model'.weight",
            "    diagnosis: sys.last_traceback / sys.last_value keep the last reported error's frames*(pytest sets them for a failed test*",
        ]
    )
    rerunfailures = pytest.importorskip("pytest_rerunfailures")
    if "_rerun_condition_excinfos" not in inspect.getsource(rerunfailures):
        pytest.skip("this pytest-rerunfailures keeps no failure on its test item (16.3 and older)")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "rerunfailures", "--vramleak")
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(
        [
            "fixture 'model' (module scope, test_it.py) still holds 257.0 KiB it allocated, after its teardown",
            "    held by *._rerun_condition_excinfos*(test_fails:*) local 'model'.weight",
            "    diagnosis: pytest-rerunfailures keeps each failure's traceback on its test item*",
        ]
    )


def test_strict_cycles_fails_tests_that_leave_tensors_to_the_cycle_collector(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest, torch

        class Node:
            pass

        @pytest.mark.vram_budget
        def test_makes_cycles():
            node = Node()
            node.me = node
            node.payload = torch.ones(1024, 256)
        """
    )
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)
    result = pytester.runpytest("-p", "no:cacheprovider", "--vramleak-strict-cycles")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["left 1.0 MiB on cpu to the cycle collector, allowed 0 B (--vramleak-strict-cycles)*"])
    pytester.makeini("[pytest]\nvramleak_strict_cycles = true\n")
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(failed=1)


def test_an_output_a_custom_function_stores_on_ctx_is_named_through_its_grad_fn(pytester: pytest.Pytester) -> None:
    # pytorch/pytorch#25340: ctx.y = y, not ctx.save_for_backward(y)
    pytester.makepyfile(
        test_it="""
        import torch

        class KeepsOutput(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                y = x * 2
                ctx.y = y
                return y

            @staticmethod
            def backward(ctx, g):
                return g * 2

        def test_applies():
            KeepsOutput.apply(torch.ones(512, 512, requires_grad=True))
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "--vramleak", "--vramleak-strict-cycles")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "    held by Tensor, on the reference cycle Tensor.grad_fn.y (back to the same Tensor)",
            "    diagnosis: these tensors lived on a reference cycle: a custom autograd.Function's forward stored its "
            "output on ctx (ctx.y), and ctx is the output's grad_fn (KeepsOutputBackward)*ctx.save_for_backward(...)*",
        ]
    )


def test_a_class_made_at_run_time_is_named_as_the_cycle_it_is(pytester: pytest.Pytester) -> None:
    # facebookresearch/higher#15: a class defined in a function, one per call, keeps the model
    pytester.makepyfile(
        test_it="""
        import torch

        def patched(module):
            class Patched(type(module)):
                original = module

            return Patched

        def test_patches():
            for _ in range(3):
                patched(torch.nn.Linear(256, 256))
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "--vramleak", "--vramleak-strict-cycles")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "    held by patched.<locals>.Patched.original.weight, on the reference cycle patched.<locals>.Patched -> *",
            "    diagnosis: these tensors lived on a reference cycle: patched.<locals>.Patched is a class made while "
            "the test ran*keep the tensor or model on an instance instead of the class*",
        ]
    )


@pytest.mark.parametrize("refreeze", [False, True], ids=["as-timed", "every-observation-refreezes"])
def test_a_strict_cycles_failure_names_each_cycle_its_holder_and_where_the_tensor_was_made(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, refreeze: bool
) -> None:
    if refreeze:  # slow observations (the run recording sites traces every allocation) freeze the heap
        import pytest_vramleak.tracking.tracker

        monkeypatch.setattr(pytest_vramleak.tracking.tracker, "REFREEZE_AFTER_SECONDS", 0)
    pytester.makepyfile(
        test_it="""
        import torch

        class Node:
            pass

        class Parent:
            pass

        def test_makes_a_self_cycle():
            node = Node()
            node.me = node
            node.payload = torch.ones(1024, 256)

        def test_makes_parent_child_cycles():
            def make():
                parent, child = Parent(), Node()
                parent.child, child.parent = child, parent
                child.weights = {"w": torch.ones(64, 256)}

            for _ in range(3):
                make()

        def test_keeps_no_cycle():
            node = Node()
            node.payload = torch.ones(1024, 256)
        """
    )
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "--vramleak", "--vramleak-strict-cycles", "--vramleak-report=r.json"
    )
    result.assert_outcomes(failed=2, passed=1)
    result.stdout.fnmatch_lines(
        [
            "*_ test_makes_a_self_cycle _*",
            "left 1.0 MiB on cpu to the cycle collector, allowed 0 B (--vramleak-strict-cycles)*",
            "tensors freed only by the cycle collector:",
            "float32[1024, 256] on cpu: 1 tensor, 1.0 MiB",
            "    allocated at test_it.py:12 in test_makes_a_self_cycle()",
            "    held by Node.payload, on the reference cycle Node.me (back to the same Node)",
            "    diagnosis: these tensors lived on a reference cycle*weakref.ref*",
            "*_ test_makes_parent_child_cycles _*",
            "left 192.0 KiB on cpu to the cycle collector*",
            "tensors freed only by the cycle collector:",
            "float32[64, 256] on cpu: 3 tensors, 192.0 KiB",
            "    allocated at test_it.py:18 in make(), called from test_it.py:21 in test_makes_parent_child_cycles()",
            "    held by Node.weights['w'], on the reference cycle Node.parent.child (back to the same Node)",
        ]
    )
    assert "no live tensor accounts for it" not in result.stdout.str()
    assert "lived in reference cycles until garbage collection (not a leak" not in result.stdout.str()
    reports = read_report(pytester.path / "r.json")
    assert [tensor["held_by"] for tensor in reports["test_makes_a_self_cycle"]["tensors"]] == [
        ["Node.payload, on the reference cycle Node.me (back to the same Node)"]
    ]
    assert reports["test_keeps_no_cycle"]["verdict"] == "passed"
    assert reports["test_keeps_no_cycle"]["cycle_bytes"] in (None, 0)


def test_memory_left_to_the_cycle_collector_is_noted_when_it_matters(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        class Node:
            pass

        def make_cycle(size):
            import torch
            node = Node()
            node.me = node
            node.payload = torch.ones(size)

        def test_small():
            make_cycle(4)

        def test_large():
            make_cycle(1024 * 1024)
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "--vramleak")
    result.stdout.fnmatch_lines(["test_it.py::test_large: 4.0 MiB lived in reference cycles until garbage collection*"])
    result.stdout.no_fnmatch_line("*test_small*reference cycles*")
    result = pytester.runpytest("-p", "no:cacheprovider", "--vramleak", "-v")
    result.stdout.fnmatch_lines(["test_it.py::test_small: 16 B lived in reference cycles until garbage collection*"])


def test_a_fixtures_graph_left_on_a_cycle_is_garbage_not_growth(pytester: pytest.Pytester, run_checked) -> None:
    # The fixture's value is frozen with the heap while the test runs, and is garbage on a cycle
    # once pytest drops it: a run again collects it as it begins, and what that frees is the
    # earlier run's (before, each run's graph stayed frozen: "autograd nodes kept: 3, 6, 9, 12").
    pytester.makepyfile(
        test_it="""
        import pytest, torch

        class Box:
            pass

        @pytest.fixture
        def model():
            owner = Box()
            owner.me = owner
            owner.loss = (torch.randn(256, requires_grad=True) * 2).exp().sum()
            return owner

        def test_it(model):
            assert model.loss.requires_grad
        """
    )
    result, report = run_checked("--vramleak")
    result.assert_outcomes(passed=1)
    assert report["test_it"]["pattern"] != "grows"
    assert len(set(report["test_it"]["repetitions"])) == 1  # what each run left, flat


def test_garbage_that_one_collection_frees_only_after_another_is_not_kept(pytester: pytest.Pytester) -> None:
    # An autograd node holds its hooks from C++, out of the collector's sight: the cycle the hook
    # refers to is garbage only once a collection has freed the node. Freezing the young heap after
    # one collection kept it ("kept once" under fail-on=any, and BoTorch's optimizers' graphs).
    pytester.makepyfile(
        test_it="""
        import pytest, torch

        class Box:
            pass

        def graph_on_a_cycle():
            held = Box()
            held.me = held
            held.t = (torch.randn(256, requires_grad=True) * 2).exp()
            y = (torch.randn(16, requires_grad=True) * 2).exp().sum()
            y.grad_fn.register_hook(lambda grad_inputs, grad_outputs: held)
            owner = Box()
            owner.me = owner
            owner.y = y

        @pytest.fixture
        def model():
            graph_on_a_cycle()
            return 1

        def test_it(model):
            graph_on_a_cycle()
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "--vramleak", "--vramleak-fail-on=any")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["1 checked test: 1 passed; none leaked or went over budget"])

"""Autograd history a test keeps: PyTorch's FAQ leak (``total_loss += loss``) fails as growth under
plain ``--vramleak``; its ``.detach()`` and ``.item()`` twins pass, and so does a test that keeps only
its latest output's graph, replacing the one an earlier run kept."""

from __future__ import annotations

import pytest

TRAINER = """
import torch
torch.manual_seed(0)
MODEL = torch.nn.Linear(16, 1)

class Trainer:
    def __init__(self):
        self.total_loss = {start}

TRAINER = Trainer()

def test_trains_a_few_steps():
    for _ in range(5):
        loss = MODEL(torch.randn(8, 16)).pow(2).mean()
        loss.backward()
        TRAINER.total_loss += {kept}
"""


@pytest.mark.parametrize("start", ["0", "torch.zeros(())"], ids=["starts-at-0", "starts-as-a-tensor"])
def test_the_faqs_accumulated_loss_fails_as_growing_history(pytester: pytest.Pytester, run_checked, start: str) -> None:
    pytester.makepyfile(test_it=TRAINER.format(start=start, kept="loss"))
    result, report = run_checked("-p", "no:randomly", "--vramleak")
    entry = report["test_trains_a_few_steps"]
    assert (entry["verdict"], entry["pattern"]) == ("leaked", "grows"), result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "autograd history grew * nodes per run of the test over 3 measured runs on cpu*",
            "*held by test_it.TRAINER.total_loss*",
            "*loss.item() or loss.detach()*",
        ]
    )


@pytest.mark.parametrize("start", ["0", "torch.zeros(())"], ids=["starts-at-0", "starts-as-a-tensor"])
def test_the_faqs_accumulated_loss_grows_over_a_repeated_test(
    pytester: pytest.Pytester, run_checked, start: str
) -> None:
    pytester.makepyfile(test_it=TRAINER.format(start=start, kept="loss"))
    result, report = run_checked("-p", "no:randomly", "--vramleak", "--vramleak-repeat=5")
    entry = report["test_trains_a_few_steps"]
    assert (entry["verdict"], entry["pattern"]) == ("leaked", "grows"), result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "autograd history grew 25 nodes per run of the test over 3 measured runs on cpu*",
            "*held by test_it.TRAINER.total_loss",
            "*autograd nodes kept: 25, 50, 75, 100, 125",
        ]
    )


@pytest.mark.parametrize("kept", ["loss.detach()", "loss.item()"])
@pytest.mark.parametrize("start", ["0", "torch.zeros(())"], ids=["starts-at-0", "starts-as-a-tensor"])
def test_the_faqs_remedies_pass(pytester: pytest.Pytester, run_checked, start: str, kept: str) -> None:
    pytester.makepyfile(test_it=TRAINER.format(start=start, kept=kept))
    result, report = run_checked("-p", "no:randomly", "--vramleak")
    assert report["test_trains_a_few_steps"]["verdict"] == "passed", result.stdout.str()


def test_an_output_kept_with_its_graph_and_replaced_each_run_is_kept_once(
    pytester: pytest.Pytester, run_checked
) -> None:
    # Each run's output replaces the one an earlier run kept, and that one's graph goes with it:
    # the graph kept is one run's, however many runs there were.
    pytester.makepyfile(
        test_it="""
        import torch
        LAST = {}

        def test_keeps_its_latest_output():
            LAST["out"] = torch.nn.Linear(64, 64)(torch.ones(64))
        """
    )
    result, report = run_checked("-p", "no:randomly", "--vramleak")
    entry = report["test_keeps_its_latest_output"]
    assert (entry["verdict"], entry["pattern"]) == ("passed", "kept_once"), result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "memory kept once, not growing*",
            "*test_it.py::test_keeps_its_latest_output (cpu, kept once, autograd history of 3 nodes)",
        ]
    )


STEP_LOOP = """
import torch

class Trainer:
    pass

def test_steps(vramleak):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    trainer = Trainer()
    trainer.total_loss = {start}
    for step in vramleak.steps(10, warmup=2):
        loss = model(torch.randn(8, 16)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        trainer.total_loss += {kept}
"""


@pytest.mark.parametrize("start", ["0", "torch.zeros(())"], ids=["starts-at-0", "starts-as-a-tensor"])
def test_the_faqs_accumulated_loss_fails_a_step_check_as_growing_history(
    pytester: pytest.Pytester, run_checked, start: str
) -> None:
    # No storage grows (the 4-byte total is replaced, or added to in place): only the autograd
    # nodes each step links behind it do.
    pytester.makepyfile(test_it=STEP_LOOP.format(start=start, kept="loss"))
    result, report = run_checked("-p", "no:randomly", "--vramleak-report=r.html")
    entry = report["test_steps"]
    assert entry["verdict"] == "leaked", result.stdout.str()
    assert entry["step_history_nodes"][0] == 0 and entry["step_history_nodes"][-1] == 8 * 7, entry  # 8 nodes a step
    result.stdout.fnmatch_lines(
        [
            "the autograd history kept across steps grew 8 nodes per step over 8 measured steps (about 5.5 KiB of host memory per step; 56 nodes after the last)*loss.item() or loss.detach()*",
            "autograd nodes kept from earlier steps after each measured step: 0, 8, 16, 24, 32, 40, 48, 56",
            "what keeps that history:",
            "autograd history of a float32[] tensor on cpu: * nodes*",
            "    held by test_steps:* local 'trainer'.total_loss",
        ]
    )
    # the HTML card charts that growth, the whole leak here, at the rate of the series beside it
    page = (pytester.path / "r.html").read_text()
    assert '<figure class="steps history">' in page
    assert "after each measured step keep: 0, 8, 16, 24, 32, 40, 48, 56; the graph grew 8 nodes a step " in page


@pytest.mark.parametrize("kept", ["loss.detach()", "loss.item()"])
@pytest.mark.parametrize("start", ["0", "torch.zeros(())"], ids=["starts-at-0", "starts-as-a-tensor"])
def test_the_faqs_remedies_pass_a_step_check(pytester: pytest.Pytester, run_checked, start: str, kept: str) -> None:
    pytester.makepyfile(test_it=STEP_LOOP.format(start=start, kept=kept))
    result, report = run_checked("-p", "no:randomly")
    entry = report["test_steps"]
    assert entry["verdict"] == "passed", result.stdout.str()
    assert entry["step_history_nodes"] == [0] * 8, entry


FUNCTIONAL_SGD = """
import torch

def test_steps(vramleak):
    torch.manual_seed(0)
    inputs = torch.randn(16, 8)
    weight = torch.randn(8, 1, requires_grad=True)
    for step in vramleak.steps(10, warmup=2):
        loss = (inputs @ weight).pow(2).mean()
        (grad,) = torch.autograd.grad(loss, weight)
        weight = {update}
"""


def test_functional_sgd_that_never_detaches_its_parameters_fails_a_step_check(
    pytester: pytest.Pytester, run_checked
) -> None:
    # Each new weight's grad_fn links to the one before; its storage replaces the old one's.
    pytester.makepyfile(test_it=FUNCTIONAL_SGD.format(update="weight - 0.1 * grad"))
    result, report = run_checked("-p", "no:randomly")
    entry = report["test_steps"]
    assert entry["verdict"] == "leaked" and entry["step_history_nodes"] == list(range(8)), result.stdout.str()
    result.stdout.fnmatch_lines(
        ["the autograd history kept across steps grew 1 node per step*", "    held by test_steps:* local 'weight'"]
    )


def test_functional_sgd_that_detaches_its_parameters_passes_a_step_check(
    pytester: pytest.Pytester, run_checked
) -> None:
    pytester.makepyfile(test_it=FUNCTIONAL_SGD.format(update="(weight - 0.1 * grad).detach().requires_grad_()"))
    result, report = run_checked("-p", "no:randomly")
    assert report["test_steps"]["verdict"] == "passed", result.stdout.str()


def test_gradient_accumulation_over_a_few_steps_passes_a_step_check(pytester: pytest.Pytester, run_checked) -> None:
    # The summed loss keeps three steps' graphs, then backward runs and the sum starts again: the
    # history rises and falls in a sawtooth, and does not grow.
    pytester.makepyfile(
        test_it="""
        import torch

        def test_steps(vramleak):
            torch.manual_seed(0)
            model = torch.nn.Linear(8, 1)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
            total = 0
            for step in vramleak.steps(14, warmup=2):
                total = total + model(torch.randn(4, 8)).pow(2).mean()
                if step % 3 == 2:
                    total.backward()
                    optimizer.step()
                    optimizer.zero_grad()
                    total = 0
        """
    )
    result, report = run_checked("-p", "no:randomly")
    entry = report["test_steps"]
    assert entry["verdict"] == "passed", result.stdout.str()
    assert max(entry["step_history_nodes"]) > 0 and entry["step_history_nodes"][-1] <= max(
        entry["step_history_nodes"][:3]
    ), entry


def test_a_step_check_on_an_accelerator_counts_the_history_its_steps_keep(
    pytester: pytest.Pytester, fake_cuda_plugin
) -> None:
    # Where an allocator counts the memory the tracker indexes nothing: the tensors made during
    # the measured steps are found among the young objects.
    fake_cuda_plugin()
    pytester.makepyfile(
        test_it=FUNCTIONAL_SGD.format(update="weight - 0.1 * grad").replace("def test_steps", "def test_leaks")
    )
    pytester.makepyfile(test_fixed=FUNCTIONAL_SGD.format(update="(weight - 0.1 * grad).detach().requires_grad_()"))
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "the autograd history kept across steps grew 1 node per step over 8 measured steps*",
            "autograd nodes kept from earlier steps after each measured step: 0, 1, 2, 3, 4, 5, 6, 7",
        ]
    )

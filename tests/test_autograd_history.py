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
    assert (entry["outcome"], entry["pattern"]) == ("leaked", "grows"), result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "autograd history grew * nodes per run of the test over 3 measured runs on cpu*",
            "*held by test_it.TRAINER.total_loss*",
            "*loss.item() or loss.detach()*",
        ]
    )


@pytest.mark.parametrize("kept", ["loss.detach()", "loss.item()"])
@pytest.mark.parametrize("start", ["0", "torch.zeros(())"], ids=["starts-at-0", "starts-as-a-tensor"])
def test_the_faqs_remedies_pass(pytester: pytest.Pytester, run_checked, start: str, kept: str) -> None:
    pytester.makepyfile(test_it=TRAINER.format(start=start, kept=kept))
    result, report = run_checked("-p", "no:randomly", "--vramleak")
    assert report["test_trains_a_few_steps"]["outcome"] == "passed", result.stdout.str()


def test_an_output_kept_with_its_graph_and_replaced_each_run_is_kept_once(pytester: pytest.Pytester, run_checked) -> None:
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
    assert (entry["outcome"], entry["pattern"]) == ("passed", "kept_once"), result.stdout.str()
    result.stdout.fnmatch_lines(["memory kept once, not growing*", "*test_it.py::test_keeps_its_latest_output (cpu, kept once, autograd history of 3 nodes)"])

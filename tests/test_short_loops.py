"""Step checks on short loops: the verdict without the explanation, and how few steps decide."""

from __future__ import annotations

import pytest
import torch

import pytest_vramleak.steps as steps_module
from pytest_vramleak import StepWatcher
from pytest_vramleak.verdict import SURE_STEPS, TREND_CERTAIN, trend_score


def test_explain_false_gives_the_same_verdict_without_looking_for_holders(monkeypatch) -> None:
    kept: list[torch.Tensor] = []

    def step(i: int) -> None:
        kept.append(torch.ones(256))

    explained = StepWatcher("cpu", warmup=2).check(step, steps=8)
    kept.clear()
    assert explained.grows and explained.leak is not None and "held by" in explained.leak.render()

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("explain=False looked for holders or recorded sites")

    monkeypatch.setattr(steps_module, "describe", refuse)
    monkeypatch.setattr(steps_module, "describe_history", refuse)
    monkeypatch.setattr(steps_module.SiteRecorder, "start", refuse)
    plain = StepWatcher("cpu", warmup=2, explain=False).check(step, steps=8)
    kept.clear()
    assert plain.grows and plain.leak is None
    assert (plain.steps, plain.kept, plain.verdict) == (explained.steps, explained.kept, explained.verdict)
    assert plain.describe().startswith("memory grew 1.0 KiB per step over 6 measured steps")
    assert "outlived their step" not in plain.describe()


def test_explain_false_on_autograd_history_says_how_much_but_not_what_keeps_it() -> None:
    weight = torch.ones(8, requires_grad=True)
    total: torch.Tensor | float = 0.0

    def step(i: int) -> None:
        nonlocal total
        loss = (weight * 2).sum()
        loss.backward()
        total += loss  # keeps every step's graph (PyTorch's FAQ)

    result = StepWatcher("cpu", warmup=2, explain=False).check(step, steps=8)
    assert result.history_grows and result.leak is None
    assert "autograd history kept across steps grew" in result.describe()
    assert "what keeps that history" not in result.describe()


# decide(figures, kept) on figures measured from catalogue loops (tests/test_loop_catalogue.py,
# tests/test_realistic_loops.py, tests/test_noisy_loops.py); the comments say what each loop did.

DECISIONS = {
    # 64 B a step kept beneath 640 B a step collected and cleared every 4 steps: ``kept`` sits
    # below the baseline (the first step freed warm-up's gradients), and rose one cycle to the next.
    "leak_beneath_a_sawtooth_grows": (
        [704, -1112, -408, 296, 1000, -816, -112, 592],
        [-11048, -12264, -12160, -11456, -10752, -11968, -11864, -11160],
        "grows",
    ),
    # Features (4 KiB) kept every third step, at steps 2 and 5 of steps(6, warmup=2): as a
    # loop that settled at step 2 would be, plus a spike on the last step.
    "every_third_step_over_four_steps_is_undecided": ([4096, 4096, 4096, 8192], [-11048, -6952, -6952, -6952], "undecided"),
    # AdamW's state made at step 3, gradients set to None there and made again at step 4:
    # memory then held, but ``kept`` sees the gradients one step late.
    "optimizer_state_that_appeared_over_four_steps_is_undecided": ([0, 11064, 22112, 22112], [0, -11048, 11064, 22112], "undecided"),
    "the_same_over_eight_steps_is_clean": (
        [0, 11064, 22112, 22112, 22112, 22112, 22112, 22112],
        [0, -11048, 11064, 22112, 22112, 22112, 22112, 22112],
        "clean",
    ),
    # Dynamic padding: the batch a step holds varies; no tensor outlived the next step.
    "batches_varying_over_eight_steps_are_clean": ([-864, -864, -216, 72, -504, -72, -360, 144], [-9788] * 8, "clean"),
    "batches_varying_over_four_steps_are_undecided": ([-864, -864, -216, 72], [-9788] * 4, "undecided"),
    # A tensor replaced by a bigger one at each step: steady enough over 6 steps, not over 5.
    "a_tensor_growing_at_each_of_six_steps_grows": ([640, 1280, 1920, 2560, 3200, 3840], [0] * 6, "grows"),
    "a_tensor_growing_at_each_of_five_steps_is_undecided": ([640, 1280, 1920, 2560, 3200], [0] * 5, "undecided"),
    # A flat loop is clean however few its steps.
    "flat_over_two_steps_is_clean": ([0, 0], [0, 0], "clean"),
}


@pytest.mark.parametrize(("figures", "kept", "expected"), DECISIONS.values(), ids=DECISIONS.keys())
def test_decide(figures: list[int], kept: list[int], expected: str) -> None:
    verdict, undecided = steps_module.decide(figures, kept, 0, "cpu")
    got = "undecided" if undecided else "grows" if verdict.grows else "clean"
    assert got == expected, (verdict, undecided)
    assert not (undecided and verdict.grows)
    if undecided:
        assert undecided.startswith("undecided: ") and undecided.endswith("allow more steps with steps(n, warmup=k, max_steps=m)")


def test_sure_steps_are_where_a_steady_rise_becomes_certain() -> None:
    assert trend_score(range(SURE_STEPS)) >= TREND_CERTAIN > trend_score(range(SURE_STEPS - 1))

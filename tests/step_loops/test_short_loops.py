"""Step checks on short loops: the verdict without the explanation, and how few steps decide."""

from __future__ import annotations

import re

import pytest
import torch

import pytest_vramleak.steps as steps_module
from pytest_vramleak import StepWatcher
from pytest_vramleak.judging.verdict import SURE_STEPS, TREND_CERTAIN, GrowthVerdict, trend_score
from pytest_vramleak.steps import StepResult
from pytest_vramleak.tracking.tracker import NODE_BYTES


def test_explain_false_gives_the_same_verdict_without_looking_for_holders(monkeypatch) -> None:
    kept: list[torch.Tensor] = []

    def step(i: int) -> None:
        kept.append(torch.ones(256))

    explained = StepWatcher("cpu", warmup=2).check(step, steps=8)
    kept.clear()
    assert explained.grows and explained.leak is not None and "held by" in explained.leak.render()

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("explain=False looked for holders or recorded sites")

    monkeypatch.setattr(steps_module, "name_storages", refuse)
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


# decide(figures, kept) on figures measured from catalogue loops (tests/step_loops/test_loop_catalogue.py,
# tests/step_loops/test_realistic_loops.py, tests/step_loops/test_noisy_loops.py); the comments say what each loop did.

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
    "every_third_step_over_four_steps_is_undecided": (
        [4096, 4096, 4096, 8192],
        [-11048, -6952, -6952, -6952],
        "undecided",
    ),
    # AdamW's state made at step 3, gradients set to None there and made again at step 4:
    # memory then held, but ``kept`` sees the gradients one step late.
    "optimizer_state_that_appeared_over_four_steps_is_undecided": (
        [0, 11064, 22112, 22112],
        [0, -11048, 11064, 22112],
        "undecided",
    ),
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
        assert undecided.startswith("undecided: ") and undecided.endswith(
            "allow more steps with steps(n, warmup=k, max_steps=m)"
        )


def test_sure_steps_are_where_a_steady_rise_becomes_certain() -> None:
    assert trend_score(range(SURE_STEPS)) >= TREND_CERTAIN > trend_score(range(SURE_STEPS - 1))


MASK_PER_LENGTH = """
import torch
from torch import nn

def test_masks(vramleak):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=True)
    masks = {}
    for step in vramleak.steps(10, warmup=2):
        length = 8 + step  # a new length at each step
        tokens = torch.randn(4, length, 16)  # 2.5 KiB to 4.3 KiB, alive until the next step
        if length not in masks:
            masks[length] = nn.Transformer.generate_square_subsequent_mask(length)
        layer(tokens, src_mask=masks[length]).sum().backward()
"""


def test_a_mask_cached_per_new_length_is_reported_at_the_rate_of_the_masks(pytester: pytest.Pytester) -> None:
    # The measured steps make masks of 10x10 to 17x17 floats (400 B to 1.1 KiB); the tokens a
    # step holds until the next are not kept. What the steps kept grows by the masks alone.
    pytester.makepyfile(test_it=MASK_PER_LENGTH)
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(failed=1)
    rate = re.search(r"memory grew ([\d.]+) (B|KiB) per step over 8 measured steps", result.stdout.str())
    assert rate is not None, result.stdout.str()
    per_step = float(rate[1]) * (1024 if rate[2] == "KiB" else 1)
    assert 10 * 10 * 4 <= per_step <= 17 * 17 * 4, rate[0]
    result.stdout.fnmatch_lines(
        ["float32[[]16, 16[]] on cpu: 1 tensor, 1.0 KiB", "    held by test_masks:* local 'masks'[[]16[]]"]
    )
    result.stdout.no_fnmatch_line("*local 'tokens'*")


GRADIENTS_EVERY_OTHER_STEP = """
import torch
from torch import nn

def test_accumulation(vramleak):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 32), torch.randint(10, (16,))
    losses = []
    for step in vramleak.steps(10, warmup=2):
        if step % 2 == 0:  # gradients accumulated over two steps, set to None before the first
            optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y) / 2
        loss.backward()
        if step % 2 == 1:
            optimizer.step()
        losses.append(loss.detach())  # the leak: 4 B a step
"""


def test_gradients_replaced_every_other_step_are_not_listed_as_what_leaks(pytester: pytest.Pytester) -> None:
    # The gradients made at step 8 are alive after step 9 (they are accumulated there), as those
    # of steps 2, 4 and 6 were after theirs: each replaces the one before, none adds.
    pytester.makepyfile(test_it=GRADIENTS_EVERY_OTHER_STEP)
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "memory grew 4 B per step over 8 measured steps (32 B in total) on cpu, tolerance 0 B",
            "tensors created after warm-up that outlived their step:",
            "not listed: 4 storages (10.8 KiB) that outlived their step only as the latest of their kind*",
            "float32[[][]] on cpu: 7 tensors, 28 B",
            "    held by test_accumulation:* local 'losses'[[]2[]]",
        ]
    )
    result.stdout.no_fnmatch_line("*gradient on cpu*")
    result.stdout.no_fnmatch_line("*].grad*")


def test_a_buffer_replaced_every_other_step_is_set_aside_with_its_causes_given_as_examples(
    pytester: pytest.Pytester,
) -> None:
    # No gradient here: the note names its causes as examples, not as what this loop did.
    pytester.makepyfile(
        test_it="""
        import torch

        def test_buffer(vramleak):
            losses, buffers = [], {}
            for step in vramleak.steps(10, warmup=2):
                if step % 2 == 0:
                    buffers["scratch"] = torch.randn(512)
                losses.append(torch.ones(1).sum())  # the leak: 4 B a step
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "memory grew 4 B per step over 8 measured steps (32 B in total) on cpu, tolerance 0 B",
            "not listed: 1 storage (2.0 KiB) that outlived its step only as the latest of its kind: it took the place of "
            "storages of its size that earlier measured steps made and freed since (such as a gradient set to None and "
            "made again, or a buffer a loop replaces every few steps)",
            "float32[[][]] on cpu: 7 tensors, 28 B",
        ]
    )
    result.stdout.no_fnmatch_line("*every other step*")


def test_a_leak_whose_tensors_are_the_size_of_the_batch_it_frees_is_still_listed() -> None:
    # Each step keeps a copy of its batch, and the batch of the step before (the same size) is
    # freed: the copies are not the latest of their kind, the earlier ones are alive.
    kept: list[torch.Tensor] = []
    last: dict[str, torch.Tensor] = {}

    def step(i: int) -> None:
        last["batch"] = torch.randn(64)
        kept.append(last["batch"].clone())

    result = StepWatcher("cpu", warmup=2).check(step, steps=10)
    kept.clear()
    assert result.grows and result.leak is not None
    (group,) = result.leak.groups
    assert (group.shape, group.count) == ((64,), 7) and not result.leak.notes, result.describe()


def test_a_leak_beneath_a_sawtooth_is_reported_at_its_own_rate() -> None:
    # 64 B a step, and 40 B every fourth step, beneath 640 B a step cleared every fourth step:
    # 74 B a step, whichever tooth the last step is on.
    figures, kept, _ = DECISIONS["leak_beneath_a_sawtooth_grows"]
    verdict, undecided = steps_module.decide(figures, kept, 0, "cpu")
    assert undecided is None and verdict.per_step_bytes == 74
    assert verdict.message == "memory grew 74 B per step over 8 measured steps (592 B in total) on cpu, tolerance 0 B"


def test_history_that_grows_is_said_where_the_storages_are_undecided() -> None:
    history = GrowthVerdict(True, 8 * NODE_BYTES, 2.0 * NODE_BYTES, "")
    result = StepResult(
        "cpu",
        2,
        [0, 0, 64, 0],
        GrowthVerdict(False, 0, 0.0, ""),
        history=[0, 2, 4, 6],
        history_verdict=history,
        undecided="undecided: why",
    )
    assert result.grows
    lines = result.describe().splitlines()
    assert (
        lines[0].startswith("the autograd history kept across steps grew 2 nodes per step")
        and lines[-1] == "undecided: why"
    )

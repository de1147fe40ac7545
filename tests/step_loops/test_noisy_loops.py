"""Loops whose memory varies from step to step, each over 10 data seeds at the settings of :mod:`tests.loops`.

A loop written inline keeps its last batch until the next step rebinds it, so the figure after
each step moves with that batch's size (dynamic padding, data-dependent routing, variable batch
sizes), and gradients set to None come and go with the experts a step used. The step check must
never take that variation for growth, must still see a leak of 128 bytes a step beneath it, and
where the measured steps are too few to tell the two apart, say ``undecided``; with ``max_steps``
allowed, it runs on until it can.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import NamedTuple

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from pytest_vramleak import StepWatcher

from .loops import SEEDS, SETTING_PARAMS, Setting, wrong_verdicts

Step = Callable[[int], None]


class NoisyLoop(NamedTuple):
    name: str
    build: Callable[[int], Step]
    leaks: bool


def dynamic_padding(seed: int, leak: int = 0) -> Step:
    """Token batches padded to their longest sequence (3 to 40 tokens); ``leak`` bytes kept a step."""
    generator, sampler = torch.Generator().manual_seed(seed), random.Random(seed)
    torch.manual_seed(seed)
    embedding, head = nn.Embedding(100, 16), nn.Linear(16, 2)
    optimizer = torch.optim.SGD([*embedding.parameters(), *head.parameters()], lr=0.01)
    last: list[torch.Tensor] = []
    kept: list[torch.Tensor] = []

    def step(i: int) -> None:
        lengths = [sampler.randint(3, 40) for _ in range(8)]
        ids = torch.zeros(8, max(lengths), dtype=torch.long)
        for row, length in enumerate(lengths):
            ids[row, :length] = torch.randint(1, 100, (length,), generator=generator)
        mask = ids != 0
        pooled = (embedding(ids) * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True)
        loss = F.cross_entropy(head(pooled), torch.randint(0, 2, (8,), generator=generator))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        last[:] = [ids, mask, pooled, loss]  # what an inline loop still holds after its step
        if leak:
            kept.append(torch.zeros(leak // 4))

    return step


def mixture_of_experts(seed: int, leak: bool = False) -> Step:
    """Top-1 routing over 4 experts, batches of 4 to 31 rows, gradients set to None each step: an
    expert no row chose has no gradient after the step. The leak keeps 16 rows of router
    probabilities (256 bytes) a step."""
    torch.manual_seed(seed)
    experts, router = nn.ModuleList(nn.Linear(16, 16) for _ in range(4)), nn.Linear(16, 4)
    optimizer = torch.optim.SGD([*experts.parameters(), *router.parameters()], lr=0.01)
    logged: list[torch.Tensor] = []

    def step(i: int) -> None:
        x = torch.randn(int(torch.randint(4, 32, ())), 16)
        probabilities = router(x).softmax(-1)
        choice = probabilities.argmax(-1)
        out = torch.zeros_like(x)
        for index, expert in enumerate(experts):
            chosen = choice == index
            if chosen.any():
                out[chosen] = expert(x[chosen])
        loss = out.pow(2).mean() + probabilities.mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if leak:
            logged.append(probabilities.detach()[:16].clone())

    return step


def variable_batches(seed: int, keep: int = 0, clear_every: int = 0) -> Step:
    """Batches of 1 to 64 rows of 64 features (up to 16 KiB) kept until the next step; ``keep``
    bytes kept a step, or a per-row buffer emptied every ``clear_every`` steps."""
    sampler = random.Random(seed)
    torch.manual_seed(seed)
    model = nn.Linear(64, 8)
    state: dict[str, object] = {}
    kept: list[torch.Tensor] = []

    def step(i: int) -> None:
        rows = sampler.randint(1, 64)
        x = torch.randn(rows, 64)
        state["last"] = (x, model(x).relu().sum())
        if keep:
            kept.append(torch.zeros(keep // 4))
        if clear_every:
            kept.append(torch.zeros(rows * 16))
            if i % clear_every == clear_every - 1:
                kept.clear()

    return step


LOOPS = [
    NoisyLoop("dynamic_padding", dynamic_padding, False),
    NoisyLoop("dynamic_padding_keeping_128_bytes_a_step", lambda seed: dynamic_padding(seed, 128), True),
    NoisyLoop("dynamic_padding_keeping_1_kib_a_step", lambda seed: dynamic_padding(seed, 1024), True),
    NoisyLoop("mixture_of_experts_with_gradients_set_to_none", mixture_of_experts, False),
    NoisyLoop("mixture_of_experts_logging_router_probabilities", lambda seed: mixture_of_experts(seed, True), True),
    NoisyLoop("variable_batches", variable_batches, False),
    NoisyLoop("variable_batches_keeping_128_bytes_a_step", lambda seed: variable_batches(seed, keep=128), True),
    NoisyLoop(
        "variable_batches_with_a_buffer_cleared_every_3_steps",
        lambda seed: variable_batches(seed, clear_every=3),
        False,
    ),
]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("setting", SETTING_PARAMS)
@pytest.mark.parametrize("entry", LOOPS, ids=[entry.name for entry in LOOPS])
def test_no_seed_gets_a_wrong_verdict(entry: NoisyLoop, setting: Setting) -> None:
    wrong = wrong_verdicts(entry.build, entry.leaks, setting)
    assert not wrong, f"{entry.name} at {setting}: expected {'grows' if entry.leaks else 'clean'}:\n" + "\n".join(wrong)


def test_a_leak_under_noise_is_reported_at_its_own_rate() -> None:
    # 128 bytes a step, beneath batches that vary by kilobytes: the rate is what the steps kept.
    for seed in SEEDS:
        result = StepWatcher("cpu", warmup=2, explain=False).check(variable_batches(seed, keep=128), steps=10)
        assert result.verdict is not None and result.verdict.per_step_bytes == 128, (seed, result.describe())
        assert result.verdict.message.startswith("memory grew 128 B per step over 8 measured steps"), (
            result.verdict.message
        )


def test_undecided_says_why_and_max_steps_says_how_many_steps_it_took() -> None:
    # Seed 4 of dynamic padding: after 4 measured steps the figures rose (-864 B to 72 B), and no
    # tensor a step made outlived the next step.
    result = StepWatcher("cpu", warmup=2, record_sites=False).check(dynamic_padding(4), steps=6)
    assert result.undecided is not None and not result.grows, result.steps
    assert result.describe().startswith("undecided: memory rose ") and "max_steps" in result.describe()
    extended = StepWatcher("cpu", warmup=2, record_sites=False).check(dynamic_padding(4), steps=6, max_steps=48)
    assert extended.undecided is None and not extended.grows
    assert extended.ran in (12, 24, 48) and len(extended.steps) == extended.ran - 2


INLINE = """
import random
import torch

def test_padded_batches(vramleak):
    sampler, generator = random.Random(4), torch.Generator().manual_seed(4)
    torch.manual_seed(4)
    embedding = torch.nn.Embedding(100, 16)
    kept = []
    for step in vramleak.steps(6, warmup=2{max_steps}):
        lengths = [sampler.randint(3, 40) for _ in range(8)]
        ids = torch.zeros(8, max(lengths), dtype=torch.long)
        for row, length in enumerate(lengths):
            ids[row, :length] = torch.randint(1, 100, (length,), generator=generator)
        pooled = embedding(ids).mean(1)
        loss = pooled.pow(2).mean()
        loss.backward()
        {keep}
"""


def test_an_inline_loop_the_steps_cannot_decide_is_unchecked_with_the_reason(
    pytester: pytest.Pytester, run_checked
) -> None:
    # The loop's batch, padded to its longest sequence, is alive after each step: the figures
    # rose over the 4 measured steps, and nothing a step made outlived the next one.
    pytester.makepyfile(test_it=INLINE.format(max_steps="", keep="pass"))
    result, report = run_checked("-p", "no:randomly")
    entry = report["test_padded_batches"]
    assert (entry["verdict"], entry["reason"][:40]) == ("unchecked", "undecided: memory rose 64 B over 4 measu"), (
        result.stdout.str()
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "test_it.py::test_padded_batches: undecided: memory rose 64 B over 4 measured steps on cpu*allow more steps with steps(n, warmup=k, max_steps=m)"
        ]
    )


def test_max_steps_lets_an_inline_loop_run_on_until_it_is_decided(pytester: pytest.Pytester, run_checked) -> None:
    pytester.makepyfile(test_it=INLINE.format(max_steps=", max_steps=48", keep="pass"))
    result, report = run_checked("-p", "no:randomly")
    entry = report["test_padded_batches"]
    assert entry["verdict"] == "passed" and len(entry["steps"]) > 4, entry


def test_an_inline_loop_keeping_a_small_tensor_a_step_under_the_noise_fails(
    pytester: pytest.Pytester, run_checked
) -> None:
    pytester.makepyfile(test_it=INLINE.format(max_steps="", keep="kept.append(loss.detach().reshape(1).repeat(32))"))
    result, report = run_checked("-p", "no:randomly")
    assert report["test_padded_batches"]["verdict"] == "leaked", result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "memory grew 128 B per step over 4 measured steps (512 B in total) on cpu*",
            "    held by test_padded_batches:* local 'kept'[[]*[]]",
        ]
    )

"""Step checks on short loops: the verdict without the explanation, and how few steps decide."""

from __future__ import annotations

import torch

import pytest_vramleak.steps as steps_module
from pytest_vramleak import StepWatcher


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

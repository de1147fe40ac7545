"""Hooks that collect outputs, and errors that pin frames."""

from __future__ import annotations

import pytest
import torch
from models import Classifier

MODELS: list[Classifier] = []
FAILED_BATCHES: list[Exception] = []


@pytest.mark.vram_budget
def test_hook_appends_activations():
    """Leaks: a model kept for later tests carries a forward hook that stores every activation."""
    model = Classifier()
    activations = []
    model.encoder.register_forward_hook(lambda module, args, output: activations.append(output.detach()))
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(64, 128))
    MODELS.append(model)


@pytest.mark.vram_budget
def test_hook_removed_after_use():
    """No leak: the hook is removed and the collected activations are dropped."""
    model = Classifier()
    collected = []
    handle = model.head.register_forward_hook(lambda module, args, output: collected.append(output.detach()))
    try:
        with torch.no_grad():
            model(torch.randn(64, 128))
    finally:
        handle.remove()
    assert len(collected) == 1


MODEL = Classifier()


def train_step(batch: torch.Tensor) -> torch.Tensor:
    hidden = MODEL.encoder(batch)
    if hidden.shape[0] != 32:
        raise ValueError(f"expected batches of 32, got {hidden.shape[0]}")
    return MODEL.head(hidden)


@pytest.mark.vram_budget
def test_stored_exception_pins_activations():
    """Leaks: keeping the exception keeps its traceback, its frames and their local tensors."""
    try:
        train_step(torch.randn(48, 128))
    except ValueError as error:
        FAILED_BATCHES.append(error)  # the fix: store str(error)

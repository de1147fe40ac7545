"""A small classifier and data, shared by the examples."""

from __future__ import annotations

import torch


class Classifier(torch.nn.Module):
    def __init__(self, features: int = 128, hidden: int = 256, classes: int = 10) -> None:
        super().__init__()
        self.encoder = torch.nn.Sequential(torch.nn.Linear(features, hidden), torch.nn.ReLU())
        self.head = torch.nn.Linear(hidden, classes)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(inputs))


def batches(count: int, size: int = 64, features: int = 128, classes: int = 10):
    generator = torch.Generator(device=torch.get_default_device()).manual_seed(0)
    for _ in range(count):
        yield torch.randn(size, features, generator=generator), torch.randint(classes, (size,), generator=generator)

"""Training loops checked step by step with the ``vramleak`` fixture."""

from __future__ import annotations

import torch
from models import Classifier, batches

loss_fn = torch.nn.CrossEntropyLoss()


def test_running_loss_keeps_every_graph(vramleak):
    """Leaks: ``running_loss += loss`` keeps each step's autograd graph alive."""
    model = Classifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    running_loss = 0.0
    data = batches(10)
    for step in vramleak.steps(10):
        inputs, labels = next(data)
        optimizer.zero_grad()
        loss = loss_fn(model(inputs), labels)
        loss.backward(retain_graph=True)
        optimizer.step()
        running_loss += loss  # the fix: running_loss += loss.item()


def test_running_loss_with_item(vramleak):
    """No leak: ``loss.item()`` is a Python float; Adam's state appears during warm-up."""
    model = Classifier()
    optimizer = torch.optim.Adam(model.parameters())
    running_loss = 0.0
    data = batches(10)
    for step in vramleak.steps(10, warmup=2):
        inputs, labels = next(data)
        optimizer.zero_grad()
        loss = loss_fn(model(inputs), labels)
        loss.backward()
        optimizer.step()
        running_loss += loss.item()


def test_validation_outputs_kept_for_metrics(vramleak):
    """Leaks: predictions are stored with their graph because validation forgot ``torch.no_grad()``."""
    model = Classifier().eval()
    predictions = []
    data = batches(8)
    for step in vramleak.steps(8):
        inputs, _ = next(data)
        predictions.append(model(inputs))  # the fix: wrap the loop in torch.no_grad()

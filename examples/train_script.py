"""A training loop checked outside pytest, in a script: run it from the repository root.

    python examples/train_script.py           # keeps every loss with its graph: fails, exit 1
    python examples/train_script.py --fixed   # keeps loss.item(): passes, exit 0

The step watcher measures memory after each step (after two warm-up steps) and decides whether it
keeps growing; where it does, it names the tensors that outlived their step and what holds them.
"""

from __future__ import annotations

import argparse
import sys

import torch
from models import Classifier, batches

from pytest_vramleak import StepWatcher


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fixed", action="store_true", help="keep loss.item() instead of the loss")
    fixed = parser.parse_args(argv).fixed
    torch.manual_seed(0)
    model = Classifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = batches(12)
    history = []

    def train_step() -> None:
        inputs, labels = next(data)
        loss = torch.nn.functional.cross_entropy(model(inputs), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        history.append(loss.item() if fixed else loss)  # the loss keeps its autograd graph

    result = StepWatcher("cpu", warmup=2).check(train_step, steps=12)
    if result.grows:
        print(f"leak: {result.describe()}")
        return 1
    print(f"no leak: memory did not grow over {len(result.steps)} measured steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Write a realistic suite of small PyTorch tests to a folder, for timing the plugin against plain pytest."""

from __future__ import annotations

import textwrap
from pathlib import Path

MODULE = """
import pytest
import torch

torch.manual_seed({seed})

# A module-level layer, as many suites build one at import and share it between tests.
ENCODER = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Tanh())


@pytest.fixture(scope="module")
def model():
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))


@pytest.fixture
def batch():
    return torch.randn(16, 32), torch.randint(0, 8, (16,))


@pytest.mark.parametrize("size", [8, 16, 32, 64])
def test_matmul_{seed}(size):
    a = torch.randn(size, size)
    b = torch.randn(size, size)
    assert torch.allclose(a @ b, torch.mm(a, b))


@pytest.mark.parametrize("dim", [0, 1])
def test_softmax_sums_to_one_{seed}(dim):
    x = torch.randn(8, 8)
    assert torch.allclose(x.softmax(dim).sum(dim), torch.ones(8))


def test_forward_shape_{seed}(model, batch):
    inputs, _ = batch
    with torch.no_grad():
        assert model(inputs).shape == (16, 8)


def test_backward_fills_grads_{seed}(batch):
    net = torch.nn.Linear(32, 8)
    inputs, labels = batch
    torch.nn.functional.cross_entropy(net(inputs), labels).backward()
    assert net.weight.grad is not None


def test_sgd_step_lowers_loss_{seed}(batch):
    net = torch.nn.Linear(32, 8)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.5)
    inputs, labels = batch
    losses = []
    for _ in range(3):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(inputs), labels)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_module_level_encoder_{seed}(batch):
    inputs, _ = batch
    with torch.no_grad():
        assert ENCODER(inputs).shape == (16, 32)


def test_backward_through_module_level_encoder_{seed}(batch):
    # leaves .grad on the module-level layer: memory kept once, not growth
    inputs, _ = batch
    ENCODER(inputs).pow(2).mean().backward()
    assert ENCODER[0].weight.grad is not None


def test_conv_output_{seed}():
    conv = torch.nn.Conv2d(3, 4, 3, padding=1)
    assert conv(torch.randn(2, 3, 8, 8)).shape == (2, 4, 8, 8)


def test_layer_norm_{seed}():
    x = torch.randn(4, 16)
    y = torch.nn.functional.layer_norm(x, (16,))
    assert torch.allclose(y.mean(-1), torch.zeros(4), atol=1e-5)
"""

TESTS_PER_MODULE = 13

# Tensors alive for the whole session that the tests never touch, as real suites keep them: a
# third in module-level layers, a third in a session-scoped model, a third as small tensors (a
# lookup table, parametrize values, a dataset held as tensors).
LIVE_TENSORS = """
import pytest
import torch

LIVE = {live}
LAYERS = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(LIVE // 6))
SMALL = [torch.full((4,), float(index)) for index in range(LIVE // 3)]


@pytest.fixture(scope="session", autouse=True)
def session_model():
    return torch.nn.Sequential(*(torch.nn.Linear(4, 4) for _ in range(LIVE // 6)))
"""


def write_suite(folder: Path, tests: int = 234, live: int = 0) -> int:
    """Write ``tests`` small tests (rounded up to whole modules) into ``folder``, with ``live``
    tensors held outside them by a conftest; return how many tests."""
    folder.mkdir(parents=True, exist_ok=True)
    modules = -(-tests // TESTS_PER_MODULE)
    for index in range(modules):
        (folder / f"test_suite_{index:03d}.py").write_text(textwrap.dedent(MODULE.format(seed=index)))
    (folder / "pytest.ini").write_text("[pytest]\n")
    # torch is imported by the conftest in every case, so the session times compared never include it.
    (folder / "conftest.py").write_text(LIVE_TENSORS.format(live=live) if live else "import torch\n")
    return modules * TESTS_PER_MODULE

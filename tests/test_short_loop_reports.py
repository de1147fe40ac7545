"""What a short training loop's failure costs and says: its holders named in a few passes over the heap."""

from __future__ import annotations

import json

import pytest


COUNTING_CONFTEST = """
import gc, json, sys
import pytest_vramleak.steps as steps

PASSES = {"get_referrers": 0, "get_objects": 0, "get_referents": 0, "collect": 0}
EXPLAINING = []


# Audit hooks and gc callbacks see the calls without putting a Python frame (and its argument
# tuple, one more referrer of what is searched for) between the plugin and gc.
def audit(event, args):
    if not EXPLAINING:
        return
    if event == "gc.get_referrers":
        PASSES["get_referrers"] += 1
    elif event == "gc.get_objects" and args[0] is None:
        PASSES["get_objects"] += 1
    elif event == "gc.get_referents" and len(args[0]) >= 10000:
        PASSES["get_referents"] += 1


def collected(phase, info):
    if EXPLAINING and phase == "start" and info["generation"] == 2:
        PASSES["collect"] += 1


sys.addaudithook(audit)
gc.callbacks.append(collected)
explain = steps._Loop.explain


def counted(self, *args, **kwargs):
    EXPLAINING.append(True)
    try:
        return explain(self, *args, **kwargs)
    finally:
        EXPLAINING.clear()


steps._Loop.explain = counted


def pytest_sessionfinish():
    with open("passes.json", "w") as stream:
        json.dump(PASSES, stream)
"""

LEAKING_LOOP = """
import torch

torch.set_num_threads(1)


def make_step(kept):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    optimizer = torch.optim.Adam(model.parameters())
    inputs, labels = torch.randn(64, 256), torch.randint(0, 10, (64,))

    def step(index):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(inputs), labels)
        loss.backward()
        optimizer.step()
        kept.append(model(inputs).sum())  # an output kept with its graph

    return step


def test_leaks(vramleak):
    step = make_step([])
    for index in vramleak.steps(6, warmup=2):
        step(index)
"""

MOST_PASSES = 6
"""Full passes over the heap that naming the leaking loop's holders may take: one listing of its
objects, one pass for who holds the tensors found, one per level up to the test's local (three:
the list, the closure's cell, the closure). Each costs some 20-35 ms in a pytest process that
imported torch; the search took 17 before (0.8 s over the bare loop)."""


def test_a_leaking_loop_is_explained_in_a_few_passes_over_the_heap(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(COUNTING_CONFTEST)
    pytester.makepyfile(test_loop=LEAKING_LOOP)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "float32[[][]] on cpu: 3 tensors, 12 B",
            "    allocated at test_loop.py:* in step(), called from test_loop.py:* in test_leaks()",
            "    held by test_leaks:* local 'step' -> closure var 'kept'[[]2[]]",
            "    held by test_leaks:* local 'step' -> closure var 'kept'[[]3[]]",
            "    held by test_leaks:* local 'step' -> closure var 'kept'[[]4[]]",
            "    diagnosis: autograd graph kept alive: * behind a tensor that still has its grad_fn*",
            "    diagnosis: a closure (a callback, a logger) captured it and lives on*",
        ]
    )
    passes = json.loads((pytester.path / "passes.json").read_text())
    assert passes["collect"] == 0, passes  # every tensor has a root: garbage cannot be on its chain
    assert sum(passes.values()) <= MOST_PASSES, passes

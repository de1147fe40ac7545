"""What a check on an accelerator names: its allocator says how much a test leaked, and the
tracker which tensors hold it. Driven with real CPU tensors through an allocator whose counters
are their bytes (:class:`tests.fakes.CountingAllocator`), as no CUDA device is at hand in CI."""

from __future__ import annotations

import pytest

SOURCE = """
import pytest, torch

MODEL = torch.nn.Linear(64, 64)  # made as the module is collected: no test's leak
CACHE = {}
EMBEDDINGS = {}
USERS = iter(range(10**6))

@pytest.mark.vram_budget
def test_keeps_one_entry():
    CACHE["user-42"] = torch.ones(1024, 256)

@pytest.mark.vram_budget
def test_grows():
    with torch.no_grad():
        for _ in range(3):
            EMBEDDINGS[next(USERS)] = MODEL(torch.ones(1, 64))
"""


FREEZING_CONFTEST = """
import gc
gc.freeze()

def pytest_unconfigure(config):
    gc.unfreeze()  # the inner session runs in this process: leave it as it was
"""


@pytest.mark.parametrize("conftest", ["", FREEZING_CONFTEST], ids=["plain", "heap frozen by the conftest"])
def test_what_leaked_is_named_and_nothing_older(
    pytester: pytest.Pytester, counting_allocator: None, run_checked, conftest: str
) -> None:
    if conftest:
        pytester.makeconftest(conftest)
    pytester.makepyfile(test_it=SOURCE)
    result, report = run_checked("-p", "no:randomly")
    assert {name: entry["verdict"] for name, entry in report.items()} == {
        "test_keeps_one_entry": "leaked",
        "test_grows": "leaked",
    }
    result.stdout.fnmatch_lines(
        [
            "*_ test_keeps_one_entry _*",
            "leaked 1.0 MiB on cpu, allowed 0 B",
            "leaked tensors:",
            "float32[[]1024, 256] on cpu: 1 tensor, 1.0 MiB",
            "    held by test_it.CACHE['user-42']",
            "*_ test_grows _*",
            "leaked 768 B on cpu, allowed 0 B",
            "leaked tensors, as one run leaves them*",
            "float32[[]1, 64] on cpu: 3 tensors, 768 B",
            "    allocated at test_it.py:16 in test_grows()",
            "    held by test_it.EMBEDDINGS[[]*]",
        ]
    )
    result.stdout.no_fnmatch_line("*no live tensor accounts for it*")
    result.stdout.no_fnmatch_line("*MODEL*")

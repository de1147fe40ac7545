"""State the tests themselves set for the whole process: torch's global settings set by a
conftest (a default device, a default dtype, inference or no-grad mode, deterministic mode). The
plugin's own tensors must not depend on any of it: a leak still fails with its holder, a clean test
still passes."""

from __future__ import annotations

import pytest

TORCH_GLOBAL_STATES = {
    "default device meta": "torch.set_default_device('meta')\n",
    "default dtype float64": "torch.set_default_dtype(torch.float64)\n",
    "inference mode": (
        "@pytest.fixture(autouse=True, scope='session')\n"
        "def _inference():\n"
        "    with torch.inference_mode():\n"
        "        yield\n"
    ),
    "grad disabled": "torch.set_grad_enabled(False)\n",
    "deterministic algorithms": "torch.use_deterministic_algorithms(True)\n",
}

LEAK_AND_CLEAN = """
    import pytest, torch
    CACHE = []

    @pytest.mark.vram_budget
    def test_leaks():
        CACHE.append(torch.ones(1024, dtype=torch.float32, device="cpu"))

    @pytest.mark.vram_budget
    def test_clean():
        torch.ones(1024, dtype=torch.float32, device="cpu").sum()

    def test_steps_leak(vramleak):
        for _ in vramleak.steps(8):
            CACHE.append(torch.ones(256, dtype=torch.float32, device="cpu"))

    def test_steps_clean(vramleak):
        for _ in vramleak.steps(8):
            torch.ones(256, dtype=torch.float32, device="cpu").sum()
    """


@pytest.mark.parametrize("state", list(TORCH_GLOBAL_STATES))
def test_torch_global_state_set_by_a_conftest_changes_no_verdict(pytester: pytest.Pytester, state: str) -> None:
    # In a subprocess: the state is the process's, and must not reach the tests after this one.
    pytester.makeconftest("import pytest, torch\n" + TORCH_GLOBAL_STATES[state])
    pytester.makepyfile(test_it=LEAK_AND_CLEAN)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly", "--vramleak")
    result.stdout.no_fnmatch_line("*INTERNALERROR*")
    result.stdout.no_fnmatch_line("*could not check*")
    result.assert_outcomes(passed=2, failed=2)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "*_ test_leaks _*",
            "leaked 4.0 KiB on cpu, allowed 0 B",
            "    held by test_it.CACHE[[]*[]]",
            "*_ test_steps_leak _*",
            "memory grew 1.0 KiB per step over 6 measured steps (6.0 KiB in total) on cpu, tolerance 0 B",
            "LEAKED test_it.py::test_leaks - VramLeak: leaked 4.0 KiB*",
            "FAILED test_it.py::test_steps_leak - VramLeak: memory grew 1.0 KiB per step*",
        ]
    )


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_how_gc_sees_tensors_is_asked_with_gradients_whatever_the_mode(mode: str) -> None:
    # Without a graph, the probe's tensor is not held by C++ and torch 2.4 would be taken for a
    # torch whose tensors all refer to their class: the census would miss the tensors graphs save.
    import torch

    from pytest_vramleak.tracking.torch_api import tensors_refer_to_their_class

    probe = tensors_refer_to_their_class.__wrapped__  # (the cached answer would hide the mode)
    plain = probe()
    with getattr(torch, mode)():
        assert probe() == plain

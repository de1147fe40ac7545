"""An out-of-memory error: what filled the memory, beside the test's own failure."""

from __future__ import annotations

import pytest


def test_out_of_memory_shows_what_filled_the_memory(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest, torch

        CACHE = {}

        @pytest.mark.vram_budget
        def test_it():
            CACHE["features"] = torch.ones(2048, 1024)
            activations = torch.ones(1024, 1024)
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "E       torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB",
            "*- vramleak: what filled the memory -*",
            "tensor storages alive on cpu: * in * storages",
            "largest tensors:",
            "float32[[]2048, 1024] on cpu: 1 tensor, 8.0 MiB",
            "    held by test_it.CACHE['features']",
            "float32[[]1024, 1024] on cpu: 1 tensor, 4.0 MiB",
            "    held by test_it:9 local 'activations'",
        ]
    )
    lines = result.stdout.lines
    after = lines[lines.index("    held by test_it:9 local 'activations'") + 1]
    assert not after.startswith("    diagnosis"), after  # the failing test's own frame is no stored exception


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (
            'RuntimeError("[enforce fail at alloc_cpu.cpp:121] DefaultCPUAllocator: can\'t allocate memory: you tried to allocate 1 bytes")',
            True,
        ),
        ("RuntimeError('shape mismatch')", False),
        ("MemoryError()", False),
    ],
)
def test_cpu_allocation_failure_counts_as_out_of_memory(error: str, expected: bool) -> None:
    from pytest_vramleak.meters.devices import is_out_of_memory

    assert is_out_of_memory(eval(error)) is expected

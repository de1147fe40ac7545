"""State the tests themselves set for the whole process: torch's global settings set by a
conftest (a default device, a default dtype, inference or no-grad mode, deterministic mode), and
tests that replace gc's functions or disable it. The plugin's own tensors and heap scans must not
depend on any of it: a leak still fails with its holder, a clean test still passes."""

from __future__ import annotations

import json
from collections.abc import Iterator

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


GC_REPLACEMENTS = {
    "get_referrers": "lambda *objects: []",
    "get_referents": "lambda *objects: []",
    "get_objects": "lambda generation=None: []",
    "collect": "lambda generation=2: 0",
    "is_tracked": "lambda obj: False",
}


@pytest.fixture
def gc_restored(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """gc's functions and its switch put back after an inner run whose tests replace them."""
    import gc

    for name in [*GC_REPLACEMENTS, "disable", "enable", "freeze", "unfreeze"]:
        monkeypatch.setattr(gc, name, getattr(gc, name))
    monkeypatch.setattr(gc, "garbage", gc.garbage)
    yield
    gc.enable()


@pytest.mark.parametrize("how", ["left replaced", "with monkeypatch"])
@pytest.mark.parametrize("name", list(GC_REPLACEMENTS))
def test_a_test_replacing_a_gc_function_blinds_no_check(
    pytester: pytest.Pytester, gc_restored: None, name: str, how: str
) -> None:
    if how == "left replaced":
        replace = f"gc.{name} = {GC_REPLACEMENTS[name]}"
    else:
        replace = f"monkeypatch.setattr(gc, {name!r}, {GC_REPLACEMENTS[name]})"
    pytester.makepyfile(
        test_it=f"""
        import gc
        import pytest, torch
        CACHE = []

        def test_replaces_and_leaks(monkeypatch):  # checked by --vramleak
            {replace}
            CACHE.append(torch.ones(1024))

        @pytest.mark.vram_budget
        def test_later_leak():
            CACHE.append(torch.ones(2048))

        def test_later_clean():
            torch.ones(1024).sum()
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:randomly", "--vramleak")
    result.stdout.no_fnmatch_line("*INTERNALERROR*")
    result.stdout.no_fnmatch_line("*could not check*")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(
        [
            "*_ test_replaces_and_leaks _*",
            "memory grew 4.0 KiB per run of the test over 3 measured runs on cpu, tolerance 0 B",
            "    held by test_it.CACHE[[]*[]]",
            "*_ test_later_leak _*",
            "leaked 8.0 KiB on cpu, allowed 0 B",
            "    held by test_it.CACHE[[]*[]]",
            "LEAKED test_it.py::test_replaces_and_leaks - VramLeak: memory grew 4.0 KiB*",
            "LEAKED test_it.py::test_later_leak - VramLeak: leaked 8.0 KiB*",
        ]
    )


def test_gc_disabled_by_a_test_blinds_no_check(pytester: pytest.Pytester, gc_restored: None) -> None:
    pytester.makepyfile(
        test_it="""
        import gc
        import pytest, torch
        CACHE = []

        class Cycle:
            def __init__(self):
                self.me = self
                self.scratch = torch.ones(4096)

        @pytest.mark.vram_budget
        def test_disables_and_leaks():
            gc.disable()
            CACHE.append(torch.ones(1024))

        @pytest.mark.vram_budget
        def test_later_leak():
            CACHE.append(torch.ones(2048))

        @pytest.mark.vram_budget
        def test_later_garbage_in_a_cycle_is_not_a_leak():
            Cycle()
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:randomly")
    result.stdout.no_fnmatch_line("*INTERNALERROR*")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(
        [
            "*_ test_disables_and_leaks _*",
            "leaked 4.0 KiB on cpu, allowed 0 B",
            "    held by test_it.CACHE[[]*[]]",
            "*_ test_later_leak _*",
            "leaked 8.0 KiB on cpu, allowed 0 B",
            "    held by test_it.CACHE[[]*[]]",
            "LEAKED test_it.py::test_disables_and_leaks - VramLeak: leaked 4.0 KiB*",
            "LEAKED test_it.py::test_later_leak - VramLeak: leaked 8.0 KiB*",
        ]
    )
    import gc

    assert not gc.isenabled()  # the plugin leaves the test's choice as it found it


def test_gc_saving_all_garbage_fails_the_test_that_turned_it_on_not_the_later_ones(pytester: pytest.Pytester) -> None:
    # A test turns gc.DEBUG_SAVEALL on and leaves it on: from then on the collector keeps every
    # unreachable object in gc.garbage. That test fails, told why; a later test whose harmless
    # reference cycle lands there passes, with a note saying whose flag kept it.
    pytester.makepyfile(
        test_it="""
        import gc
        import torch

        class Block(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.linear = torch.nn.Linear(64, 64)
                self.me = self

        def test_turns_saving_on():
            gc.set_debug(gc.DEBUG_SAVEALL)
            Block()
            gc.collect()

        def test_later_cycle():
            block = Block()
            assert block.linear(torch.ones(1, 64)).shape == (1, 64)
        """
    )
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "no:randomly", "--vramleak", "--vramleak-report=r.json"
    )
    result.stdout.no_fnmatch_line("*INTERNALERROR*")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*_ test_turns_saving_on _*",
            "    held by gc.garbage[[]*[]]*",
            "    diagnosis: gc.garbage keeps these tensors: while gc.DEBUG_SAVEALL is on*gc.set_debug(flags)*",
            "LEAKED test_it.py::test_turns_saving_on - *",
        ]
    )
    tests = {test["nodeid"]: test for test in json.loads((pytester.path / "r.json").read_text())["tests"]}
    later = tests["test_it.py::test_later_cycle"]
    assert later["verdict"] == "passed"
    assert any(
        "kept in gc.garbage: gc.DEBUG_SAVEALL was on before this test began (test_it.py::test_turns_saving_on "
        "turned it on)"
        in note
        and note.endswith(": not counted")
        for note in later["notes"]
    ), later["notes"]


def test_a_mode_left_on_torchs_stack_fails_the_test_that_entered_it_not_the_later_ones(
    pytester: pytest.Pytester,
) -> None:
    # A test enters a TorchFunctionMode and never exits it: the mode stays on torch's stack and
    # records the outputs of every later test too. The test that entered it fails; a later one
    # passes, with a note saying whose mode kept its memory.
    pytester.makepyfile(
        test_it="""
        import torch
        from torch.overrides import TorchFunctionMode

        class RecordLinearOutputs(TorchFunctionMode):
            def __init__(self):
                super().__init__()
                self.outputs = []

            def __torch_function__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                if func is torch.nn.functional.linear:
                    self.outputs.append(out)
                return out

        MODEL = torch.nn.Linear(256, 256)

        def test_enters_a_mode():
            RecordLinearOutputs().__enter__()
            with torch.no_grad():
                MODEL(torch.ones(64, 256))

        def test_later_forward():
            with torch.no_grad():
                assert MODEL(torch.ones(64, 256)).shape == (64, 256)
        """
    )
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "no:randomly", "--vramleak", "--vramleak-report=r.json"
    )
    result.stdout.no_fnmatch_line("*INTERNALERROR*")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*_ test_enters_a_mode _*",
            "    held by torch's TorchFunctionMode stack[[]*[]] (RecordLinearOutputs, entered and not exited).outputs[[]*",
            "    diagnosis: a mode entered and not exited stays on torch's mode stack*",
            "LEAKED test_it.py::test_enters_a_mode - *",
        ]
    )
    tests = {test["nodeid"]: test for test in json.loads((pytester.path / "r.json").read_text())["tests"]}
    later = tests["test_it.py::test_later_forward"]
    assert later["verdict"] == "passed"
    assert any(
        "kept by a mode on torch's stack entered before this test began and not exited "
        "(test_it.py::test_enters_a_mode entered it)"
        in note
        and note.endswith(": not counted")
        for note in later["notes"]
    ), later["notes"]


def test_the_package_reaches_gc_only_through_the_functions_it_captured() -> None:
    import ast
    from pathlib import Path

    import pytest_vramleak

    package = Path(pytest_vramleak.__file__).parent
    importers = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module == "gc" or "gc" in names:
                importers.append(path.relative_to(package).as_posix())
    assert importers == ["tracking/gc_functions.py"]


@pytest.mark.parametrize("conftest", ["", "torch.set_default_device('meta')\n"], ids=["plain", "default device meta"])
@pytest.mark.parametrize("options", [(), ("--vramleak-peaks", "--vramleak")], ids=["peak budget", "peaks"])
def test_a_test_freeing_an_older_tensor_while_its_peak_is_measured_prints_nothing_of_torchs(
    pytester: pytest.Pytester, conftest: str, options: tuple[str, ...]
) -> None:
    # c10 prints "Memory block of unknown size ..." once a process, straight to file descriptor 2,
    # when a block made before a profiler started is freed under it: the plugin spends it unseen.
    # (In a subprocess: once spent, a process never prints it again.)
    pytester.makeconftest("import torch\n" + conftest)
    pytester.makepyfile(
        test_it="""
        import pytest, torch
        OLDER = [torch.ones(1024, device="cpu")]

        @pytest.mark.vram_budget("1 MiB")
        def test_frees_an_older_tensor():
            OLDER.clear()
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-s", *options)
    result.assert_outcomes(passed=1)
    assert "unknown size" not in result.stdout.str() + result.stderr.str()

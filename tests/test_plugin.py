"""The marker, options, reports and safety guarantees of the pytest layer."""

from __future__ import annotations

import json
import re

import pytest

from .conftest import read_report


def test_baseline_excludes_fixtures_that_outlive_or_free_at_teardown(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest, torch

        @pytest.fixture(scope="module")
        def model():
            return torch.nn.Linear(512, 512)

        @pytest.fixture
        def workspace():
            buffers = [torch.ones(1024, 256)]
            yield buffers
            buffers.clear()

        @pytest.mark.vram_budget
        def test_uses_module_model(model):
            assert model(torch.ones(1, 512)).shape == (1, 512)

        @pytest.mark.vram_budget
        def test_fills_function_fixture(workspace):
            workspace.append(torch.ones(1024, 256))  # freed by the fixture's teardown
        """
    )
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=2)


def test_what_a_test_puts_in_a_function_fixture_is_not_its_leak(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest, torch

        @pytest.fixture
        def buffer():
            return []

        @pytest.mark.vram_budget
        def test_fills_fixture(buffer):
            buffer.append(torch.ones(1024, 256))
        """
    )
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_a_failing_test_keeps_its_own_failure(pytester: pytest.Pytester, run_checked) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest, torch
        CACHE = []

        @pytest.mark.vram_budget
        def test_it():
            CACHE.append(torch.ones(1024))
            assert 1 == 2
        """
    )
    result, report = run_checked("-rA")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "E       assert 1 == 2",
            "*- vramleak: the test also leaked -*",
            "leaked 4.0 KiB on cpu, allowed 0 B",
            "*held by test_it.CACHE?0?",
            "FAILED test_it.py::test_it - assert 1 == 2",
        ]
    )
    result.stdout.no_fnmatch_line("*VramLeak*")
    assert report["test_it"]["verdict"] == "leaked"
    assert report["test_it"]["leaked_bytes"] == 4096


def test_every_test_option_and_exemption(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest, torch
        CACHE = []

        def test_leaks():
            CACHE.append(torch.ones(1024))

        @pytest.mark.allow_vram_leak
        def test_exempt():
            CACHE.append(torch.ones(1024))

        def test_clean():
            torch.ones(1024).sum()
        """
    )
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=3)
    result = pytester.runpytest("-p", "no:cacheprovider", "--vramleak")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["LEAKED test_it.py::test_leaks - VramLeak: memory grew 4.0 KiB per run of the*"])
    pytester.makeini("[pytest]\nvramleak = true\n")
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=2, failed=1)


def test_leak_budget_and_peak_budget(pytester: pytest.Pytester, run_checked) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest, torch
        from pytest_vramleak import vram_budget
        CACHE = []

        @vram_budget(leak="8 KiB")
        def test_within_leak_budget():
            CACHE.append(torch.ones(1024))

        @vram_budget("1 MiB")
        def test_over_peak():
            scratch = torch.ones(1024, 1024)
            del scratch

        @pytest.mark.vram_budget(peak="8 MiB")
        def test_within_peak():
            scratch = torch.ones(1024, 1024)
            del scratch
        """
    )
    result, report = run_checked()
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        [
            "peaked at 4.0 MiB above baseline on cpu, allowed 1.0 MiB",
            "OVER BUDGET test_it.py::test_over_peak - VramLeak: peaked at 4.0 MiB*",
        ]
    )
    assert report["test_within_leak_budget"]["verdict"] == "passed"
    assert report["test_within_leak_budget"]["leaked_bytes"] == 4096
    assert report["test_over_peak"]["verdict"] == "over_budget"
    assert report["test_over_peak"]["peak_bytes"] == 4 * 1024**2
    assert report["test_within_peak"]["verdict"] == "passed"


def test_json_report_schema(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest, torch
        CACHE = {}

        @pytest.mark.vram_budget(leak=100)
        def test_leaks():
            CACHE["user-42"] = torch.ones(2, 512)
        """
    )
    path = pytester.path / "out" / "report.json"
    pytester.runpytest("-p", "no:cacheprovider", f"--vramleak-report={path}", "--vramleak-sites=on")
    document = json.loads(path.read_text())
    about = document.pop("about")
    assert set(about) == {"generated", "pytest-vramleak", "torch", "python", "settings", "host"}
    garbage = document["tests"][0]["details"].get("older_garbage_freed_bytes", 0)
    assert set(document["tests"][0]["details"]) <= {"older_garbage_freed_bytes"}
    assert document["tests"][0]["notes"] == []
    assert document == {
        "version": 2,
        "tests": [
            {
                "nodeid": "test_it.py::test_leaks",
                "device": "cpu",
                "outcome": "failed",
                "verdict": "leaked",
                "step_verdict": None,
                "baseline_bytes": document["tests"][0]["baseline_bytes"],
                # the collection that confirms a leak frees older garbage too (earlier inline runs')
                "end_bytes": document["tests"][0]["baseline_bytes"] + 4096 - garbage,
                "leaked_bytes": 4096,
                "peak_bytes": None,
                "peak_breakdown": None,
                "ranks": [],
                "budget": {"peak": None, "leak": 100},
                "steps": None,
                "warmup_steps": None,
                "step_history_nodes": None,
                "growth_bytes": None,
                "settled_after_step": None,
                "rule": "any",  # a marker's budget: anything past it fails
                "pattern": "kept_once",  # each run replaces the one tensor it keeps
                "repetitions": [4096, 4096, 4096],
                "repetition_warmup": 1,
                "tensors": [
                    {
                        "title": "float32[2, 512] on cpu: 1 tensor, 4.0 KiB",
                        "dtype": "float32",
                        "shape": [2, 512],
                        "device": "cpu",
                        "bytes": 4096,
                        "count": 1,
                        "held_by": ["test_it.CACHE['user-42']"],
                        "held_by_paths": [[["test_it", "module"], [".CACHE", "dict"], ["['user-42']", "Tensor"]]],
                        "allocated_at": ["test_it.py:6 in test_leaks()"],
                        "diagnoses": [],
                        "kind": "tensor",
                        "class": "",
                        "graph_bytes": 0,
                        "nodes": 0,
                    }
                ],
                "reason": None,
                "trace": None,
                "cycle_bytes": 0,
                "details": document["tests"][0]["details"],
                "notes": document["tests"][0]["notes"],
            }
        ],
        "fixtures": [],
        "between_checks": [],
    }
    assert [p.name for p in path.parent.iterdir()] == ["report.json"]  # no temporary file left


@pytest.mark.parametrize(
    ("marker", "message"),
    [
        (
            "vram_budget(leak=-1)",
            "test_it.py::test_it: @pytest.mark.vram_budget(leak=-1): size must not be negative, got -1",
        ),
        (
            "vram_budget('12 parsecs')",
            "test_it.py::test_it: @pytest.mark.vram_budget(peak='12 parsecs'): unknown unit 'parsecs' in '12 parsecs'*",
        ),
        (
            "vram_budget(leak=1.5)",
            "test_it.py::test_it: @pytest.mark.vram_budget(leak=1.5): expected bytes as an int or a string*got float 1.5",
        ),
        (
            "vram_budget(leek=0)",
            "test_it.py::test_it: @pytest.mark.vram_budget: unknown keyword 'leek'; use peak, leak, device, repeat, reserved or pinned",
        ),
        (
            "vram_budget(1, 2)",
            "test_it.py::test_it: @pytest.mark.vram_budget takes one positional argument (peak), got 2: (1, 2)",
        ),
        (
            "vram_budget(1, peak=2)",
            "test_it.py::test_it: @pytest.mark.vram_budget: peak given both by position and by keyword",
        ),
        (
            "vram_budget(device='tpu')",
            "test_it.py::test_it: @pytest.mark.vram_budget(device='tpu'): unknown device 'tpu'*",
        ),
    ],
)
def test_bad_marker_is_a_usage_error(pytester: pytest.Pytester, marker: str, message: str) -> None:
    pytester.makepyfile(test_it=f"import pytest\n@pytest.mark.{marker}\ndef test_it():\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message.replace('[', '[[]')}"])


@pytest.mark.parametrize(
    ("args", "ini", "message"),
    [
        (["--vramleak-tolerance=lots"], "", "ERROR: --vramleak-tolerance: cannot read 'lots' as a size*"),
        (
            [],
            "vramleak_tolerance = -5 KiB",
            "ERROR: ini option vramleak_tolerance: size must not be negative, got '-5 KiB'",
        ),
        (["--vramleak-warmup=two"], "", "ERROR: --vramleak-warmup: expected a whole number of steps >= 0, got 'two'"),
        (
            [],
            "vramleak_warmup = -1",
            "ERROR: ini option vramleak_warmup: expected a whole number of steps >= 0, got '-1'",
        ),
        (
            ["--vramleak-device=gpu"],
            "",
            "ERROR: --vramleak-device: unknown device 'gpu'; expected auto|cpu|cuda|cuda:N|mps|xpu",
        ),
        ([], "vramleak_device = gpu", "ERROR: ini option vramleak_device: unknown device 'gpu'*"),
    ],
)
def test_bad_option_names_its_source(pytester: pytest.Pytester, args: list[str], ini: str, message: str) -> None:
    pytester.makeini(f"[pytest]\n{ini}\n")
    pytester.makepyfile(test_it="def test_it():\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


@pytest.mark.parametrize(
    ("option", "ini", "header"),
    [
        (
            "--vramleak-device=cpu",
            "vramleak_device = cpu",
            "vramleak: device cpu, checking every test (--vramleak), *, step warm-up 2",
        ),
        (
            "--vramleak-warmup=5",
            "vramleak_warmup = 5",
            "vramleak: device cpu, checking every test (--vramleak), *, step warm-up 5",
        ),
        (
            "--vramleak-report=r.json",
            "vramleak_report = r.json",
            "vramleak: device cpu, checking every test (--vramleak), *, step warm-up 2, report r.json",
        ),
        (
            "--vramleak-confirm=5",
            "vramleak_confirm = 5",
            "vramleak: device cpu, checking every test (--vramleak), a leaking test runs 5 more times, *",
        ),
        (
            "--vramleak-kept-floor=4MiB",
            "vramleak_kept_floor = 4MiB",
            "vramleak: * failing growth or memory kept once from 4.0 MiB *",
        ),
        (
            "--vramleak-fail-on=growth",
            "vramleak_fail_on = growth",
            "vramleak: * a leaking test runs 3 more times, failing growth only, step warm-up 2",
        ),
    ],
)
def test_each_option_has_a_working_ini_twin(pytester: pytest.Pytester, option: str, ini: str, header: str) -> None:
    pytester.makepyfile(test_it="def test_it():\n    pass\n")
    pytester.runpytest("-p", "no:cacheprovider", "--vramleak", option).stdout.fnmatch_lines([header])
    pytester.makeini(f"[pytest]\n{ini}\n")
    pytester.runpytest("-p", "no:cacheprovider", "--vramleak").stdout.fnmatch_lines([header])


def test_tolerance_ini_twin_reaches_the_fixture(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import torch

        def test_it(vramleak):
            kept = []
            for step in vramleak.steps(8):
                kept.append(torch.ones(256))
        """
    )
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(failed=1)
    pytester.runpytest("-p", "no:cacheprovider", "--vramleak-tolerance=4 KiB").assert_outcomes(passed=1)
    pytester.makeini("[pytest]\nvramleak_tolerance = 4 KiB\n")
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_absent_device_skips_with_reason(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest

        @pytest.mark.vram_budget(device="cuda:7")
        def test_it():
            pass
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(skipped=1)
    # the device asked for, and the test's own place (not the plugin's)
    result.stdout.fnmatch_lines(
        ["SKIPPED [[]1] test_it.py:3: vramleak: device cuda:7 is not available in this process (no cuda device)"]
    )


def test_runs_without_warnings_and_keeps_no_reference(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import gc, weakref
        import pytest, torch
        CACHE = {}
        REFS = []

        @pytest.mark.vram_budget
        def test_leaks():
            CACHE["x"] = torch.ones(1024)
            REFS.append(weakref.ref(CACHE["x"]))

        def test_leaked_tensor_is_freed_once_dropped():
            CACHE.clear()
            gc.collect()
            assert REFS[0]() is None
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-W", "error", "-p", "no:randomly")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.no_fnmatch_line("*warnings summary*")
    result.stdout.no_fnmatch_line("*Warning*")


def test_internal_error_becomes_a_message_on_the_test(
    pytester: pytest.Pytester, run_checked, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_vramleak.tracking.tracker import Tracker

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("census exploded")

    monkeypatch.setattr(Tracker, "observe", broken)
    pytester.makepyfile(
        test_it="""
        import pytest

        @pytest.mark.vram_budget
        def test_one():
            pass

        def test_two():
            pass
        """
    )
    result, report = run_checked()
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["vramleak could not check this test: RuntimeError: census exploded"])
    assert report["test_one"]["verdict"] == "unchecked"
    assert report["test_one"]["reason"] == "vramleak internal error: RuntimeError: census exploded"


def test_without_torch_tests_run_unchecked_and_the_header_says_so(pytester: pytest.Pytester) -> None:
    pytester.makeconftest("import sys\nsys.modules['torch'] = None\n")
    pytester.makepyfile(
        test_it="""
        import pytest

        @pytest.mark.vram_budget("1 GiB")
        def test_marked():
            pass

        def test_fixture(vramleak):
            assert list(vramleak.steps(4)) == [0, 1, 2, 3]

        def test_plain():
            pass
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(
        ["vramleak: torch is not installed: tests marked vram_budget and the vramleak fixture run unchecked"]
    )
    result.stdout.no_fnmatch_line("*plugin.py*")


def test_without_torch_vramleak_is_a_usage_error(pytester: pytest.Pytester) -> None:
    # A CI job asked to check every test must not pass having checked none.
    pytester.makeconftest("import sys\nsys.modules['torch'] = None\n")
    pytester.makepyfile(test_it="def test_plain():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--vramleak")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: --vramleak checks tensor memory, and torch is not installed: install torch, or run without --vramleak"]
    )


def test_a_device_option_for_an_absent_device_stops_the_run(pytester: pytest.Pytester) -> None:
    # A GPU job that lands on a CPU runner must not go green having run nothing.
    pytester.makepyfile(test_it="def test_plain():\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider", "--vramleak", "--vramleak-device=cuda")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "ERROR: --vramleak-device=cuda: device cuda is not available in this process (no cuda device); torch * sees: cpu"
        ]
    )
    pytester.makeini("[pytest]\nvramleak_device = cuda:1\n")
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: ini option vramleak_device=cuda:1: device cuda:1 is not available*; torch * sees: cpu"]
    )


def test_markers_and_fixture_are_documented(pytester: pytest.Pytester) -> None:
    pytester.runpytest("--markers").stdout.fnmatch_lines(
        [
            "@pytest.mark.vram_budget(peak=None, *, leak=0, device=None, repeat=None, reserved=None, pinned=None): *",
            "@pytest.mark.allow_vram_leak: *",
        ]
    )
    pytester.makepyfile(test_it="def test_it():\n    pass\n")
    pytester.runpytest("--fixtures").stdout.fnmatch_lines(
        ["vramleak -- *", "    Check repeated training or inference steps*"]
    )


def test_plugin_can_be_disabled(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest, torch
        CACHE = []

        @pytest.mark.vram_budget
        def test_it():
            CACHE.append(torch.ones(1024))
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:vramleak")
    result.assert_outcomes(passed=1)


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


def test_cycles_and_fixture_leftovers_are_reported_not_failed(pytester: pytest.Pytester, run_checked) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest, torch

        REGISTRY = []

        @pytest.fixture(scope="module")
        def model():
            net = torch.nn.Linear(256, 256)
            REGISTRY.append(net)  # outlives the fixture's teardown
            return net

        class Node:
            pass

        def test_uses_model(model):
            model(torch.ones(1, 256))

        def test_makes_cycles():
            node = Node()
            node.me = node
            node.payload = torch.ones(1024, 256)
        """
    )
    result, report = run_checked("--vramleak", "-p", "no:randomly")
    result.assert_outcomes(passed=2)
    assert report["test_makes_cycles"]["cycle_bytes"] == 1024 * 1024
    result.stdout.fnmatch_lines(
        [
            "*= vramleak summary =*",
            "fixture 'model' (module scope, test_it.py) still holds 257.0 KiB it allocated, after its teardown",
            "    held by test_it.REGISTRY[[]0].weight",
            "    held by test_it.REGISTRY[[]0].bias",
            "test_it.py::test_makes_cycles: 1.0 MiB lived in reference cycles until garbage collection*",
        ]
    )


def test_fixture_kept_by_the_last_failed_tests_traceback_is_diagnosed(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest, torch

        @pytest.fixture(scope="module")
        def model():
            return torch.nn.Linear(256, 256)

        def test_uses(model):
            assert model(torch.ones(1, 256)).shape == (1, 256)

        @pytest.mark.allow_vram_leak  # (a checked test's failure is let go as it is checked)
        def test_fails(model):
            assert model(torch.ones(1, 256)).sum() > 10**6
        """
    )
    # In a process of its own: an inline run's recorder would keep the failed test's report too.
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--vramleak")
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(
        [
            "fixture 'model' (module scope, test_it.py) still holds 257.0 KiB it allocated, after its teardown",
            "    held by sys.last_*(test_fails:*) local 'model'.weight",
            "    diagnosis: sys.last_traceback / sys.last_value keep the last reported error's frames*(pytest sets them for a failed test*",
        ]
    )


def test_strict_cycles_fails_tests_that_leave_tensors_to_the_cycle_collector(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest, torch

        class Node:
            pass

        @pytest.mark.vram_budget
        def test_makes_cycles():
            node = Node()
            node.me = node
            node.payload = torch.ones(1024, 256)
        """
    )
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)
    result = pytester.runpytest("-p", "no:cacheprovider", "--vramleak-strict-cycles")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["left 1.0 MiB on cpu to the cycle collector, allowed 0 B (--vramleak-strict-cycles)*"])
    pytester.makeini("[pytest]\nvramleak_strict_cycles = true\n")
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(failed=1)


@pytest.mark.parametrize("refreeze", [False, True], ids=["as-timed", "every-observation-refreezes"])
def test_a_strict_cycles_failure_names_each_cycle_its_holder_and_where_the_tensor_was_made(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, refreeze: bool
) -> None:
    if refreeze:  # slow observations (the run recording sites traces every allocation) freeze the heap
        import pytest_vramleak.tracking.tracker

        monkeypatch.setattr(pytest_vramleak.tracking.tracker, "REFREEZE_AFTER_SECONDS", 0)
    pytester.makepyfile(
        test_it="""
        import torch

        class Node:
            pass

        class Parent:
            pass

        def test_makes_a_self_cycle():
            node = Node()
            node.me = node
            node.payload = torch.ones(1024, 256)

        def test_makes_parent_child_cycles():
            def make():
                parent, child = Parent(), Node()
                parent.child, child.parent = child, parent
                child.weights = {"w": torch.ones(64, 256)}

            for _ in range(3):
                make()

        def test_keeps_no_cycle():
            node = Node()
            node.payload = torch.ones(1024, 256)
        """
    )
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "--vramleak", "--vramleak-strict-cycles", "--vramleak-report=r.json"
    )
    result.assert_outcomes(failed=2, passed=1)
    result.stdout.fnmatch_lines(
        [
            "*_ test_makes_a_self_cycle _*",
            "left 1.0 MiB on cpu to the cycle collector, allowed 0 B (--vramleak-strict-cycles)*",
            "tensors freed only by the cycle collector:",
            "float32[1024, 256] on cpu: 1 tensor, 1.0 MiB",
            "    allocated at test_it.py:12 in test_makes_a_self_cycle()",
            "    held by Node.payload, on the reference cycle Node.me (back to the same Node)",
            "    diagnosis: these tensors lived on a reference cycle*weakref.ref*",
            "*_ test_makes_parent_child_cycles _*",
            "left 192.0 KiB on cpu to the cycle collector*",
            "tensors freed only by the cycle collector:",
            "float32[64, 256] on cpu: 3 tensors, 192.0 KiB",
            "    allocated at test_it.py:18 in make(), called from test_it.py:21 in test_makes_parent_child_cycles()",
            "    held by Node.weights['w'], on the reference cycle Node.parent.child (back to the same Node)",
        ]
    )
    assert "no live tensor accounts for it" not in result.stdout.str()
    assert "lived in reference cycles until garbage collection (not a leak" not in result.stdout.str()
    reports = read_report(pytester.path / "r.json")
    assert [tensor["held_by"] for tensor in reports["test_makes_a_self_cycle"]["tensors"]] == [
        ["Node.payload, on the reference cycle Node.me (back to the same Node)"]
    ]
    assert reports["test_keeps_no_cycle"]["verdict"] == "passed"
    assert reports["test_keeps_no_cycle"]["cycle_bytes"] in (None, 0)


def test_figures_are_junit_xml_properties(pytester: pytest.Pytester) -> None:
    import xml.etree.ElementTree as ElementTree

    pytester.makepyfile(
        test_it="""
        import pytest, torch
        CACHE = []

        @pytest.mark.vram_budget("8 MiB")
        def test_leaks():
            CACHE.append(torch.ones(1024))

        def test_unchecked():
            pass
        """
    )
    pytester.runpytest("-p", "no:cacheprovider", "--junitxml=junit.xml")
    cases = {case.get("name"): case for case in ElementTree.parse(pytester.path / "junit.xml").iter("testcase")}
    properties = {p.get("name"): p.get("value") for p in cases["test_leaks"].iter("property")}
    # growth: what the measured runs added in all (the test ran 4 times: it grows)
    assert properties == {
        "vramleak_outcome": "failed",
        "vramleak_verdict": "leaked",
        "vramleak_leaked_bytes": "4096",
        "vramleak_peak_bytes": "4096",
        "vramleak_growth_bytes": "12288",
    }
    assert list(cases["test_unchecked"].iter("property")) == []


def test_summary_lists_top_offenders_only_when_there_is_something_to_say(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest, torch
        CACHE = []

        @pytest.mark.vram_budget("64 MiB")
        def test_small_leak():
            CACHE.append(torch.ones(1024))

        @pytest.mark.vram_budget("64 MiB")
        def test_big_leak():
            CACHE.append(torch.ones(1024, 1024))
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(
        [
            "*= vramleak summary =*",
            "largest leaks:",
            "     4.0 MiB  test_it.py::test_big_leak (cpu, grows)",
            "     4.0 KiB  test_it.py::test_small_leak (cpu, grows)",
        ]
    )
    result.stdout.no_fnmatch_line("highest peaks*")
    result = pytester.runpytest("-p", "no:cacheprovider", "-v")
    result.stdout.fnmatch_lines(["highest peaks above baseline:", "     4.0 MiB  test_it.py::test_big_leak (cpu)"])
    pytester.makepyfile(test_it="import torch\ndef test_clean():\n    torch.ones(3)\n")
    result = pytester.runpytest("-p", "no:cacheprovider", "--vramleak")
    result.stdout.fnmatch_lines(["*= vramleak summary =*", "1 checked test: 1 passed; none leaked or went over budget"])
    result.stdout.no_fnmatch_line("largest leaks*")


MARKDOWN_SUITE = """
import pytest, torch
CACHE = {}

@pytest.mark.vram_budget
def test_leaks():
    CACHE["user-42"] = torch.ones(1024)

@pytest.mark.vram_budget
def test_clean():
    torch.ones(1024)
"""


def test_markdown_summary_to_a_path(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    pytester.makepyfile(test_it=MARKDOWN_SUITE)
    pytester.runpytest("-p", "no:cacheprovider", "--vramleak-markdown=out/summary.md")
    assert (pytester.path / "out" / "summary.md").read_text() == (
        "## vramleak: 2 checked tests: 1 failed, 1 passed; 1 leaked\n"
        "\n"
        "| test | outcome | verdict | device | leaked | peak |\n"
        "| --- | --- | --- | --- | --- | --- |\n"
        "| `test_it.py::test_leaks` | failed | leaked | cpu | 4.0 KiB | — |\n"
        "\n"
        "<details><summary>What holds the leaked tensors</summary>\n"
        "\n"
        "- `test_it.py::test_leaks`: float32[1024], 4.0 KiB, held by `test_it.CACHE['user-42']`\n"
        "\n"
        "</details>\n"
    )


def test_markdown_summary_appends_to_the_github_step_summary(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    summary = pytester.path / "step_summary.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    pytester.makepyfile(
        test_it="import pytest, torch\n@pytest.mark.vram_budget\ndef test_clean():\n    torch.ones(3)\n"
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert (
        summary.read_text() == "earlier step\n## vramleak: 1 checked test: 1 passed; none leaked or went over budget\n"
    )
    result.stdout.fnmatch_lines(["vramleak: wrote $GITHUB_STEP_SUMMARY (appended)"])
    pytester.makeini("[pytest]\nvramleak_markdown = ini.md\n")
    pytester.runpytest("-p", "no:cacheprovider")
    assert (pytester.path / "ini.md").exists()
    assert summary.read_text().count("## vramleak") == 1


def peak_suite(mebibytes: float) -> str:
    return f"""
import pytest, torch

@pytest.mark.vram_budget
def test_peak():
    scratch = torch.ones(int({mebibytes} * 1024 * 256))
    del scratch
"""


def test_save_then_compare_fails_peaks_grown_past_the_tolerance(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_it=peak_suite(4))
    pytester.runpytest("-p", "no:cacheprovider", "--vramleak-save=main").assert_outcomes(passed=1)
    saved = json.loads((pytester.path / ".vramleak" / "main.json").read_text())
    figures = saved["tests"]["test_it.py::test_peak"]
    end_bytes = figures.pop("end_bytes")  # every tensor storage alive in the process: varies with the run
    assert saved["version"] == 1 and isinstance(end_bytes, int)
    assert figures == {"device": "cpu", "peak_bytes": 4 * 1024**2, "leaked_bytes": 0}

    pytester.makepyfile(test_it=peak_suite(4.2))  # +5%: noise
    pytester.runpytest("-p", "no:cacheprovider", "--vramleak-compare=main").assert_outcomes(passed=1)

    pytester.makepyfile(test_it=peak_suite(8))
    result = pytester.runpytest("-p", "no:cacheprovider", "--vramleak-compare=main")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["peak on cpu grew from 4.0 MiB to 8.0 MiB, +4.0 MiB (+100%), allowed +10% and +64.0 KiB"]
    )
    pytester.runpytest(
        "-p", "no:cacheprovider", "--vramleak-compare=main", "--vramleak-max-increase=150%"
    ).assert_outcomes(passed=1)
    pytester.makeini("[pytest]\nvramleak_compare = main\nvramleak_max_increase = 5 MiB\n")
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--vramleak-compare=nothing"],
            "ERROR: --vramleak-compare: cannot read the saved run 'nothing' at */.vramleak/nothing.json: *",
        ),
        (["--vramleak-max-increase=lots"], "ERROR: --vramleak-max-increase: cannot read 'lots' as a size*"),
        (
            ["--vramleak-max-increase=1%, 2%, 3%"],
            "ERROR: --vramleak-max-increase: expected a percentage, a size or both*",
        ),
    ],
)
def test_bad_compare_options_are_usage_errors(pytester: pytest.Pytester, args: list[str], message: str) -> None:
    pytester.makepyfile(test_it="def test_it():\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_a_mode_the_test_leaves_entered_stays_and_the_site_recorder_leaves(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest, torch
        from torch.overrides import TorchFunctionMode

        class Counting(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                return func(*args, **(kwargs or {}))

        @pytest.mark.vram_budget
        def test_enters_a_mode_and_keeps_it():
            Counting().__enter__()
            torch.ones(2)

        def test_the_mode_is_still_there_and_alone():
            stack = torch.overrides._get_current_function_mode_stack()
            assert [type(mode).__name__ for mode in stack] == ["Counting"]
        """
    )
    import torch

    depth = len(torch.overrides._get_current_function_mode_stack())
    try:
        result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:randomly")
    finally:
        while len(torch.overrides._get_current_function_mode_stack()) > depth:
            torch.overrides._pop_mode()  # the test's own mode, which it never left
    result.assert_outcomes(passed=2)


@pytest.mark.parametrize("options", [(), ("--vramleak-save=base",)], ids=["peak budget", "save"])
def test_a_test_that_runs_its_own_profiler_gets_no_peak(
    pytester: pytest.Pytester, run_checked, options: tuple[str, ...]
) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest, torch

        @pytest.mark.vram_budget("1 MiB")
        def test_profiles():
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as profiler:
                torch.ones(1024).sum()
            assert profiler.key_averages()

        @pytest.mark.vram_budget("1 MiB")
        def test_profiles_with_the_autograd_profiler():
            with torch.autograd.profiler.profile(profile_memory=True):
                torch.ones(1024).sum()

        @pytest.mark.vram_budget("1 MiB")
        def test_after():
            torch.ones(1024).sum()
        """
    )
    result, report = run_checked("-p", "no:randomly", *options)
    result.assert_outcomes(passed=3)
    assert report["test_profiles"]["peak_bytes"] is None
    assert report["test_profiles_with_the_autograd_profiler"]["peak_bytes"] is None
    assert report["test_after"]["peak_bytes"] is not None  # the plugin's own profiler works again


def test_a_default_leak_budget_for_tests_checked_by_vramleak(pytester: pytest.Pytester, run_checked) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest, torch
        CACHE = {}

        def test_caches_a_result():
            CACHE["mean"] = torch.ones(4)  # 16 B kept, as a metric caches compute()

        def test_leaks():
            CACHE["features"] = torch.ones(1024)

        @pytest.mark.vram_budget  # its own marker: no leak allowed
        def test_marked():
            CACHE["marked"] = torch.ones(4)
        """
    )
    # Every leak past the budget fails (--vramleak-fail-on=any): the budget decides alone.
    result, report = run_checked("-p", "no:randomly", "--vramleak", "--vramleak-leak=64 B", "--vramleak-fail-on=any")
    assert {name: entry["verdict"] for name, entry in report.items()} == {
        "test_caches_a_result": "passed",
        "test_leaks": "leaked",
        "test_marked": "leaked",
    }
    assert report["test_caches_a_result"]["budget"] == {"peak": None, "leak": 64}
    pytester.makeini("[pytest]\nvramleak = true\nvramleak_leak = 8 KiB\nvramleak_fail_on = any\n")
    result, report = run_checked("-p", "no:randomly")
    assert report["test_leaks"]["verdict"] == "passed"
    # By default a test without a marker fails for memory kept once only from the floor on.
    pytester.makeini("[pytest]\nvramleak = true\n")
    result, report = run_checked("-p", "no:randomly", "--vramleak-leak=64 B")
    assert (report["test_leaks"]["verdict"], report["test_leaks"]["pattern"]) == ("passed", "kept_once")


def test_the_headline_agrees_with_the_tensors_listed(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest, torch
        TABLE = {"old": torch.ones(64)}

        @pytest.mark.vram_budget
        def test_replaces_and_adds():
            TABLE["old"] = torch.ones(64)  # 256 B made, 256 B of older memory freed
            TABLE["new"] = torch.ones(4)  # 16 B more
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(
        [
            "leaked 16 B on cpu, allowed 0 B (272 B made and still alive, 256 B of older memory freed)",
            "*",
            "leaked tensors:",
            "float32[[]64] on cpu: 1 tensor, 256 B",
            "*",
            "float32[[]4] on cpu: 1 tensor, 16 B",
        ]
    )


def test_memory_left_to_the_cycle_collector_is_noted_when_it_matters(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        class Node:
            pass

        def make_cycle(size):
            import torch
            node = Node()
            node.me = node
            node.payload = torch.ones(size)

        def test_small():
            make_cycle(4)

        def test_large():
            make_cycle(1024 * 1024)
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "--vramleak")
    result.stdout.fnmatch_lines(["test_it.py::test_large: 4.0 MiB lived in reference cycles until garbage collection*"])
    result.stdout.no_fnmatch_line("*test_small*reference cycles*")
    result = pytester.runpytest("-p", "no:cacheprovider", "--vramleak", "-v")
    result.stdout.fnmatch_lines(["test_it.py::test_small: 16 B lived in reference cycles until garbage collection*"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("--vramleak-max-increase=nan%",),
            "--vramleak-max-increase: the percentage must be a finite number, got 'nan%'",
        ),
        (
            ("--vramleak-max-increase=inf%",),
            "--vramleak-max-increase: the percentage must be a finite number, got 'inf%'",
        ),
        (
            ("--vramleak-device=cuda:\u00b2",),
            "--vramleak-device: unknown device 'cuda:\u00b2'; expected auto|cpu|cuda|cuda:N|mps|xpu",
        ),
        (
            ("--vramleak-save=../../x",),
            "--vramleak-save: a saved run's name is letters, digits, '_', '-' and '.' (kept in .vramleak/), got '../../x'",
        ),
        (("--vramleak-report=",), "--vramleak-report: the report's path is empty"),
        (("--vramleak-leak=lots",), "--vramleak-leak: cannot read 'lots' as a size*"),
    ],
)
def test_bad_values_are_usage_errors_naming_their_source(
    pytester: pytest.Pytester, args: tuple[str, ...], message: str
) -> None:
    pytester.makepyfile(test_it="def test_it():\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message.replace('[', '[[]')}"])
    assert not (pytester.path.parent / "x.json").exists() and not (pytester.path / ".vramleak").exists()


def test_a_bad_switch_in_the_ini_file_names_its_key(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nvramleak = maybe\n")
    pytester.makepyfile(test_it="def test_it():\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: ini option vramleak: expected true or false, got 'maybe'"])


def test_a_test_reported_twice_is_summarised_once(pytester: pytest.Pytester) -> None:
    # What a rerun plugin does: run a test's protocol again and report it again.
    pytester.makeconftest(
        """
        from _pytest.runner import runtestprotocol

        def pytest_runtest_protocol(item, nextitem):
            for _ in range(2):
                item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
                runtestprotocol(item, nextitem=nextitem)
                item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
            return True
        """
    )
    pytester.makepyfile(
        test_it="""
        import pytest, torch
        CACHE = []

        @pytest.mark.vram_budget
        def test_leaks():
            CACHE.append(torch.ones(1024))
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.stdout.str().count("  test_it.py::test_leaks (cpu)") == 1


def test_the_markdown_table_survives_any_test_id(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest, torch
        CACHE = []

        @pytest.mark.vram_budget
        @pytest.mark.parametrize("text", ["a|b", "tick`tock", "two\\nlines"])
        def test_leaks(text):
            CACHE.append(torch.ones(1024))
        """
    )
    path = pytester.path / "summary.md"
    pytester.runpytest("-p", "no:cacheprovider", f"--vramleak-markdown={path}")
    rows = [line for line in path.read_text().splitlines() if line.startswith("| ") and "test_leaks" in line]
    assert len(rows) == 3
    for row in rows:  # six cells each: the id's own '|' is escaped, its backtick fenced, its newline gone
        assert len([cell for cell in re.split(r"(?<!\\)\|", row)[1:-1]]) == 6, row


def test_an_interrupted_run_keeps_the_saved_run(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest, torch

        @pytest.mark.vram_budget("1 MiB")
        def test_first():
            torch.ones(1024).sum()

        def test_interrupted():
            raise KeyboardInterrupt
        """
    )
    saved = pytester.path / ".vramleak" / "base.json"
    saved.parent.mkdir()
    saved.write_text('{"version": 1, "tests": {}}\n')
    # In a process of its own: the interruption would stop this run too.
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly", "--vramleak-save=base")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    assert saved.read_text() == '{"version": 1, "tests": {}}\n'
    result.stdout.fnmatch_lines(["vramleak: the run was interrupted: the saved run 'base' was left as it was"])


def test_a_tensor_subclass_is_named(pytester: pytest.Pytester, run_checked) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest, torch

        class Quantity(torch.Tensor):
            pass

        KEPT = []

        @pytest.mark.vram_budget
        def test_it():
            KEPT.append(torch.ones(8).as_subclass(Quantity))
            KEPT.append(torch.nn.Parameter(torch.ones(4)))
        """
    )
    result, report = run_checked()
    result.stdout.fnmatch_lines(
        ["float32[[]8] Quantity on cpu: 1 tensor, 32 B", "*", "float32[[]4] Parameter on cpu: 1 tensor, 16 B"]
    )
    assert sorted(group["class"] for group in report["test_it"]["tensors"]) == ["Parameter", "Quantity"]


def test_a_named_leak_is_freed_as_soon_as_the_user_drops_it(pytester: pytest.Pytester) -> None:
    # Naming holders must leave no reference to the tensors behind, not even in cyclic garbage.
    pytester.makepyfile(
        test_it="""
        import weakref
        import torch

        class Holder:
            value = None

        def test_leaks():
            Holder.value = torch.ones(2)

        def test_drops_it():
            ref = weakref.ref(Holder.value)
            Holder.value = None
            assert ref() is None
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:randomly", "--vramleak", "--vramleak-fail-on=any")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["LEAKED test_it.py::test_leaks - *"])

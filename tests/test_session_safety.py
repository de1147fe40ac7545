"""The plugin in a user's session: an absent device or torch, its own errors, no warnings and no
reference kept, turning it off, a test's own modes and profilers, a test reported twice."""

from __future__ import annotations

import json

import pytest
import torch


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


ENGINE = (
    "pytest_vramleak.check",
    "pytest_vramleak.holders.snapshot",
    "pytest_vramleak.plugin.runs",
    "pytest_vramleak.readings",
    "pytest_vramleak.reporting.html_report",
    "pytest_vramleak.steps",
    "pytest_vramleak.tracking.tracker",
)
"""Modules of the engine: a run that checks no test does not load them."""

LOADED = """
import json, sys

def pytest_unconfigure(config):
    with open("loaded.json", "w") as stream:
        json.dump(sorted(name for name in sys.modules if name.startswith("pytest_vramleak")), stream)
"""


@pytest.mark.parametrize("checks", ["none", "a marked test", "the fixture", "the fixture by name"])
def test_a_run_that_checks_nothing_loads_only_the_pytest_layer(pytester: pytest.Pytester, checks: str) -> None:
    # pytest loads the plugin in every run of an environment it is installed in; where Python
    # writes no byte-code (PYTHONDONTWRITEBYTECODE), pytest compiles each module it loads afresh.
    pytester.makeconftest(LOADED)
    body = {
        "none": "def test_it():\n    torch.ones(8)\n",
        "a marked test": "@pytest.mark.vram_budget\ndef test_it():\n    KEPT.append(torch.ones(1024))\n",
        "the fixture": "def test_it(vramleak):\n    for step in vramleak.steps(6):\n        KEPT.append(torch.ones(1024))\n",
        "the fixture by name": (  # (collection planned no check: the fixture loads the engine)
            "def test_it(request):\n    vramleak = request.getfixturevalue('vramleak')\n"
            "    for step in vramleak.steps(6):\n        KEPT.append(torch.ones(1024))\n"
        ),
    }[checks]
    pytester.makepyfile(test_it="import pytest, torch\nKEPT = []\n" + body)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    loaded = set(json.loads((pytester.path / "loaded.json").read_text()))
    if checks == "none":
        result.assert_outcomes(passed=1)
        assert loaded.isdisjoint(ENGINE), sorted(loaded & set(ENGINE))
    else:  # the engine loads as the first test is checked, and finds the leak
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines(["*held by test_it.KEPT[[]*]*"])
        assert {"pytest_vramleak.check", "pytest_vramleak.tracking.tracker"} <= loaded


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


def test_a_leak_under_pytest_rerunfailures_is_judged_on_its_run_and_not_run_again(pytester: pytest.Pytester) -> None:
    pytest.importorskip("pytest_rerunfailures")
    pytester.makepyfile(
        test_it="""
        import pytest, torch
        CACHE = []

        @pytest.mark.vram_budget
        def test_leaks():
            CACHE.append(torch.ones(1024))

        @pytest.mark.vram_budget
        def test_clean():
            torch.ones(1024).sum()
        """
    )
    report_path = pytester.path / "r.json"
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "-p", "no:randomly", "--reruns", "1", f"--vramleak-report={report_path}"
    )
    # The leak fails its run as it tears down, and is reported failed without a run again: memory
    # kept once would leave nothing a second time, and the test would pass.
    outcomes = result.parseoutcomes()
    assert outcomes["failed"] == 1 and "rerun" not in outcomes, outcomes
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    output = result.stdout.str()
    assert "LEAKED test_it.py::test_leaks - VramLeak: leaked 4.0 KiB on cpu, allowed 0 B" in output
    assert "held by test_it.CACHE[0]" in output  # the one run, its tensor the first
    records = {record["nodeid"].rsplit("::", 1)[1]: record for record in json.loads(report_path.read_text())["tests"]}
    assert records["test_leaks"]["verdict"] == "leaked" and records["test_clean"]["verdict"] == "passed"


def test_memory_kept_once_under_pytest_rerunfailures_fails_and_a_flaky_failure_still_runs_again(
    pytester: pytest.Pytester,
) -> None:
    pytest.importorskip("pytest_rerunfailures")
    pytester.makepyfile(
        test_it="""
        import pytest, torch

        @pytest.fixture(scope="module")
        def model():
            return torch.nn.Linear(1024, 1024)

        def test_leaves_gradients(model):
            model(torch.ones(4, 1024)).sum().backward()  # kept once: later runs add to the same .grad

        RUNS = []

        def test_flaky():
            RUNS.append(1)
            assert len(RUNS) > 1
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:randomly", "--reruns", "2", "--vramleak")
    outcomes = result.parseoutcomes()
    # (the leak's passing call counts as passed beside its failing teardown, as pytest counts them
    # where another plugin runs a test's phases; the flaky test ran again once, then passed)
    assert (outcomes["failed"], outcomes["passed"], outcomes["rerun"]) == (1, 2, 1), outcomes
    result.stdout.fnmatch_lines(["LEAKED test_it.py::test_leaves_gradients - VramLeak: kept 4.0 MiB on cpu*"])


def test_a_fault_of_the_plugins_own_ends_its_check_and_the_session_goes_on(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        """
        from pytest_vramleak.plugin import runs

        def _broken(*args, **kwargs):
            raise RuntimeError("boom")

        runs._name_kept = _broken  # (naming what the runs of a growing leak keep)
        """
    )
    pytester.makepyfile(
        test_it="""
        import torch
        CACHE = []

        def test_leaks():
            CACHE.append(torch.ones(1024, 1024))

        def test_after():
            torch.ones(4).sum()
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly", "--vramleak")
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    result.assert_outcomes(passed=2)  # the test keeps its own outcome, and the next one runs
    result.stdout.fnmatch_lines(
        [
            "2 checked tests: 2 passed; none leaked or went over budget, 1 unchecked",
            "test_it.py::test_leaks: undecided: vramleak failed (a fault of its own, to report with this line) "
            "while naming what holds the memory the runs kept: RuntimeError: boom; memory left after each run so "
            "far: 4.0 MiB, 8.0 MiB, 12.0 MiB, 16.0 MiB",
        ]
    )


def test_a_gc_callback_of_the_suites_is_not_run_by_the_plugins_own_collections(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import gc
        import torch
        LOG = []

        def _on_gc(phase, info):
            if phase == "stop":
                LOG.append(torch.ones(16))

        def test_installs_a_callback():
            gc.callbacks.append(_on_gc)

        def test_empty():
            pass

        def test_clean():
            torch.ones(4).sum()

        def test_the_callback_still_runs():
            before = len(LOG)
            gc.collect()
            assert len(LOG) == before + 1
            gc.callbacks.remove(_on_gc)
        """
    )
    # each of the plugin's collections ran the callback, which allocated: every test grew
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:randomly", "--vramleak")
    result.assert_outcomes(passed=4)


def test_a_test_running_an_in_process_pytest_session_is_not_failed_for_its_garbage(pytester: pytest.Pytester) -> None:
    # The inner session checks its own leaking test, thawing and freezing the heap for its holder
    # search; its tensors, kept by pytester's records until the outer test ends, are garbage after.
    pytester.makepyfile(
        test_outer='''
        import torch

        pytest_plugins = ["pytester"]

        def test_runs_an_inner_session(pytester):
            pytester.makepyfile(test_inner="""
        import torch
        KEEP = []
        def test_keeps():
            KEEP.append(torch.ones(500_000))
        """)
            pytester.runpytest_inprocess("--vramleak").assert_outcomes(failed=1)
        '''
    )
    # In a process of its own: pytester within pytester's inline run would share one heap with the suite.
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "no:randomly", "--vramleak", "--vramleak-report=r.json"
    )
    result.assert_outcomes(passed=1)
    result.stdout.no_fnmatch_line("*C++ caches*")
    test = json.loads((pytester.path / "r.json").read_text())["tests"][0]
    assert test["verdict"] == "passed"
    assert test["notes"] == [
        "9.5 MiB the runs left was freed by a full collection after them: the in-process pytest sessions the test ran "
        "through pytester kept their tensors until it ended, and left them as garbage that the checks' collections "
        "could not reach: not counted"
    ]


def test_a_thread_an_earlier_test_started_charges_that_test_not_the_later_ones(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import threading, time
        import torch

        BUFFER = []
        STOP = threading.Event()

        def _feed():
            while not STOP.is_set():
                BUFFER.append(torch.ones(25_000))
                time.sleep(0.01)

        def test_starts_a_feeder():
            if not any(thread.name == "feeder" for thread in threading.enumerate()):
                threading.Thread(target=_feed, daemon=True, name="feeder").start()
            time.sleep(0.05)

        def test_clean_one():
            time.sleep(0.05)

        def test_clean_two():
            time.sleep(0.05)
        """
    )
    # In a process of its own: the thread allocates until the process ends.
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "no:randomly", "--vramleak", "--vramleak-report=r.json"
    )  # fmt: skip
    result.assert_outcomes(failed=1, passed=2)
    result.stdout.fnmatch_lines(["LEAKED test_it.py::test_starts_a_feeder - VramLeak: memory grew *"])
    tests = {
        test["nodeid"].rsplit("::", 1)[1]: test for test in json.loads((pytester.path / "r.json").read_text())["tests"]
    }
    for name in ("test_clean_one", "test_clean_two"):
        assert tests[name]["verdict"] == "passed", tests[name]
        assert tests[name]["tensors"] == []
        assert [note.split(" ", 2)[2] for note in tests[name]["notes"]] == [
            "made by thread 'feeder', which test_it.py::test_starts_a_feeder started, running since before this test "
            "began (the memory is the test's that started it): not counted"
        ]


@pytest.mark.skipif(
    not hasattr(torch._C._autograd.SavedTensor, "unpack_hook"), reason="this torch cannot read a packed tensor"
)
def test_reading_a_kept_graph_never_calls_its_saved_tensors_unpack_hooks(pytester: pytest.Pytester) -> None:
    # the unpack hook of torch.utils.checkpoint recomputes the region's forward pass, and keeps what it made
    pytester.makepyfile(
        test_it="""
        import torch
        from torch.utils.checkpoint import checkpoint

        KEPT = []
        UNPACKED = []
        RECOMPUTED = []

        def block(x):
            RECOMPUTED.append(1)
            return torch.relu(x @ x.T)

        def unpack(tensor):
            UNPACKED.append(1)
            return tensor

        def test_keeps_graphs_under_hooks():
            weight = torch.ones(64, 64, requires_grad=True)
            with torch.autograd.graph.saved_tensors_hooks(lambda t: t.detach(), unpack):
                KEPT.append(weight.exp().sum())
            KEPT.append(checkpoint(block, weight, use_reentrant=False).sum())

        def test_no_hook_ran_and_no_region_was_recomputed():
            assert UNPACKED == []
            assert len(RECOMPUTED) == len(KEPT) // 2
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:randomly", "--vramleak")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*LEAKED test_it.py::test_keeps_graphs_under_hooks*"])

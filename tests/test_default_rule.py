"""The default verdict of `pytest --vramleak`: a test that kept memory runs again, and fails when
its memory (or autograd history) grows, or when what it keeps once reaches the floor; every leak
says where it was made; a run again never becomes the user's failure; a test is counted once."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ElementTree

import pytest

from .conftest import read_report

KEPT_AND_GROWING = """
import pytest, torch

KEPT = []
TABLE = {}


class Metric:
    def __init__(self):
        self._computed = None

    def compute(self):
        if self._computed is None:  # cached on first use, as torchmetrics does
            self._computed = torch.ones(2)
        return self._computed


@pytest.mark.parametrize("metric", [Metric()])
def test_caches_a_result(metric):
    metric.compute()


def test_appends_every_call():
    KEPT.append(torch.ones(256))  # grows


def test_builds_a_big_table_once():
    if "table" not in TABLE:
        TABLE["table"] = torch.ones(1024, 512)  # 2 MiB, kept once


def test_clean():
    torch.ones(1024).sum()
"""


def test_only_growth_and_memory_kept_once_from_the_floor_fail_by_default(
    pytester: pytest.Pytester, run_checked
) -> None:
    pytester.makepyfile(test_it=KEPT_AND_GROWING)
    result, report = run_checked("-p", "no:randomly", "--vramleak")
    result.assert_outcomes(passed=2, failed=2)
    outcomes = {name: (entry["verdict"], entry["pattern"], entry["rule"]) for name, entry in report.items()}
    assert outcomes == {
        "test_caches_a_result[metric0]": ("passed", "kept_once", "significant"),
        "test_appends_every_call": ("leaked", "grows", "significant"),
        "test_builds_a_big_table_once": ("leaked", "kept_once", "significant"),
        "test_clean": ("passed", None, "significant"),
    }
    result.stdout.fnmatch_lines(
        [
            "*_ test_appends_every_call _*",
            "memory grew 1.0 KiB per run of the test over 3 measured runs on cpu, tolerance 0 B",
            "*",
            # one more run recorded where the tensors are made: its tensor, at the list's 5th place
            "tensors left by run 5, which recorded where tensors are made after the 4 above:",
            "float32[[]256] on cpu: 1 tensor, 1.0 KiB",
            "    allocated at test_it.py:23 in test_appends_every_call()",
            "    held by test_it.KEPT[[]4[]]",
        ]
    )
    assert report["test_appends_every_call"]["tensors_from"] == (
        "run 5, which recorded where tensors are made after the 4 above"
    )
    result.stdout.fnmatch_lines(
        [
            "*_ test_builds_a_big_table_once _*",
            "kept 2.0 MiB on cpu that it did not let go: memory a test keeps once fails from 1.0 MiB on (--vramleak-kept-floor)",
            "*",
            "leaked tensors:",
            "float32[[]1024, 512] on cpu: 1 tensor, 2.0 MiB",
            "    held by test_it.TABLE[[]'table']",
            # the table is made by the first run only: the run that records sites does not make it
            "allocated at: not recorded: the run that records where tensors are made made none of these*",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "memory kept once, not growing (passed: below --vramleak-kept-floor):",
            "*8 B  test_it.py::test_caches_a_result[[]metric0[]] (cpu, kept once)",
        ]
    )
    # A floor of 4 MiB lets the table pass; growth fails at any size.
    result, report = run_checked("-p", "no:randomly", "--vramleak", "--vramleak-kept-floor=4MiB")
    assert report["test_builds_a_big_table_once"]["verdict"] == "passed"
    assert report["test_appends_every_call"]["verdict"] == "leaked"


def test_fail_on_any_restores_strict_single_run_verdicts(pytester: pytest.Pytester, run_checked) -> None:
    pytester.makepyfile(test_it=KEPT_AND_GROWING)
    result, report = run_checked("-p", "no:randomly", "--vramleak", "--vramleak-fail-on=any")
    result.assert_outcomes(passed=1, failed=3)
    result.stdout.fnmatch_lines(["LEAKED test_it.py::test_caches_a_result[[]metric0[]] - VramLeak: leaked 8 B on cp*"])
    assert report["test_caches_a_result[metric0]"]["rule"] == "any"


def test_a_marker_keeps_its_explicit_budget(pytester: pytest.Pytester, run_checked) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest, torch
        CACHE = {}

        @pytest.mark.vram_budget
        def test_keeps_a_little():
            CACHE["mean"] = torch.ones(4)

        @pytest.mark.vram_budget(leak="1 KiB")
        def test_keeps_a_little_within_its_budget():
            CACHE["std"] = torch.ones(4)
        """
    )
    result, report = run_checked("-p", "no:randomly", "--vramleak")
    result.assert_outcomes(passed=1, failed=1)
    assert (report["test_keeps_a_little"]["verdict"], report["test_keeps_a_little"]["rule"]) == ("leaked", "any")
    result.stdout.fnmatch_lines(["LEAKED test_it.py::test_keeps_a_little - VramLeak: leaked 16 B on*"])


def test_only_tests_that_kept_memory_run_again(pytester: pytest.Pytester, run_checked) -> None:
    pytester.makepyfile(
        test_it="""
        import torch
        RUNS = {"clean": 0, "leaks": 0}
        KEPT = []

        def test_clean():
            RUNS["clean"] += 1
            torch.ones(64).sum()

        def test_leaks():
            RUNS["leaks"] += 1
            KEPT.append(torch.ones(64))

        def test_counts():
            # the leaking test ran 1 + 3 times, and once more recording where its tensors are made
            assert RUNS == {"clean": 1, "leaks": 5}
        """
    )
    result, report = run_checked("-p", "no:randomly", "--vramleak")
    result.assert_outcomes(passed=2, failed=1)
    assert report["test_clean"]["repetitions"] is None
    assert report["test_leaks"]["repetitions"] == [256, 512, 768, 1024]


def test_a_run_again_never_becomes_the_users_failure(pytester: pytest.Pytester, run_checked) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest, torch
        CALLS = []

        def test_counts_its_calls():
            CALLS.append(torch.ones(256))
            assert len(CALLS) == 1, f"called {len(CALLS)} times"

        BUDGETED = []

        @pytest.mark.vram_budget
        def test_counts_its_calls_under_a_budget():
            BUDGETED.append(torch.ones(256))
            assert len(BUDGETED) == 1, f"called {len(BUDGETED)} times"
        """
    )
    result, report = run_checked("-p", "no:randomly", "--vramleak")
    result.stdout.no_fnmatch_line(">*assert len(*")  # no traceback of a run again
    # What its first run kept (1 KiB, below the floor) only runs again could judge, and they could
    # not be used: undecided, not passed, and the summary says why.
    entry = report["test_counts_its_calls"]
    assert (entry["verdict"], entry["pattern"]) == ("unchecked", None)
    assert entry["reason"].startswith(
        "undecided: the first run kept 1.0 KiB, and the runs again that tell growth from memory kept once could not "
        "be used: run 2 of 4 failed in call (AssertionError: called 2 times"
    )
    result.stdout.fnmatch_lines(["test_it.py::test_counts_its_calls: undecided: the first run kept 1.0 KiB*"])
    # Under a budget the first run's leak fails, as for a test run once, with the same line.
    entry = report["test_counts_its_calls_under_a_budget"]
    assert entry["verdict"] == "leaked"
    result.stdout.fnmatch_lines(
        [
            "leaked 1.0 KiB on cpu, allowed 0 B",
            "*",
            "float32[[]256] on cpu: 1 tensor, 1.0 KiB",
            "    held by test_it.BUDGETED[[]0]",
            "ran 2 times; memory left by the first run, above its start: 1.0 KiB",
            "the runs after the first were not used: run 2 of 4 failed in call (AssertionError: called 2 times*); judged on the first run",
        ]
    )
    result.assert_outcomes(passed=1, failed=1)


def test_doctests_are_not_run_again(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        helpers='''
        import torch
        KEPT = []

        def keep():
            """
            >>> import helpers, torch
            >>> table = torch.ones(256)
            >>> helpers.KEPT.append(table)
            """
        '''
    )
    path = pytester.path / "r.json"
    for extra in ([], ["--vramleak-repeat=4"]):
        result = pytester.runpytest(
            "-p", "no:cacheprovider", "--doctest-modules", "--vramleak", f"--vramleak-report={path}", *extra
        )
        result.stdout.no_fnmatch_line("*NameError*")
        result.assert_outcomes(passed=1)
        (entry,) = json.loads(path.read_text())["tests"]
        assert "doctests are not run again (doctest clears a doctest's globals after it runs)" in entry["notes"]


def test_what_a_fixture_puts_in_doctest_namespace_is_named_with_the_entry_to_delete(pytester: pytest.Pytester) -> None:
    # abalkin/pytest-leaks#34: an autouse fixture that fills doctest_namespace for every test
    pytester.makeconftest(
        """
        import pytest, torch

        @pytest.fixture(autouse=True)
        def add_model(doctest_namespace):
            doctest_namespace["model"] = torch.nn.Linear(1024, 1024)
        """
    )
    pytester.makepyfile(
        helpers='''
        def describe(m):
            """
            >>> describe(model)
            (1024, 1024)
            """
            return tuple(m.weight.shape)
        '''
    )
    pytester.makepyfile(test_after="def test_after():\n    pass\n")  # (the doctest is not the session's last)
    result = pytester.runpytest("-p", "no:cacheprovider", "--doctest-modules", "--vramleak")
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(
        [
            "    held by fixture 'doctest_namespace' (session scope)[[]'model'[]].weight",
            "    diagnosis: doctest_namespace is pytest's own session-scoped dict of the names doctests see*have that "
            "fixture yield, then delete what it put there (del doctest_namespace[[]'model'[]])",
        ]
    )


@pytest.mark.parametrize("reset_as_each_test_sets_up", [True, False])
def test_what_the_suite_frees_as_the_next_test_sets_up_is_not_kept(
    pytester: pytest.Pytester, reset_as_each_test_sets_up: bool
) -> None:
    # pyro's conftest clears its parameter store as each test sets up, not as it tears down
    pytester.syspathinsert()
    pytester.makepyfile(store="STORE = {}\n")
    hook = "def pytest_runtest_setup(item):\n    store.STORE.clear()\n" if reset_as_each_test_sets_up else ""
    pytester.makeconftest("import store\n\n\n" + hook)
    pytester.makepyfile(
        test_it="""
        import torch
        import store

        def test_fills_the_store():
            store.STORE["w"] = torch.ones(1024, 512)

        def test_after():
            pass
        """
    )
    path = pytester.path / "r.json"
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "-p", "no:randomly", "--vramleak", f"--vramleak-report={path}"
    )
    records = {record["nodeid"].rsplit("::", 1)[1]: record for record in json.loads(path.read_text())["tests"]}
    record = records["test_fills_the_store"]
    if not reset_as_each_test_sets_up:  # kept until the session ends: kept once, over the floor
        result.assert_outcomes(failed=1, passed=1)
        assert record["verdict"] == "leaked" and record["pattern"] == "kept_once"
        return
    result.assert_outcomes(passed=2)
    assert record["verdict"] == "passed"
    assert any(
        note.startswith("2.0 MiB that the first run kept was freed as the next run set up") for note in record["notes"]
    ), record["notes"]


def test_what_the_suite_frees_of_the_last_test_as_a_test_sets_up_hides_none_of_its_leak(
    pytester: pytest.Pytester,
) -> None:
    # pyro's conftest clears its parameter store as each test sets up: the last test's parameters,
    # freed after the check began, offset what the test kept
    pytester.syspathinsert()
    pytester.makepyfile(store="STORE = {}\n")
    pytester.makeconftest("import store\n\n\ndef pytest_runtest_setup(item):\n    store.STORE.clear()\n")
    pytester.makepyfile(
        test_it="""
        import torch
        import store

        GROWING = []

        def test_earlier():
            store.STORE["a"] = torch.ones(1024)

        def test_grows():
            GROWING.append(torch.ones(256))
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:randomly", "--vramleak")
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(["LEAKED test_it.py::test_grows - VramLeak: memory grew 1.0 KiB per run*"])


def test_a_leaking_test_is_counted_once(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest, torch
        KEPT = []

        def test_leaks():
            KEPT.append(torch.ones(256))
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "--vramleak", "-rA", "--junitxml=junit.xml")
    result.assert_outcomes(failed=1)
    assert result.stdout.str().count("test_it.py::test_leaks") == 2  # the summary's leak list, -rA
    result.stdout.no_fnmatch_line("PASSED test_it.py::test_leaks*")
    suite = ElementTree.parse(pytester.path / "junit.xml").getroot().find("testsuite")
    assert suite is not None
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("1", "1", "0")
    # --lf runs it again: pytest's cache knows it failed.
    pytester.runpytest("-p", "no:randomly", "--vramleak")
    again = pytester.runpytest("--lf", "--vramleak")
    again.stdout.fnmatch_lines(["run-last-failure: rerun previous 1 failure*"])


def test_a_module_fixture_torn_down_after_the_last_test_does_not_hide_its_leak(
    pytester: pytest.Pytester, run_checked
) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest, torch
        KEPT = []

        @pytest.fixture(scope="module")
        def table():
            table = [torch.ones(16384)]  # 64 KiB, freed as the module's fixtures are torn down
            yield table
            table.clear()

        @pytest.mark.vram_budget
        def test_first(table):
            pass

        @pytest.mark.vram_budget
        def test_last_leaks(table):
            KEPT.append(torch.ones(4096))  # 16 KiB
        """
    )
    result, report = run_checked("-p", "no:randomly")
    assert (report["test_last_leaks"]["verdict"], report["test_last_leaks"]["leaked_bytes"]) == ("leaked", 16384)
    assert report["test_first"]["verdict"] == "passed"


TRACES_A_LOSS = """
import pytest, torch
import torch.nn.functional as F
KEPT = []

def nll(a, b, v):
    return F.gaussian_nll_loss(a, b, v)  # torch's code makes two float64 scalars the trace keeps in C++

@pytest.mark.parametrize("case", {cases})
def test_traces(case):
    args = (torch.randn(3), torch.randn(3), torch.ones(3))
    if case == "kept":  # the same storages, held from Python: the test's own leak
        KEPT.extend([torch.tensor(1.0, dtype=torch.float64), torch.tensor(2.0, dtype=torch.float64)])
    else:
        torch.jit.trace(nll, args)(*args)
"""


def test_memory_only_pytorch_keeps_is_named_as_pytorchs_and_set_aside(pytester: pytest.Pytester, run_checked) -> None:
    # Tracing keeps, in C++, the constants torch's own code made while it traced: PyTorch's
    # memory, a little more each run, nothing the test can free.
    pytester.makepyfile(test_it=TRACES_A_LOSS.format(cases=["traced"]))
    result, report = run_checked("-p", "no:randomly", "--vramleak", "-W", "ignore")
    entry = report["test_traces[traced]"]
    assert entry["verdict"] == "passed", result.stdout.str()
    assert entry["repetitions"] == [0, 0, 0, 0]  # less what was set aside: 16 B a run
    assert entry["notes"] == [
        "80 B held by PyTorch itself in C++: nothing in Python refers to it, so nothing the test can free (--vramleak-fail-on=any counts it): not counted"
    ]
    result, report = run_checked("-p", "no:randomly", "--vramleak", "--vramleak-fail-on=any", "-W", "ignore")
    assert report["test_traces[traced]"]["verdict"] == "leaked"


def test_a_parametrized_case_keeping_what_an_earlier_case_showed_is_pytorchs_is_not_run_again(
    pytester: pytest.Pytester, run_checked
) -> None:
    pytester.makepyfile(test_it=TRACES_A_LOSS.format(cases=["traced", "kept", "traced again"]))
    result, report = run_checked("-p", "no:randomly", "--vramleak", "-W", "ignore")
    assert report["test_traces[traced]"]["repetitions"] == [0, 0, 0, 0]
    again = report["test_traces[traced again]"]
    assert (again["verdict"], again["leaked_bytes"], again["repetitions"]) == ("passed", 0, None)  # run once
    assert again["notes"] == [
        "16 B held by PyTorch itself in C++, as the runs of test_it.py::test_traces[traced] showed for the same storages "
        "(nothing in Python refers to them; this case was not run again; --vramleak-fail-on=any counts it): not counted"
    ]
    # Storages of the same sizes that Python holds are the case's own leak, judged in full.
    kept = report["test_traces[kept]"]
    assert (kept["verdict"], kept["repetitions"]) == ("leaked", [16, 32, 48, 64]), result.stdout.str()
    assert [holder.rstrip("0123456789]") for holder in kept["tensors"][0]["held_by"]] == ["test_it.KEPT["] * 2


def test_ids_in_the_summary_paste_back_from_where_pytest_ran(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\n")  # the rootdir: the folder above the tests
    tests = pytester.mkdir("tests")
    (tests / "test_it.py").write_text(
        "import torch\nKEPT = []\n\ndef test_leaks():\n    KEPT.append(torch.ones(256))\n"
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tests)
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--vramleak", "test_it.py")
    result.stdout.fnmatch_lines(["largest leaks:", "*1.0 KiB  test_it.py::test_leaks (cpu, grows)"])
    result.stdout.no_fnmatch_line("*tests/test_it.py::test_leaks (cpu*")


@pytest.mark.parametrize(
    ("keep", "view"),
    [
        ("out.detach()", "detach"),
        ("out[:4]", "slice"),
        ("out.view(-1)", "view"),
        ("out[:1].expand(8, 64)", "expand"),
    ],
)
def test_the_storages_allocation_comes_before_where_the_kept_view_was_made(
    pytester: pytest.Pytester, keep: str, view: str
) -> None:
    pytester.makepyfile(
        test_it=f"""
        import torch
        KEPT = []

        def remember(out):
            KEPT.append({keep})  # the view

        def test_keeps_a_view():
            out = torch.ones(8, 64)  # the storage
            remember(out)
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "--vramleak")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "    allocated at test_it.py:8 in test_keeps_a_view()",
            "        kept through a view made at test_it.py:5 in remember(), called from test_it.py:9 in test_keeps_a_view()",
        ]
    )


def test_the_figures_add_up_for_a_replaced_object_on_a_cycle(pytester: pytest.Pytester, run_checked) -> None:
    # Each run replaces an object on a reference cycle: the one it replaced is freed only by a full
    # collection, and counts as freed by the run that let it go. Kept once, like its acyclic twin.
    pytester.makepyfile(
        test_it="""
        import torch

        class Writer:
            pass

        def test_replace_cyclic():
            h = Writer()
            h.me = h
            h.t = torch.randn(256)
            Writer.last = h

        class Plain:
            pass

        def test_replace_acyclic():
            h = Plain()
            h.t = torch.randn(256)
            Plain.last = h
        """
    )
    result, report = run_checked("-p", "no:randomly", "--vramleak", "--vramleak-confirm=3", "--vramleak-fail-on=growth")
    result.assert_outcomes(passed=2)
    # Re-runs stop once two in a row add nothing: the acyclic twin's do at once; the cyclic one's
    # each seem to add 1 KiB until the collection that confirms the runs credits them.
    runs = {"test_replace_cyclic": 4, "test_replace_acyclic": 3}
    for name, count in runs.items():
        assert (report[name]["pattern"], report[name]["repetitions"]) == ("kept_once", [1024] * count), name


def test_growth_that_a_full_collection_credits_runs_nothing_more(pytester: pytest.Pytester, run_checked) -> None:
    # What looked like growth was each run's replaced object on a cycle: judged again after the
    # full collection, before a run recording sites or a walk of the heap naming holders.
    pytester.makepyfile(
        test_it="""
        import torch
        RUNS = []

        class Writer:
            pass

        def test_replace_cyclic():
            RUNS.append(1)
            h = Writer()
            h.me = h
            h.t = torch.randn(256)
            Writer.last = h

        def test_runs():
            assert len(RUNS) == 4
        """
    )
    result, report = run_checked("-p", "no:randomly", "--vramleak")
    result.assert_outcomes(passed=2)
    entry = report["test_replace_cyclic"]
    assert (entry["pattern"], entry["repetitions"], entry["tensors"]) == ("kept_once", [1024] * 4, [])


FAILING_TESTS = """
import torch

KEEP = []

def test_fails_and_leaks():
    KEEP.append(torch.ones(512, 1024))  # 2 MiB kept for the session
    assert False, "its own failure"

def test_fails_holding_big_locals():
    batch = torch.ones(512, 1024)
    assert batch.sum() < 0, "its own failure"

def test_passes():
    pass
"""


@pytest.mark.parametrize("refreeze", [False, True], ids=["as-timed", "every-observation-refreezes"])
def test_a_test_that_fails_on_its_own_and_leaks_is_one_failure_with_both_reasons(
    pytester: pytest.Pytester, refreeze: bool
) -> None:
    pytester.makepyfile(test_it=FAILING_TESTS)
    if refreeze:  # a slow observation during the call freezes the heap, the failing frames with it
        pytester.makeconftest(
            "import pytest_vramleak.tracking.tracker\npytest_vramleak.tracking.tracker.REFREEZE_AFTER_SECONDS = 0\n"
        )
    # (in a subprocess: an in-process run's hook recorder keeps every failure's traceback)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--vramleak", "-rA", "--junitxml=junit.xml", "--vramleak-report=r.json"
    )
    result.assert_outcomes(failed=2, passed=1)
    result.stdout.fnmatch_lines(
        [
            "*_ test_fails_and_leaks _*",
            "E       AssertionError: its own failure",
            "*- vramleak: the test also leaked -*",
            "kept 2.0 MiB on cpu that it did not let go*",
            "leaked tensors:",
            "float32[512, 1024] on cpu: 1 tensor, 2.0 MiB",
            "    held by test_it.KEEP[0]",
            "*_ test_fails_holding_big_locals _*",
        ]
    )
    output = result.stdout.str()
    # the failing test's own frames (kept by pytest in sys.last_traceback) are not a leak
    assert output.count("vramleak: the test also leaked") == 1, output
    result.stdout.fnmatch_lines(
        ["FAILED test_it.py::test_fails_and_leaks - AssertionError: its own failure", "*2 failed, 1 passed*"]
    )
    suite = ElementTree.parse(pytester.path / "junit.xml").getroot().find("testsuite")
    assert suite is not None and (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("3", "2", "0")
    tests = read_report(pytester.path / "r.json")
    assert tests["test_fails_and_leaks"]["verdict"] == "leaked"
    assert tests["test_fails_and_leaks"]["leaked_bytes"] == 2 * 1024 * 1024
    assert tests["test_fails_holding_big_locals"]["verdict"] == "passed"
    assert tests["test_fails_holding_big_locals"]["leaked_bytes"] == 0


def test_runs_again_leave_the_random_numbers_the_next_tests_draw_as_they_were(pytester: pytest.Pytester) -> None:
    # A test run again for the check draws random numbers too; the tests after it must draw what
    # they draw without the plugin (timm's optimizer tests converge or not on their random data).
    pytester.makepyfile(
        test_it="""
        import json, random
        import numpy, torch

        KEPT = []

        def test_keeps_memory_and_draws():
            KEPT.append(torch.randn(64))
            random.random(), numpy.random.rand()

        def test_draws_after_it():
            drawn = [torch.rand(1).item(), random.random(), float(numpy.random.rand())]
            with open("drawn.json", "w") as out:
                json.dump(drawn, out)
        """
    )
    pytester.makeconftest("import random, numpy, torch\ntorch.manual_seed(0)\nrandom.seed(0)\nnumpy.random.seed(0)\n")
    pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:vramleak", "-p", "no:randomly").assert_outcomes(
        passed=2
    )
    plain = json.loads((pytester.path / "drawn.json").read_text())
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--vramleak", "-p", "no:randomly", "--vramleak-report=r.json"
    )
    result.assert_outcomes(failed=1, passed=1)
    report = read_report(pytester.path / "r.json")
    assert len(report["test_keeps_memory_and_draws"]["repetitions"]) == 4  # it ran again
    assert json.loads((pytester.path / "drawn.json").read_text()) == plain


CALLBACKS = """
import pytest, torch
KEEP = []
RUNS = []

class Callback:
    def __init__(self):
        self.best = None

class Proxy:  # the walk of the parametrize values never asks an object for its class
    @property
    def __class__(self):
        raise RuntimeError("the plugin ran the user's code")

@pytest.mark.parametrize("callbacks", [[Callback(), Callback(), Proxy()]])
def test_fit(callbacks):
    RUNS.append(1)
    for callback in callbacks[:2]:
        callback.best = torch.ones(4)  # a best score, on the case's own callbacks
    {also}

def test_runs():
    assert len(RUNS) == {runs}
"""


def test_a_slow_test_keeping_memory_only_in_its_parametrize_values_is_not_run_again(
    pytester: pytest.Pytester, run_checked, monkeypatch: pytest.MonkeyPatch
) -> None:
    # pytest keeps a case's parametrize values for the session and runs the case once: what they
    # keep cannot grow, and a DDP fit of seconds need not run again to show it.
    import pytest_vramleak.plugin.runs as runs

    monkeypatch.setattr(runs, "SLOW_RUN_SECONDS", 0.0)
    pytester.makepyfile(test_it=CALLBACKS.format(also="", runs=1))
    result, report = run_checked("-p", "no:randomly", "--vramleak")
    result.assert_outcomes(passed=2)
    entry = report["test_fit[callbacks0]"]
    assert (entry["verdict"], entry["leaked_bytes"], entry["pattern"], entry["repetitions"]) == (
        "passed",
        32,
        "kept_once",
        None,
    )
    assert entry["notes"][0].startswith(
        "kept only in its parametrize values (callbacks), which pytest keeps for the session and no other run of this case adds to: "
        "kept once, not run again (its run took "
    )
    result.stdout.fnmatch_lines(
        ["memory kept once, not growing*", "*32 B  test_it.py::test_fit[[]callbacks0[]] (cpu, kept once)"]
    )


def test_memory_a_parametrize_value_holds_that_a_module_holds_too_runs_again(
    pytester: pytest.Pytester, run_checked, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pytest_vramleak.plugin.runs as runs

    monkeypatch.setattr(runs, "SLOW_RUN_SECONDS", 0.0)
    pytester.makepyfile(test_it=CALLBACKS.format(also="KEEP.append(callbacks[0].best)", runs=5))
    result, report = run_checked("-p", "no:randomly", "--vramleak")
    entry = report["test_fit[callbacks0]"]
    assert (entry["verdict"], entry["pattern"]) == ("leaked", "grows"), result.stdout.str()
    assert report["test_runs"]["verdict"] == "passed"  # 3 more runs, and 1 recording sites


FIRST_GRADIENTS = """
import torch

ENCODER = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU())
RUNS = []
KEPT = []


def test_backward():
    RUNS.append("backward")
    ENCODER(torch.randn(8, 64)).pow(2).mean().{backward}
    {also}


def test_runs():
    assert len(RUNS) == {runs}
"""


def test_the_first_gradients_of_a_module_level_model_are_kept_once_without_running_again(
    pytester: pytest.Pytester, run_checked
) -> None:
    # backward accumulates into a gradient in place: later runs cannot add to it
    pytester.makepyfile(test_it=FIRST_GRADIENTS.format(backward="backward()", also="", runs=1))
    result, report = run_checked("-p", "no:randomly", "--vramleak")
    result.assert_outcomes(passed=2)
    entry = report["test_backward"]
    assert (entry["verdict"], entry["leaked_bytes"], entry["pattern"], entry["repetitions"]) == (
        "passed",
        (64 * 64 + 64) * 4,
        "kept_once",
        None,
    )
    assert entry["notes"] == [
        "kept only the first gradients of leaves made before the test (the parameters of a model made at import or "
        "by a fixture of a wider scope), which backward accumulates into in place on every later run: kept once, "
        "not run again"
    ]


@pytest.mark.parametrize(
    ("backward", "also", "pattern"),
    [
        ("backward()", "KEPT.append(torch.ones(16))", "grows"),  # a gradient beside a growing list
        ("backward(create_graph=True)", "", "grows"),  # a gradient with its graph: a cycle that grows
    ],
    ids=["and-a-growing-list", "with-its-graph"],
)
def test_gradients_with_anything_else_kept_run_again(
    pytester: pytest.Pytester, run_checked, backward: str, also: str, pattern: str
) -> None:
    pytester.makepyfile(test_it=FIRST_GRADIENTS.format(backward=backward, also=also, runs=5))
    result, report = run_checked("-p", "no:randomly", "-W", "ignore::UserWarning", "--vramleak")
    entry = report["test_backward"]
    assert (entry["verdict"], entry["pattern"]) == ("leaked", pattern), result.stdout.str()
    assert report["test_runs"]["verdict"] == "passed"  # 3 more runs, and 1 recording sites


def test_a_test_its_marks_skip_is_not_measured(
    pytester: pytest.Pytester, run_checked, monkeypatch: pytest.MonkeyPatch
) -> None:
    # pytest skips it as its setup starts, before its fixtures: no check begins (a tracker's
    # begin collects young garbage and freezes the heap), and its record is as before.
    from pytest_vramleak.check import LeakCheck

    begun: list[str] = []
    original = LeakCheck.begin
    monkeypatch.setattr(LeakCheck, "begin", lambda self: (begun.append(self.name), original(self))[1])
    pytester.makepyfile(
        test_it="""
        import pytest

        @pytest.mark.skip(reason="not here")
        def test_skipped():
            pass

        @pytest.mark.skipif(True, reason="not here")
        def test_skipped_if():
            pass

        @pytest.mark.skipif("True", reason="a condition pytest evaluates")
        def test_skipped_by_a_condition():
            pass

        def test_runs():
            pass
        """
    )
    result, report = run_checked("-p", "no:randomly", "--vramleak")
    result.assert_outcomes(passed=1, skipped=3)
    assert begun == ["test_it.py::test_skipped_by_a_condition", "test_it.py::test_runs"]
    for name in ("test_skipped", "test_skipped_if", "test_skipped_by_a_condition"):
        assert (report[name]["verdict"], report[name]["reason"], report[name]["device"]) == (
            "unchecked",
            "the test was skipped",
            "cpu",
        )


LAZY_TABLE = """
import pytest, torch
_TABLE = None
KEPT = []

def table():
    global _TABLE
    if _TABLE is None:
        _TABLE = torch.ones(512, 1024)
    return _TABLE
"""


def test_state_a_module_builds_on_first_use_is_told_with_the_ways_to_declare_it(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it=LAZY_TABLE
        + """
def test_a():
    assert table().sum() > 0

def test_grows():
    KEPT.append(torch.ones(512, 1024))
"""
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:randomly", "--vramleak")
    result.assert_outcomes(failed=2)
    output = result.stdout.str()
    # the rule stands (2 MiB kept once fails), and the failure says how to keep it on purpose
    assert output.count("kept once by module-level state built on first use") == 1  # test_a's, not the growth's
    result.stdout.fnmatch_lines(
        ["*_ test_a _*", "kept 2.0 MiB on cpu that it did not let go*", "*", "*", "*held by test_it._TABLE", "*"]
    )
    result.stdout.fnmatch_lines(
        ["kept once by module-level state built on first use*session-scoped fixture*@pytest.mark.allow_vram_leak"]
    )


def test_an_error_sys_keeps_is_not_told_as_state_a_module_builds(pytester: pytest.Pytester) -> None:
    # a console-like helper keeps the last error for pdb.pm(): sys.last_traceback is replaced by each
    # error, so it keeps one error's frames at a time, the memory of a failure, not lazily built state
    pytester.makepyfile(
        test_it="""
        import sys
        import torch

        MODEL = torch.nn.Linear(256, 1024)

        def run_cell(function, *args):
            try:
                return function(*args)
            except Exception:
                sys.last_type, sys.last_value, sys.last_traceback = sys.exc_info()

        def train_step(batch):
            activations = MODEL(batch)
            raise RuntimeError("out of memory")

        def test_it():
            assert run_cell(train_step, torch.ones(512, 256)) is None
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly", "--vramleak")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*held by sys.last_traceback.tb_next.tb_frame (train_step:*) local 'activations'",
            "*diagnosis: sys.last_traceback / sys.last_value keep the last reported error's frames*",
        ]
    )
    result.stdout.no_fnmatch_line("*built on first use*")


@pytest.mark.parametrize(
    "declared",
    [
        '@pytest.fixture(scope="session")\ndef built():\n    return table()\n\ndef test_a(built):\n',
        "@pytest.mark.allow_vram_leak\ndef test_a():\n",
    ],
    ids=["session fixture", "marker"],
)
def test_state_built_once_on_purpose_passes_where_declared_as_the_failure_says(
    pytester: pytest.Pytester, declared: str
) -> None:
    pytester.makepyfile(test_it=LAZY_TABLE + declared + "    assert table().sum() > 0\n")
    pytester.runpytest("-p", "no:cacheprovider", "--vramleak").assert_outcomes(passed=1)

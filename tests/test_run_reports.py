"""What a run writes: the JSON report's schema, JUnit XML properties, the summary's top
offenders, the Markdown summary, saved runs compared, and an interrupted run."""

from __future__ import annotations

import json
import re

import pytest


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
                        "holders_not_searched": 0,
                        "allocated_at": ["test_it.py:6 in test_leaks()"],
                        "sites_not_looked_up": 0,
                        "diagnoses": [
                            "CACHE['user-42'] keeps these tensors: it hangs from module test_it, alive as long as the "
                            "process, and the code added this entry and never removed it: remove it (del, .pop(), "
                            ".clear()) when done"
                        ],
                        "kind": "tensor",
                        "class": "",
                        "graph_bytes": 0,
                        "nodes": 0,
                    }
                ],
                "tensors_from": None,  # every run keeps the one tensor: no run's apart
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


def test_an_interrupted_run_marks_its_reports_and_leaves_the_benchmark_figures(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import os, signal
        import torch

        KEEP = []

        def test_leaks():
            KEEP.append(torch.ones(500_000))

        def test_interrupted():
            # (a process started by one that ignores SIGINT, as an xdist worker may, inherits that)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            os.kill(os.getpid(), signal.SIGINT)

        def test_never_runs():
            pass
        """
    )
    benchmark = pytester.path / "benchmark.json"
    benchmark.write_text('[{"name": "earlier", "unit": "bytes", "value": 1}]\n')
    # In a process of its own: the interruption would stop this run too.
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "no:randomly", "--vramleak", "--vramleak-report=r.json",
        "--vramleak-report=r.html", "--vramleak-markdown=summary.md", f"--vramleak-benchmark-json={benchmark}",
    )  # fmt: skip
    assert result.ret == pytest.ExitCode.INTERRUPTED
    why = "the run was interrupted (KeyboardInterrupt: Ctrl-C or SIGINT) before all its tests ran"
    document = json.loads((pytester.path / "r.json").read_text())
    assert document["interrupted"].startswith(why)
    assert [test["nodeid"] for test in document["tests"]] == ["test_it.py::test_leaks"]
    assert f"<strong>Interrupted</strong>: {why}" in (pytester.path / "r.html").read_text()
    assert f"**Interrupted**: {why}" in (pytester.path / "summary.md").read_text()
    assert benchmark.read_text() == '[{"name": "earlier", "unit": "bytes", "value": 1}]\n'
    result.stdout.fnmatch_lines(
        [
            f"vramleak: the run was interrupted: the benchmark figures {benchmark} were left as they were",
            "vramleak: wrote summary.md, r.json, r.html (each marked as from an interrupted run: *",
        ]
    )


def test_every_report_says_how_many_tensors_of_a_group_had_no_holder_searched(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest, torch
        CACHE = {}

        @pytest.mark.vram_budget
        def test_fills_a_cache():
            for user in range(100):
                CACHE[f"user-{user}"] = torch.ones(64)
        """
    )
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "--vramleak-report=r.json", "--vramleak-report=r.html", "--vramleak-markdown=s.md"
    )
    result.assert_outcomes(failed=1)
    result.stdout.re_match_lines(
        [
            re.escape("float32[64] on cpu: 100 tensors, 25.0 KiB"),
            re.escape("    allocated at test_it.py:7 in test_fills_a_cache()"),
            *[re.escape("    held by test_it.CACHE['user-") + r"\d+'\]"] * 3,
            re.escape("    ... and 97 more alike, whose holders were not searched"),
        ]
    )
    (group,) = json.loads((pytester.path / "r.json").read_text())["tests"][0]["tensors"]
    assert (group["count"], len(group["held_by"]), group["holders_not_searched"]) == (100, 3, 97)
    page = (pytester.path / "r.html").read_text()
    assert page.count("<li>held by <code>test_it.CACHE[") == 3
    assert '<p class="more">… and 97 more alike, whose holders were not searched</p>' in page
    (line,) = [line for line in (pytester.path / "s.md").read_text().splitlines() if line.startswith("- ")]
    assert re.fullmatch(
        re.escape(
            "- `test_it.py::test_fills_a_cache`: float32[64], 100 tensors, 25.0 KiB, held by `test_it.CACHE['user-"
        )
        + r"\d+"
        + re.escape(
            "']` (2 more holders in the JSON and HTML reports; 97 more tensors alike, whose holders were not searched)"
        ),
        line,
    ), line


def test_a_fixtures_holders_past_three_are_counted_in_the_summary_and_listed_in_the_reports(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest, torch
        REGISTRY = []

        @pytest.fixture(scope="module")
        def tables():
            made = [torch.ones(256 * (n + 1)) for n in range(5)]
            REGISTRY.extend(made)  # outlives the fixture's teardown
            return made

        def test_uses_tables(tables):
            assert len(tables) == 5
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:randomly", "--vramleak", "--vramleak-report=r.json")
    result.assert_outcomes(passed=1)
    result.stdout.re_match_lines(
        [
            re.escape(
                "fixture 'tables' (module scope, test_it.py) still holds 15.0 KiB it allocated, after its teardown"
            ),
            *[r"    held by test_it\.REGISTRY\[\d\]"] * 3,
            re.escape("    ... and 2 more holders (the JSON and HTML reports list them all)"),
        ]
    )
    (fixture,) = json.loads((pytester.path / "r.json").read_text())["fixtures"]
    assert sorted(fixture["held_by"]) == [f"test_it.REGISTRY[{n}]" for n in range(5)]


def test_the_summary_and_a_failure_say_how_many_they_left_out_and_how_to_see_them(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest, torch
        KEPT = []

        @pytest.mark.vram_budget
        @pytest.mark.parametrize("n", range(7))
        def test_leaks(n):
            KEPT.append(torch.ones(256 * (n + 1)))

        @pytest.mark.vram_budget
        def test_leaks_twelve_shapes():
            KEPT.extend(torch.ones(n + 1) for n in range(12))
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:randomly", "--vramleak-report=r.json")
    result.assert_outcomes(failed=8)
    result.stdout.fnmatch_lines(
        [
            "float32[[]3[]] on cpu: 1 tensor, 12 B",
            "... and 2 more groups, 12 B (--vramleak-report=PATH.json or .html lists them all)",
            "largest leaks:",
            "     7.0 KiB  test_it.py::test_leaks[[]6[]] (cpu, grows)",
            "  ... and 3 more tests that leaked (-vv lists them all)",
        ]
    )
    (twelve,) = [t for t in json.loads((pytester.path / "r.json").read_text())["tests"] if "twelve" in t["nodeid"]]
    assert len(twelve["tensors"]) == 12
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:randomly", "-vv")
    result.stdout.fnmatch_lines(["largest leaks:", *["*test_it.py::test_leaks*"] * 7])
    result.stdout.no_fnmatch_line("*more tests that leaked*")


def test_a_group_made_at_more_than_three_sites_says_how_many_sites_were_not_looked_up(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_it="""
        import torch
        KEPT = []

        def test_keeps_batches_made_on_five_lines():
            KEPT.append(torch.ones(64))
            KEPT.append(torch.ones(64))
            KEPT.append(torch.ones(64))
            KEPT.append(torch.ones(64))
            KEPT.append(torch.ones(64))
        """
    )
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--vramleak", "--vramleak-report=r.json", "--vramleak-report=r.html"
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "float32[[]64[]] on cpu: 5 tensors, *",
            *["    allocated at test_it.py:*"] * 3,
            "    ... and the sites of 2 more tensors, not looked up",
        ]
    )
    (group,) = json.loads((pytester.path / "r.json").read_text())["tests"][0]["tensors"]
    assert (len(group["allocated_at"]), group["sites_not_looked_up"]) == (3, 2)
    assert "… and the sites of 2 more tensors, not looked up" in (pytester.path / "r.html").read_text()

"""The examples a newcomer runs first: each leak caught, named and placed with no option set."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).parent.parent / "examples"


def test_every_leak_in_the_examples_says_where_it_was_made_with_no_option(pytester: pytest.Pytester) -> None:
    shutil.copytree(EXAMPLES, pytester.path / "examples")
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "no:randomly", "--vramleak-report=r.json", "examples"
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    tests = json.loads((pytester.path / "r.json").read_text())["tests"]
    failing = {t["nodeid"].rpartition("::")[2]: t for t in tests if t["verdict"] != "passed"}
    assert sorted(failing) == [
        "test_embedding_cache_without_eviction",
        "test_hook_appends_activations",
        "test_running_loss_keeps_every_graph",
        "test_stored_exception_pins_activations",
        "test_unbounded_lru_cache",
        "test_validation_outputs_kept_for_metrics",
    ]
    for name, test in failing.items():
        assert test["tensors"], name
        for group in test["tensors"]:
            assert any(site.startswith("examples/") for site in group["allocated_at"]), (
                name,
                group["title"],
                group["allocated_at"],
            )
    result.stdout.fnmatch_lines(
        [
            "*allocated at examples/test_caches.py:* in embed_user(), called from examples/test_caches.py:* in test_embedding_cache_without_eviction()"
        ]
    )
    result.stdout.no_fnmatch_line("*not recorded*")
    # the tensors listed are one run's, and the heading says which: the figures above are the first run's
    result.stdout.fnmatch_lines(
        [
            "leaked 864.0 KiB on cpu, allowed 0 B",
            "*",
            "leaked tensors, as one run leaves them (run 5, which recorded where tensors are made after the 4 above), "
            "2.0 MiB in all, where the figure above, 864.0 KiB, is the first run's:",
        ]
    )


def test_the_script_example_checks_a_training_loop_outside_pytest(pytester: pytest.Pytester) -> None:
    shutil.copytree(EXAMPLES, pytester.path / "examples")
    leaking = pytester.run(sys.executable, "examples/train_script.py")
    assert leaking.ret == 1, leaking.stderr.str()
    leaking.stdout.fnmatch_lines(
        [
            "leak: memory grew 4 B per step over 10 measured steps (40 B in total) on cpu*",
            "    allocated at examples/train_script.py:* in train_step(), called from examples/train_script.py:* in main()*",
            "    held by main:* local 'history'[[]*[]]",
        ]
    )
    fixed = pytester.run(sys.executable, "examples/train_script.py", "--fixed")
    assert fixed.ret == 0, fixed.stderr.str()
    fixed.stdout.fnmatch_lines(["no leak: memory did not grow over 10 measured steps"])

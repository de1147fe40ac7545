"""A test's outcome from its phases' reports, the headline that counts a run's, and why a card that passed says so."""

from __future__ import annotations

import pytest

from pytest_vramleak.reporting.outcomes import headline, outcome_of_phases


@pytest.mark.parametrize(
    ("categories", "outcome"),
    [
        (["", "passed", ""], "passed"),
        (["", "failed", ""], "failed"),
        (["error", ""], "error"),
        (["", "passed", "error"], "error"),
        (["", "failed", "error"], "failed"),
        (["skipped", ""], "skipped"),
        (["", "xfailed", ""], "xfailed"),
        (["", "xpassed", ""], "xpassed"),
        (["", "rerun", ""], "rerun"),
        (["", ""], None),
    ],
)
def test_a_tests_outcome_is_the_first_of_its_phases_that_did_not_pass(categories: list[str], outcome: str) -> None:
    assert outcome_of_phases(categories) == outcome


def test_the_headline_counts_a_run_with_nothing_to_say() -> None:
    assert headline([]) == "0 checked tests"
    assert (
        headline([{"nodeid": "a", "outcome": "passed", "verdict": "passed"}])
        == "1 checked test: 1 passed; none leaked or went over budget"
    )
    assert (
        headline([{"nodeid": "a", "outcome": None, "verdict": "leaked"}])
        == "1 checked test: 1 outcome not recorded; 1 leaked"
    )


@pytest.mark.parametrize(
    ("figures", "said"),
    [
        (
            {"leaked_bytes": 262144, "pattern": "kept_once", "rule": "significant"},
            "passed: memory kept once, not growing, below --vramleak-kept-floor*",
        ),
        (
            {"leaked_bytes": 262144, "pattern": "settled", "rule": "growth"},
            "passed: memory kept once, not growing, and only growth fails it*",
        ),
        (
            {
                "leaked_bytes": 4096,
                "rule": "significant",
                "notes": ["4.0 KiB held by PyTorch itself in C++ ...: not counted"],
            },
            "passed: what it left is not the test's own (4.0 KiB held by PyTorch itself in C++ ...: not counted)",
        ),
        ({"leaked_bytes": 0, "rule": "any"}, None),
    ],
)
def test_a_card_that_passed_with_more_left_than_its_budget_says_why(
    figures: dict[str, object], said: str | None
) -> None:
    import fnmatch

    from pytest_vramleak.reporting.html_report import render_html
    from pytest_vramleak.reporting.outcomes import why_passed

    result = {
        "nodeid": "t.py::test_it",
        "device": "cpu",
        "outcome": "passed",
        "verdict": "passed",
        "budget": {"leak": 0},
        **figures,
    }
    text = why_passed(result)
    assert text == said if said is None else fnmatch.fnmatch(str(text), said), text
    page = render_html([{**result, "tensors": [{"dtype": "float32", "shape": [1], "held_by": ["t.X"]}]}])
    assert (text is not None) == ('<p class="reason">passed: ' in page)

"""What happened to a checked test, in two words that reports keep apart: pytest's outcome and the
leak verdict.

``outcome`` is what pytest says of the test, in its own words (``passed``, ``failed``,
``skipped``, ``xfailed``, ``xpassed``, ``error``): the verdict fails a test through pytest, so a
test that leaked is ``failed`` there, and so is one whose body failed. ``verdict`` is what the
leak check found (``passed``, ``leaked``, ``over_budget``, ``unchecked``), and ``step_verdict``
what the ``vramleak`` fixture's step checks found (``passed``, ``leaked``, ``undecided``). The
headline that the terminal, the HTML page and the Markdown summary print counts both, in one
sentence (:func:`headline`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

PYTEST_ORDER = ("failed", "passed", "skipped", "xfailed", "xpassed", "error")
"""pytest's outcomes in the order its summary line counts them (``2 failed, 5 passed, 1 error``)."""


def outcome_of_phases(categories: Iterable[str]) -> str | None:
    """A test's outcome from the categories pytest gave its phases' reports (the first word of
    ``pytest_report_teststatus``: empty for a set-up or teardown that passed): the first one that
    is not ``passed``, as pytest's summary would count it (a failed set-up is an ``error``, a
    failed teardown after a passing call too), else ``passed``; None where pytest gave none (a
    ``--setup-only`` run)."""
    seen = [category for category in categories if category]
    return next((category for category in seen if category != "passed"), "passed" if seen else None)


def _counted(words: Mapping[str, int], order: Sequence[str]) -> list[str]:
    known = [word for word in order if words.get(word)]
    return [f"{words[word]} {word.replace('_', ' ')}" for word in [*known, *sorted(set(words) - set(order))]]


def headline(results: Sequence[Mapping[str, Any]]) -> str:
    """One sentence counting a run's checked tests by pytest's outcome, then by the leak verdict:
    ``27 checked tests: 13 failed, 14 passed; 11 leaked, 1 over budget``. The terminal, the HTML
    page and the Markdown summary print this same sentence."""
    outcomes: dict[str, int] = {}
    verdicts: dict[str, int] = {}
    for result in results:
        outcome = result.get("outcome") or "outcome not recorded"
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        verdict = verdict_of(result)
        verdicts[verdict] = verdicts.get(verdict, 0) + 1
    count = len(results)
    text = f"{count} checked test{'' if count == 1 else 's'}"
    if not count:
        return text
    text += ": " + ", ".join(_counted(outcomes, PYTEST_ORDER))
    failing = _counted({word: verdicts.get(word, 0) for word in ("leaked", "over_budget")}, ("leaked", "over_budget"))
    unchecked = verdicts.get("unchecked", 0)
    verdict_words = failing or ["none leaked or went over budget"]
    if unchecked:
        verdict_words.append(f"{unchecked} unchecked")
    undecided = sum(1 for result in results if result.get("step_verdict") == "undecided")
    if undecided:
        verdict_words.append(f"{undecided} step check{'' if undecided == 1 else 's'} undecided")
    return text + "; " + ", ".join(verdict_words)


def verdict_of(result: Mapping[str, Any]) -> str:
    """The leak verdict of a report's entry."""
    return str(result.get("verdict") or "unchecked")


def why_passed(result: Mapping[str, Any]) -> str | None:
    """Why a test whose figures show more memory left than its budget allows passed the leak
    check, in a few words (None where its figures are within its budget, or it did not pass)."""
    if verdict_of(result) != "passed":
        return None
    leaked = result.get("leaked_bytes") or 0
    allowed = (result.get("budget") or {}).get("leak")
    if allowed is None or leaked <= allowed:
        return None
    pattern, rule = result.get("pattern"), result.get("rule")
    if pattern in ("kept_once", "settled") and rule == "growth":
        return "passed: memory kept once, not growing, and only growth fails it (--vramleak-fail-on=growth)"
    if pattern in ("kept_once", "settled"):
        return (
            "passed: memory kept once, not growing, below --vramleak-kept-floor "
            "(tests without a vram_budget marker fail on growth, or on memory kept once from that size on)"
        )
    set_aside = [note for note in result.get("notes") or [] if note.endswith(": not counted")]
    if set_aside:
        return "passed: what it left is not the test's own (" + "; ".join(set_aside) + ")"
    return "passed: what it left was not counted against it by its rule (" + str(rule or "any") + ")"

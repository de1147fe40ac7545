"""pytest's outcome of each checked test, learnt from the reports pytest logs, written into the
test's record beside the leak verdict (see :mod:`~pytest_vramleak.reporting.outcomes`).

A checked test's record rides on its teardown report. As its reports are logged, each phase's
category is asked of pytest (``pytest_report_teststatus``, the hook its terminal counts by, so
``xfailed``, ``error`` and another plugin's words come out as pytest prints them); the teardown's
then gives the record its ``outcome``, and JUnit XML its ``vramleak_outcome`` property. Under
pytest-xdist this runs in the controller too, which logs every worker's reports.
"""

from __future__ import annotations

from typing import Any

import pytest

from ..reporting.outcomes import outcome_of_phases
from ..reporting.report import TestResult


def verdict_properties(result: TestResult) -> list[tuple[str, Any]]:
    """The JUnit XML properties that give a checked test's verdicts."""
    properties: list[tuple[str, Any]] = [("vramleak_verdict", result.verdict)]
    if result.step_verdict is not None:
        properties.append(("vramleak_step_verdict", result.step_verdict))
    return properties


class PytestOutcomes:
    """The categories pytest gave each test's phases so far, until its teardown is logged."""

    def __init__(self) -> None:
        self._phases: dict[str, list[str]] = {}

    def note(self, config: pytest.Config, report: pytest.TestReport) -> None:
        """Note a logged report; on a checked test's teardown, write pytest's outcome into its record.
        A subtest's report (pytest's ``subtests`` fixture, pytest-subtests) is counted by pytest
        apart from its test ("2 subtests passed"): the test's outcome is its own reports'."""
        if type(report).__name__.lower() == "subtestreport":
            return
        status = config.hook.pytest_report_teststatus(report=report, config=config)
        phases = self._phases.setdefault(report.nodeid, [])
        phases.append(str(status[0]) if status else "")
        if report.when != "teardown":
            return
        del self._phases[report.nodeid]
        record = getattr(report, "vramleak", None)
        if not isinstance(record, dict):
            return
        record["outcome"] = outcome = outcome_of_phases(phases)
        # (idempotent: a pytest-xdist worker noted it already; the controller notes it again)
        properties = [prop for prop in report.user_properties if prop[0] != "vramleak_outcome"]
        first = next((index for index, prop in enumerate(properties) if str(prop[0]).startswith("vramleak_")), 0)
        properties.insert(first, ("vramleak_outcome", outcome))
        report.user_properties[:] = properties

"""The text of a failure's leaked groups."""

from __future__ import annotations

from pytest_vramleak.holders.snapshot import TensorGroup
from pytest_vramleak.reporting.report import render_groups


def test_a_group_given_the_diagnoses_of_one_above_says_so_once() -> None:
    # huggingface/accelerate#84: an optimizer's state and its parameters, kept by one registry,
    # get the same two diagnoses
    diagnoses = ["state kept on a value a fixture shares", "_optimizers keeps every optimizer put in it"]
    state = TensorGroup("float32", (64, 64), "cpu", bytes=16384, count=1, diagnoses=list(diagnoses))
    parameters = TensorGroup("float32", (64,), "cpu", bytes=256, count=1, diagnoses=[*diagnoses, "its own"])
    lines = render_groups([state, parameters]).splitlines()
    assert [line.strip() for line in lines if "diagnosis:" in line] == [
        f"diagnosis: {diagnoses[0]}",
        f"diagnosis: {diagnoses[1]}",
        "diagnosis: as above",
        "diagnosis: its own",
    ]

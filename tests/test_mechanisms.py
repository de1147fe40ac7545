"""The catalogue of retention mechanisms, end to end under plain ``--vramleak``: every leak fails and
its fixed twin passes; the report names the mechanism's object, where the storage holding most of the
bytes was allocated, and a diagnosis that names the mechanism and its fix.

Where the plugin does not get a part right yet, that part is a strict xfail whose reason says what the
report says today, so every gap is visible and closing one turns the suite red until the mark goes.
"""

from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .mechanisms import CATALOGUE, GAPS, KINDS, Mechanism, Part

BY_NAME = {mechanism.name: mechanism for mechanism in CATALOGUE}


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def runs_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder for the whole run, shared by xdist's workers, so each entry runs once."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    folder = base / "mechanisms"
    folder.mkdir(exist_ok=True)
    return folder


def run_entry(folder: Path, mechanism: Mechanism) -> dict[str, Any]:
    """Both files of an entry in one pytest process of their own (what a leak keeps stays there); the
    fixed twin runs first, so nothing the leak leaves behind can reach it."""
    entry = folder / mechanism.name
    with _locked(folder / f"{mechanism.name}.lock"):
        done = entry / "result.json"
        if not done.exists():
            entry.mkdir(exist_ok=True)
            (entry / "test_fixed.py").write_text(mechanism.fixed_file)
            (entry / "test_leak.py").write_text(mechanism.leak_file)
            command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", "-p", "no:xdist"]
            command += ["--vramleak", "--vramleak-report=r.json", "test_fixed.py", "test_leak.py"]
            process = subprocess.run(command, cwd=entry, capture_output=True, text=True, timeout=300)
            output = process.stdout + process.stderr
            report = entry / "r.json"
            tests = json.loads(report.read_text())["tests"] if report.exists() else []
            result = {test["nodeid"].split("::")[0]: test for test in tests}
            done.write_text(json.dumps({"tests": result, "output": output}))
    return json.loads(done.read_text())


@pytest.fixture
def entry(request: pytest.FixtureRequest, runs_folder: Path) -> tuple[Mechanism, dict[str, Any]]:
    mechanism = BY_NAME[request.param]
    return mechanism, run_entry(runs_folder, mechanism)


def _verdict(result: dict[str, Any], file: str) -> str:
    test = result["tests"].get(file)
    return test["verdict"] if test else "not run"


def _largest_group(result: dict[str, Any]) -> dict[str, Any]:
    groups = result["tests"]["test_leak.py"]["tensors"]
    assert groups, "the report lists no tensors for the leak\n" + result["output"]
    return max(groups, key=lambda group: group["bytes"] + group["graph_bytes"])


def _params(part: Part) -> list[Any]:
    params = []
    for mechanism in CATALOGUE:
        marks = []
        if part in mechanism.gaps:
            marks.append(pytest.mark.xfail(strict=True, reason=mechanism.gaps[part]))
        params.append(pytest.param(mechanism.name, id=mechanism.name, marks=marks))
    return params


def test_the_catalogue_covers_every_kind() -> None:
    assert len(CATALOGUE) >= 40
    assert len(BY_NAME) == len(CATALOGUE)
    assert {mechanism.kind for mechanism in CATALOGUE} == set(KINDS)
    assert all(mechanism.source and mechanism.diagnosis for mechanism in CATALOGUE)
    assert set(GAPS) <= set(BY_NAME)


@pytest.mark.parametrize("entry", _params("caught"), indirect=True)
def test_the_leak_is_caught(entry: tuple[Mechanism, dict[str, Any]]) -> None:
    mechanism, result = entry
    assert _verdict(result, "test_leak.py") == "leaked", result["output"]


@pytest.mark.parametrize("entry", _params("fixed"), indirect=True)
def test_the_fixed_twin_passes(entry: tuple[Mechanism, dict[str, Any]]) -> None:
    mechanism, result = entry
    assert _verdict(result, "test_fixed.py") == "passed", result["output"]


@pytest.mark.parametrize("entry", _params("holder"), indirect=True)
def test_the_holder_names_the_mechanism(entry: tuple[Mechanism, dict[str, Any]]) -> None:
    mechanism, result = entry
    held_by = _largest_group(result)["held_by"]
    assert any(fnmatch.fnmatchcase(line, mechanism.holder) for line in held_by), held_by


@pytest.mark.parametrize("entry", _params("site"), indirect=True)
def test_the_site_is_where_most_bytes_were_allocated(entry: tuple[Mechanism, dict[str, Any]]) -> None:
    mechanism, result = entry
    allocated_at = _largest_group(result)["allocated_at"]
    assert allocated_at and fnmatch.fnmatchcase(allocated_at[0], mechanism.site), allocated_at


@pytest.mark.parametrize("entry", _params("diagnosis"), indirect=True)
def test_the_diagnosis_names_the_mechanism_and_its_fix(entry: tuple[Mechanism, dict[str, Any]]) -> None:
    mechanism, result = entry
    diagnoses = " | ".join(_largest_group(result)["diagnoses"])
    missing = [word for word in mechanism.diagnosis if word.lower() not in diagnoses.lower()]
    assert not missing, f"missing {missing} in: {diagnoses or '(no diagnosis)'}"


def test_the_warnings_registry_keeps_text_not_tensors(pytester: pytest.Pytester) -> None:
    # python/cpython#97557 and POSYDON-code/POSYDON#364: each distinct warning text adds a key to the
    # module's __warningregistry__ for the life of the process. The key is the message's text, never
    # the tensor the text was made from, so a loss printed into a warning keeps no tensor memory.
    pytester.makepyfile(
        test_it="""
        import itertools, warnings
        import torch

        STEP = itertools.count()

        def test_it():
            loss = torch.rand(2048).sum() * next(STEP)
            warnings.warn(f"loss spiked to {loss}", UserWarning)
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--vramleak", "-W", "default::UserWarning")
    result.assert_outcomes(passed=1, warnings=1)
    result.stdout.no_fnmatch_line("*LEAKED*")

"""Every script in scripts/ runs: its help, and a real run where one is cheap here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parent.parent / "scripts"


def _run(*command: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(SCRIPTS.parent) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=SCRIPTS.parent)


def test_every_script_is_covered_here() -> None:
    assert sorted(path.name for path in SCRIPTS.iterdir()) == [
        "gpu-check.sh",
        "ranks-crash-loop.py",
        "report-screenshot.sh",
    ]


@pytest.mark.parametrize("script", ["gpu-check.sh", "report-screenshot.sh"])
def test_a_shell_script_says_what_it_does(script: str) -> None:
    result = _run("bash", str(SCRIPTS / script), "--help")
    assert result.returncode == 0, result.stderr
    assert f"Usage: scripts/{script}" in result.stdout


def test_the_gpu_check_says_there_is_no_gpu_here() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: the check itself runs in scripts/gpu-check.sh")
    result = _run("bash", str(SCRIPTS / "gpu-check.sh"))
    assert result.returncode == 0, result.stderr
    assert "gpu-check: no CUDA device here" in result.stdout


@pytest.mark.parametrize("kind", ["file", "fifo", "link to a file", "folder with a file"])
def test_the_gpu_check_replaces_nothing_it_is_given_as_its_log_folder(tmp_path: Path, kind: str) -> None:
    target = tmp_path / "given"
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "folder with a file":
        target.mkdir()
        (target / "gpu.log").write_text("kept")
    else:
        (tmp_path / "file").write_text("kept")
        if kind == "file":
            (tmp_path / "file").rename(target)
        else:
            target.symlink_to(tmp_path / "file")
    result = _run("bash", str(SCRIPTS / "gpu-check.sh"), str(target))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "is not a new or empty folder" in result.stderr
    if kind == "folder with a file":
        assert (target / "gpu.log").read_text() == "kept"
    elif kind != "fifo":
        assert target.read_text() == "kept"


def test_the_ranks_crash_loop_runs_a_two_rank_world_once() -> None:
    result = _run(sys.executable, str(SCRIPTS / "ranks-crash-loop.py"), "--runs", "1", "--show")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "run 1: ok: rank 0" in result.stdout
    assert "0 of 1 runs crashed" in result.stdout.splitlines()[-1]

"""The versions the project claims are the versions it tests, and what differs between torch releases."""

from __future__ import annotations

import configparser
import re
import types
from pathlib import Path

import pytest
import torch

from pytest_vramleak.tracking import torch_api

ROOT = Path(__file__).parent.parent


def _tested_pairs(tox_text: str) -> tuple[set[str], dict[str, str], dict[str, str]]:
    """tox.ini's environments: the Pythons (``3.10``), each torch factor's pinned version and
    pytest pin (``torch24`` -> ``2.4.0``), and the names of the torch factors its environments use."""
    parser = configparser.ConfigParser()
    parser.read_string(tox_text)
    envs = [name.strip() for name in parser["tox"]["env_list"].split(",") if name.strip()]
    pythons, torches, pytests = set(), {}, {}
    pins = {}
    for line in parser["testenv"]["deps"].splitlines():
        found = re.fullmatch(r"\s*(torch\d+):\s*(torch|pytest)==([\d.]+)\s*", line)
        if found:
            pins[(found[1], found[2])] = found[3]
    for env in envs:
        python, _, factor = env.partition("-")
        found = re.fullmatch(r"py3(\d+)", python)
        assert found and factor in {key[0] for key in pins}, f"tox.ini: {env} names no Python and pinned torch"
        pythons.add(f"3.{found[1]}")
        torches[factor] = pins[(factor, "torch")]
        if (factor, "pytest") in pins:
            pytests[factor] = pins[(factor, "pytest")]
    return pythons, torches, pytests


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def claims_untested(pyproject_text: str, tox_text: str) -> list[str]:
    """What pyproject.toml claims that no tox environment runs (or runs but does not claim)."""
    pythons, torches, pytests = _tested_pairs(tox_text)
    problems = []
    requires = re.search(r'^requires-python\s*=\s*">=([\d.]+)"', pyproject_text, re.MULTILINE)
    oldest_python = min(pythons, key=_version)
    if requires is None or requires[1] != oldest_python:
        problems.append(f"requires-python is not '>={oldest_python}', the oldest Python tox runs")
    classified = set(re.findall(r'"Programming Language :: Python :: (3\.\d+)"', pyproject_text))
    if classified != pythons:
        problems.append(f"the classifiers name Pythons {sorted(classified)}, tox runs {sorted(pythons)}")
    for package, pinned in (("torch", torches), ("pytest", pytests)):
        claim = re.search(rf'^\s*"{package}>=([\d.]+)"', pyproject_text, re.MULTILINE)
        oldest = min(pinned.values(), key=_version) if pinned else None
        if claim is None or oldest is None or _version(oldest)[: len(_version(claim[1]))] != _version(claim[1]):
            problems.append(f"{package}>= does not claim {oldest}, the oldest {package} tox runs")
    return problems


def test_pyproject_claims_exactly_the_versions_tox_runs() -> None:
    assert claims_untested((ROOT / "pyproject.toml").read_text(), (ROOT / "tox.ini").read_text()) == []


@pytest.mark.parametrize(
    ("old", "new", "problem"),
    [
        ('requires-python = ">=3.10"', 'requires-python = ">=3.9"', "requires-python"),
        ('"torch>=2.4"', '"torch>=2.3"', "torch>="),
        ('"pytest>=8.1"', '"pytest>=8.0"', "pytest>="),
        (
            '"Programming Language :: Python :: 3.13",',
            '"Programming Language :: Python :: 3.13",\n    "Programming Language :: Python :: 3.14",',
            "classifiers",
        ),
    ],
)
def test_a_claim_no_tox_environment_runs_is_caught(old: str, new: str, problem: str) -> None:
    text = (ROOT / "pyproject.toml").read_text()
    assert old in text
    problems = claims_untested(text.replace(old, new), (ROOT / "tox.ini").read_text())
    assert len(problems) == 1 and problem in problems[0]


def test_the_tested_range_is_tox_inis() -> None:
    _, torches, _ = _tested_pairs((ROOT / "tox.ini").read_text())
    minors = [_version(version)[:2] for version in torches.values()]
    assert (min(minors), max(minors)) == (torch_api.OLDEST_TESTED, torch_api.NEWEST_TESTED)


def test_a_tensor_cpp_also_holds_is_listed() -> None:
    # A tensor a graph saved is held by C++ too: where gc hides its class, the heap pass finds it.
    leaf = torch.ones(3, requires_grad=True)
    product = leaf * leaf
    assert any(obj is leaf for obj in torch_api.objects_referring_to((torch.Tensor,)))
    del product


def _fake_torch(version: str, *, cuda_host_stats: bool = True) -> types.SimpleNamespace:
    cuda = types.SimpleNamespace(host_memory_stats=dict) if cuda_host_stats else types.SimpleNamespace()
    return types.SimpleNamespace(__version__=version, cuda=cuda)


@pytest.mark.parametrize(
    ("version", "device", "host_stats", "notes"),
    [
        ("2.14.1+cu130", "cpu", True, []),
        ("2.4.0+cu121", "cpu", False, []),
        ("2.13.0+cpu", "cuda:0", True, []),
        ("2.15.0", "cpu", True, ["torch 2.15.0 is newer than the newest tested (2.14)*"]),
        ("3.0.0a0+git1234", "cpu", True, ["torch 3.0.0a0+git1234 is newer than the newest tested (2.14)*"]),
        ("2.3.1", "cpu", True, ["torch 2.3.1 is older than the oldest supported (2.4)"]),
        (
            "2.4.0",
            "cuda:0",
            False,
            ["torch 2.4.0 has no torch.cuda.host_memory_stats: pinned host memory is not checked"],
        ),
    ],
)
def test_version_notes(version: str, device: str, host_stats: bool, notes: list[str]) -> None:
    found = torch_api.version_notes(_fake_torch(version, cuda_host_stats=host_stats), device)
    assert len(found) == len(notes)
    for line, pattern in zip(found, notes, strict=True):
        assert re.fullmatch(re.escape(pattern).replace(r"\*", ".*"), line)


class _NoDriver:
    def is_available(self) -> bool:
        return True

    def current_device(self) -> int:
        raise RuntimeError("Found no NVIDIA driver on your system")


def test_auto_is_the_cpu_on_a_torch_without_torch_accelerator_and_no_driver() -> None:
    # torch before 2.6, a CUDA build on a machine with no GPU driver
    assert torch_api.default_device(types.SimpleNamespace(cuda=_NoDriver())) == "cpu"


def test_the_header_says_once_that_torch_is_newer_than_tested(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch, "__version__", "2.99.0")
    pytester.makepyfile(test_it="def test_it():\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider", "--vramleak")
    result.assert_outcomes(passed=1)
    line = "vramleak: torch 2.99.0 is newer than the newest tested (2.14): *"
    result.stdout.fnmatch_lines(["vramleak: device cpu, *", line])
    assert sum(text.startswith("vramleak: torch 2.99.0") for text in result.outlines) == 1


def test_the_header_says_nothing_of_a_tested_torch(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_it="def test_it():\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider", "--vramleak")
    result.assert_outcomes(passed=1)
    result.stdout.no_fnmatch_line("vramleak: torch *")

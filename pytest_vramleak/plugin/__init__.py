"""The pytest layer: options, the marker, the ``vramleak`` fixture and the hooks that run checks.

This module is the plugin pytest loads (entry point ``pytest11: vramleak``; ``-p no:vramleak``
turns it off). It declares the options and registers the session's owner,
:class:`~pytest_vramleak.plugin.session.VramleakSession`, whose methods are the hooks.

Where the rest lives: :mod:`~pytest_vramleak.plugin.session` (the session's state and hooks),
:mod:`~pytest_vramleak.plugin.runs` (a checked test's runs and the verdict on them),
:mod:`~pytest_vramleak.plugin.marker`, :mod:`~pytest_vramleak.plugin.fixture`,
:mod:`~pytest_vramleak.plugin.leftovers` (fixtures' tensors after teardown, older tensors changed
between checks), :mod:`~pytest_vramleak.plugin.summary` (the terminal's lines),
:mod:`~pytest_vramleak.plugin.outputs` (the files a run writes) and
:mod:`~pytest_vramleak.plugin.options` (every option, declared and read).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from ..tracking import gc_functions  # noqa: F401  (gc's functions as they are before any conftest: see there)
from .options import OPTIONS
from .session import VramleakSession

if TYPE_CHECKING:
    from .fixture import VramLeakFixture


@pytest.fixture
def vramleak(request: pytest.FixtureRequest) -> VramLeakFixture:
    """Check repeated training or inference steps for memory that keeps growing.
    ``for i in vramleak.steps(n, warmup=k, max_steps=m): train_step()`` runs n steps, measures
    memory after each past the first k (default: ini vramleak_warmup, 2) and fails the test if it
    grows across them; where the n steps leave it undecided, up to m run in all.
    ``vramleak.check(step, steps=10, warmup=k, max_steps=m)`` calls ``step(i)`` (or ``step()``)
    the same way and returns the check's figures. ``vramleak.results`` holds every check so far.
    """
    from .fixture import make_fixture  # (the engine loads as the first test is checked)

    return make_fixture(request)


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    group = parser.getgroup("vramleak", "tensor memory leak checks (pytest-vramleak)")
    for option in OPTIONS:
        if option.flag:
            group.addoption(option.cli, action="store_true", default=None, help=option.cli_help)
        else:
            action = "append" if option.repeat else "store"
            group.addoption(option.cli, action=action, default=None, metavar=option.metavar, help=option.cli_help)
        parser.addini(option.ini, option.help, type=option.ini_type, default=option.ini_default)  # type: ignore[arg-type]
    # Registered as the module is, so that its hooks are heard where the module's would be: after a
    # conftest's (one that runs tests itself, or adds markers as it collects).
    pluginmanager.register(VramleakSession(), "vramleak-session")

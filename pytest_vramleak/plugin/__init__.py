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

import pytest

from . import fixture
from .options import OPTIONS
from .session import VramleakSession

vramleak = fixture.vramleak
"""The ``vramleak`` fixture (see :mod:`pytest_vramleak.plugin.fixture`): pytest finds fixtures in the plugin's module."""


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

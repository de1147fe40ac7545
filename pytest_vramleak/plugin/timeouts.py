"""A test's own timeout (pytest-timeout's ``--timeout``) across the runs the plugin adds.

pytest-timeout arms one timer as a test's protocol begins (or as its call begins, with
``func_only``) and cancels it as the protocol ends. A checked test's protocol holds its runs
again, the run that records sites and the naming of its holders: under that one timer, the
runs again would use up the time the test has for itself, and the timer would fire in the
plugin's own work. So each run, and the plugin's work after the runs, get the test's whole
timeout again, armed through pytest-timeout's own hooks with the settings it armed the test's
with (the same method: signal or thread).
"""

from __future__ import annotations

from typing import Any

import pytest


def armed_settings(settings: Any) -> Any:
    """The settings pytest-timeout arms a test's timer with, where that timer spans the test's
    protocol (not only its call, ``func_only``): only such a timer spans the plugin's runs."""
    if getattr(settings, "func_only", True) or not getattr(settings, "timeout", None):
        return None
    return settings


def rearm(item: pytest.Item, settings: Any) -> None:
    """Give what follows the whole of the test's timeout (``settings``: from
    :func:`armed_settings`, None where nothing is to be armed again)."""
    if settings is None:
        return
    hook = item.config.hook
    hook.pytest_timeout_cancel_timer(item=item)
    hook.pytest_timeout_set_timer(item=item, settings=settings)


def cut_short(error: BaseException, settings: Any, while_doing: str) -> str:
    """Why a check ends without a verdict: ``error`` (a timeout's signal handler raises
    ``pytest.fail``'s exception wherever the test's process is) fired in the plugin's own work."""
    what = f"{type(error).__name__}: {error}" if not isinstance(error, pytest.fail.Exception) else str(error)
    if settings is not None:
        what += f" (the test's --timeout of {settings.timeout:g} s, which each of its runs and the check after them get whole)"
    return f"the check was cut short while {while_doing}: {what}"

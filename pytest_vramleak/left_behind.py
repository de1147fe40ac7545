"""What a checked block leaves running besides memory: process groups, child processes, autocast
regions left open (:mod:`pytest_vramleak.meters.autocast`), ranks' leaks.

A check notes the ``torch.distributed`` process groups and the child processes alive as it begins
(:mod:`pytest_vramleak.meters.processes`), and tells rank processes started from then on where to report
(:mod:`pytest_vramleak.ranks`, through :data:`~pytest_vramleak.meters.rank_reports.RANKS_ENV`). As it
decides, what is alive that was not before, and what the ranks reported, fail the check as left
behind. A fixture of a wider scope set up during the check owns what it started (:meth:`LeftBehind.adopt`).
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from .meters.autocast import autocast_on, describe_regions
from .meters.processes import Children, ProcessGroups, describe_children, describe_groups
from .meters.rank_reports import RANKS_ENV, collect
from .meters.rank_reports import describe as describe_ranks

if TYPE_CHECKING:
    from .result import CheckResult

_CHECKS = itertools.count()


class LeftBehind:
    """Process groups, child processes and rank reports of one check."""

    def __init__(self) -> None:
        self.process_groups = ProcessGroups()
        self.children = Children()
        self._ranks_folder: Path | None = None
        self._ranks_env_before: str | None = None
        self._autocast_before: frozenset[str] = frozenset()

    def begin(self) -> None:
        """Note what runs now; rank processes started from here on inherit where to report."""
        self.process_groups.begin()
        self.children.begin()
        self._autocast_before = autocast_on()
        self._ranks_folder = (
            Path(tempfile.gettempdir()) / f"vramleak-ranks-{os.getpid()}-{next(_CHECKS)}"
        )  # made by the first rank
        self._ranks_env_before = os.environ.get(RANKS_ENV)
        os.environ[RANKS_ENV] = str(self._ranks_folder)

    def adopt(self) -> None:
        """What was started meanwhile is a wider-scoped fixture's, not the check's."""
        self.process_groups.adopt()
        self.children.adopt()
        self._autocast_before = autocast_on()

    def judge(self, result: CheckResult, messages: list[str]) -> bool:
        """Whether something was left behind: each thing adds a sentence to ``messages`` and a
        block to the result's ``left_behind``."""
        result.left_behind = []
        left = False
        groups, children = self.process_groups.left(), self.children.left()
        if groups:
            left = True
            messages.append(f"left {len(groups)} torch.distributed process group(s) alive")
            result.left_behind.append(describe_groups(groups))
            result.details["process_groups_left"] = len(groups)
        if children:
            left = True
            messages.append(f"left {len(children)} child process(es) running")
            result.left_behind.append(describe_children(children))
            result.details["child_processes_left"] = len(children)
        autocast = autocast_on() - self._autocast_before
        if autocast:
            left = True
            messages.append(f"left an autocast region open ({', '.join(sorted(autocast))})")
            result.left_behind.append(describe_regions(autocast))
            result.details["autocast_regions_left"] = len(autocast)
        if self._ranks_folder is not None:
            result.ranks = collect(self._ranks_folder)
            line, text = describe_ranks(result.ranks)
            if line:
                left = True
                messages.append(line)
                result.left_behind.append(text)
        return left

    def end(self) -> None:
        """Stop watching; the environment is as it was, and the ranks' folder is gone."""
        self.process_groups.end()
        if self._ranks_folder is not None:
            if self._ranks_env_before is None:
                os.environ.pop(RANKS_ENV, None)
            else:
                os.environ[RANKS_ENV] = self._ranks_env_before
            shutil.rmtree(self._ranks_folder, ignore_errors=True)
            self._ranks_folder = None

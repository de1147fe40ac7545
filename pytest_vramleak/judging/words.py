"""The words the package decides with: each closed set is a ``Literal`` defined here once, beside
the defaults the rules share."""

from __future__ import annotations

from typing import Literal, get_args

from .sizes import parse_size

Outcome = Literal["passed", "leaked", "over_budget"]
"""What a check, or a test's runs, come to: within every budget, leaked, or over another budget."""
Verdict = Literal["passed", "leaked", "over_budget", "unchecked"]
"""A test's leak verdict in its record (beside pytest's outcome): an outcome, or ``unchecked``
where nothing could be measured (it failed, was skipped, or the plugin could not check it)."""
StepVerdict = Literal["passed", "leaked", "undecided"]
"""What a test's step checks came to: all passed, one grew, or none could decide."""
Pattern = Literal["grows", "kept_once", "settled"]
"""What a test's runs show of the memory it leaves (see :mod:`~pytest_vramleak.judging.repeats`)."""
FailOn = Literal["significant", "growth", "any"]
"""Which leaks fail a test (``--vramleak-fail-on``)."""
FAIL_ON: tuple[FailOn, ...] = get_args(FailOn)
GroupKind = Literal["tensor", "grad", "storage", "graph", "history"]
"""What a group of leaked memory is: tensors, gradients, storages kept without a tensor, the
saved tensors of an autograd graph, or kept autograd history."""
Reached = Literal["gc", "grad", "graph", "storage"]
"""How the census reached a tensor's storage: a tensor gc tracks, a gradient, a tensor an autograd
graph saved, or a storage object kept without a tensor (each of the group kinds but history)."""

KEPT_FLOOR_TEXT = "1 MiB"
KEPT_FLOOR = parse_size(KEPT_FLOOR_TEXT)
"""The default floor of ``significant``: memory a test keeps once (not growing) fails it from one
mebibyte on. A cached scalar, a metric's state, a lookup table built once or a tracing constant
keeps bytes to kilobytes; a model, a batch or an activation a test forgets to drop keeps
megabytes, and on a GPU every test that keeps one adds it to what the suite holds."""

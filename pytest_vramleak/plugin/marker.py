"""The ``vram_budget`` marker read from a test: its budgets, device and runs, or a usage error naming the test."""

from __future__ import annotations

from typing import Any

import pytest

from ..judging.sizes import SizeError, parse_size
from ..judging.verdict import Budget
from .options import check_device_spec
from .state import MARKER, session_of


def parse_marker(item: pytest.Item, mark: pytest.Mark) -> tuple[Budget, int | None]:
    """The budget a marker gives, and the runs it asks for (``repeat=``; None where it does not say)."""
    where = f"{item.nodeid}: @pytest.mark.{MARKER}"
    # The closest marker wins (a method's over its class's, a class's over its module's), but two
    # on one node leave no closest: pytest would take the first, which is not what anyone reads.
    marked = [node for node, _ in item.iter_markers_with_node(MARKER)]
    for node in dict.fromkeys(marked):
        if marked.count(node) > 1:
            if node is item:
                on = "the test (its decorators and pytest.param marks)"
            elif isinstance(node, pytest.Class):
                on = f"class {node.nodeid} (its decorators and its base classes')"
            else:
                on = f"{node.nodeid or 'the root folder'} (its pytestmark)"
            raise pytest.UsageError(
                f"{where}: {marked.count(node)} budgets on {on}: keep one; a budget on a test overrides its class's or module's"
            )
    if len(mark.args) > 1:
        raise pytest.UsageError(f"{where} takes one positional argument (peak), got {len(mark.args)}: {mark.args!r}")
    unknown = sorted(set(mark.kwargs) - {"peak", "leak", "device", "repeat", "reserved", "pinned"})
    if unknown:
        raise pytest.UsageError(
            f"{where}: unknown keyword {unknown[0]!r}; use peak, leak, device, repeat, reserved or pinned"
        )
    repeat = None
    if "repeat" in mark.kwargs and mark.kwargs["repeat"] is not None:
        settings = session_of(item.config).settings
        assert settings is not None
        repeat = check_repeat(mark.kwargs["repeat"], settings.warmup, f"{where}(repeat=...)")
    if mark.args and "peak" in mark.kwargs:
        raise pytest.UsageError(f"{where}: peak given both by position and by keyword")
    values = {
        "peak": mark.args[0] if mark.args else mark.kwargs.get("peak"),
        "leak": mark.kwargs.get("leak", 0),
        "reserved": mark.kwargs.get("reserved"),
        "pinned": mark.kwargs.get("pinned"),
    }
    sizes: dict[str, int | None] = {}
    for name, value in values.items():
        try:
            sizes[name] = None if value is None and name != "leak" else parse_size(value)
        except SizeError as error:
            raise pytest.UsageError(f"{where}({name}={value!r}): {error}") from None
    device = mark.kwargs.get("device")
    if device is not None:
        try:
            device = check_device_spec(device) if isinstance(device, str) else check_device_spec(repr(device))
        except ValueError as error:
            raise pytest.UsageError(f"{where}(device={device!r}): {error}") from None
    leak = sizes["leak"]
    assert leak is not None  # parse_size never returns None
    budget = Budget(peak=sizes["peak"], leak=leak, device=device, reserved=sizes["reserved"], pinned=sizes["pinned"])
    return budget, repeat


def check_repeat(value: Any, warmup: int, where: str) -> int:
    """A number of runs that leaves at least two measured after ``warmup``, or a usage error."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise pytest.UsageError(f"{where}: expected a whole number of runs >= 1, got {value!r}")
    if value > 1 and value < warmup + 2:
        raise pytest.UsageError(
            f"{where}: {value} runs leave {max(0, value - warmup)} measured after {warmup} warm-up runs; "
            f"at least 2 are needed: use repeat={warmup + 2} or more, or a shorter --vramleak-warmup"
        )
    return value


def vram_budget(
    peak: Any = None,
    *,
    leak: Any = 0,
    device: str | None = None,
    repeat: int | None = None,
    reserved: Any = None,
    pinned: Any = None,
) -> Any:
    """Put a test under a leak budget and a peak-memory budget: ``@vram_budget("2 GiB", leak="1 MiB")``.

    The same as ``@pytest.mark.vram_budget(...)``; sizes are bytes or strings such as ``"512 MiB"``.
    Also usable bare, ``@vram_budget``, for the defaults (no peak limit, no leak allowed).
    ``repeat=N`` runs the test N times to classify what it leaves (see ``--vramleak-repeat``);
    on CUDA, ``reserved`` and ``pinned`` bound the caching allocator's reserved memory and pinned
    host memory above their levels at the start of the call.
    """
    if callable(peak):
        return getattr(pytest.mark, MARKER)(peak)
    extra = {
        name: value
        for name, value in (("repeat", repeat), ("reserved", reserved), ("pinned", pinned))
        if value is not None
    }
    return getattr(pytest.mark, MARKER)(peak, leak=leak, device=device, **extra)

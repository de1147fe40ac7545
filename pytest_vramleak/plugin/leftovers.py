"""What outlives the tests that made it: fixtures' tensors alive after their teardown, and older tensors found changed between checks."""

from __future__ import annotations

from typing import Any

from ..tracking import gc_functions as gc
from .state import SessionState


def look_for_drift(session: SessionState, *, due: bool) -> None:
    """Where checks could not afford to compare every storage's size and every leaf's gradient,
    compare them now, between tests (``due``: as often as keeps the cost small; otherwise
    whenever a check deferred them), and report what changed, charged to no test."""
    tracker = session.tracker
    if tracker is None or tracker.active or not (tracker.drift_due() if due else tracker.deferred):
        return
    first, last = session.drift_span or ["", ""]
    session.drift_span = None
    try:
        found = tracker.drift()
    except Exception as error:  # said in the summary, never a crashed session
        session.output_errors.append(f"could not compare older tensors between checks: {type(error).__name__}: {error}")
        return
    if not found:
        return
    from ..holders.snapshot import describe  # (the naming layer loads where something is to be named)

    where = last if first == last else f"{first} to {last}"
    devices = sorted({ref.device for ref, _ in found})
    for device in devices:
        grown = [(ref, delta) for ref, delta in found if ref.device == device]
        finding: dict[str, Any] = {"where": where, "device": device, "bytes": sum(delta for _, delta in grown)}
        try:
            groups = describe({(ref.device, ref.pointer) for ref, _ in grown}, device)
        except Exception as error:  # the finding stands without its holders
            finding["held_by"] = [f"not named: vramleak could not search the heap: {type(error).__name__}: {error}"]
        else:
            finding["held_by"] = list(dict.fromkeys(chain for group in groups for chain in group.held_by))
        session.drift.append(finding)


def fixture_leftovers(session: SessionState) -> list[dict[str, Any]]:
    """Fixtures wider than a test whose storages are still alive once every fixture is torn down,
    with what holds them (a walk of the heap, paid only when some are left)."""
    leftovers: list[dict[str, Any]] = []
    memories = session.fixtures
    if not any(memory.alive() for memory in memories):
        return leftovers
    from ..holders.snapshot import describe

    gc.collect()  # fixture values on reference cycles (a model and its modules' hooks) are garbage, not kept
    for memory in memories:
        alive = memory.alive()
        if not alive:
            continue
        leftover: dict[str, Any] = {
            "fixture": memory.name,
            "scope": memory.scope,
            "where": memory.where,
            "bytes": sum(size for _, size in alive),
        }
        try:
            groups = describe([key for key, _ in alive], memory.device)
        except Exception as error:  # the finding stands without its holders
            leftover["held_by"], leftover["diagnoses"] = (
                [f"not named: vramleak could not search the heap: {type(error).__name__}: {error}"],
                [],
            )
        else:
            leftover["held_by"] = list(dict.fromkeys(chain for group in groups for chain in group.held_by))
            leftover["diagnoses"] = list(dict.fromkeys(finding for group in groups for finding in group.diagnoses))
        leftovers.append(leftover)
    return leftovers

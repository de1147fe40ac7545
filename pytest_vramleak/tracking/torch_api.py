"""What differs between the torch releases the plugin runs on, found by asking torch, not its version.

Each function here detects one behaviour or name once and says what to do where it is missing, so
the rest of the package reads one answer instead of checking version numbers:

- :func:`tensors_refer_to_their_class`: whether gc shows every tensor referring to its class, the
  fast way to list the live tensors. Older releases (2.4) report no referents at all for a tensor
  that C++ also holds (one an autograd graph saved, a TorchScript module's buffer); there the
  tensors are picked out of a pass over the whole heap, slower and complete.
- :func:`default_device`: the accelerator ``auto`` means, through ``torch.accelerator`` where it
  exists (2.6 on) and ``torch.cuda`` before.
- :func:`not_compiled`: a trace function of the plugin's, kept out of ``torch.compile``. Older
  releases (2.4) compile the frames a trace function runs in when it is called from a function
  being compiled (graph breaks and a warning in the user's run); newer ones leave them alone.
- :func:`version_notes`: the one-line notes the session header shows for a torch outside the tested
  range or one that lacks a feature the device in use would need.

The tested range is ``OLDEST_TESTED`` to ``NEWEST_TESTED``, the torch versions tox.ini runs.
"""

from __future__ import annotations

import functools
from typing import Any

from . import gc_functions as gc

OLDEST_TESTED = (2, 4)
NEWEST_TESTED = (2, 14)
"""The oldest and newest torch minor versions the test suite runs on (tox.ini's environments)."""


def _torch() -> Any:
    import torch

    return torch


@functools.cache
def tensors_refer_to_their_class() -> bool:
    """Whether gc shows a tensor that C++ also holds referring to its class (it does from torch 2.5
    or so; 2.4 shows no referents for it, so ``gc.get_referrers(torch.Tensor)`` misses it)."""
    torch = _torch()
    # (asked with gradients on, whatever mode the suite set: without a graph, C++ would not hold ``leaf``)
    with torch._C.DisableTorchFunction(), torch.inference_mode(False), torch.enable_grad():
        leaf = torch.zeros(1, requires_grad=True, device="cpu")
        product = leaf * leaf  # the graph saves ``leaf``: C++ holds it too
        try:
            return any(referent is type(leaf) for referent in gc.get_referents(leaf))
        finally:
            del product, leaf


def objects_referring_to(classes: tuple[type, ...]) -> list[Any]:
    """Every gc-tracked object (in the unfrozen generations) that is an instance of one of the tensor
    and storage ``classes``, among others: callers keep the objects whose ``type()`` they want.

    One C-level traversal (``gc.get_referrers``) where every tensor refers to its class, else the
    whole heap (``gc.get_objects()``), where the tensors that C++ also holds would be missed.
    """
    if tensors_refer_to_their_class():
        return gc.get_referrers(*classes)
    return gc.get_objects()


def default_device(torch: Any) -> str:
    """The device ``auto`` means: the current accelerator where one is present and starts, else ``cpu``."""
    accelerator = getattr(torch, "accelerator", None)
    try:
        if accelerator is None or not hasattr(accelerator, "current_accelerator"):  # torch older than 2.6
            return f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"
        if not accelerator.is_available():
            return "cpu"
        kind = accelerator.current_accelerator().type
        if kind == "mps":
            return "mps"
        index = getattr(accelerator, "current_device_index", None) or accelerator.current_device_idx  # 2.6
        return f"{kind}:{index()}"
    except RuntimeError:  # it is there but cannot start (no driver): the tests run on the CPU
        return "cpu"


def not_compiled(function: Any) -> Any:
    """``function`` run with ``torch.compile`` off where torch's compiler is loaded (through its public
    ``torch.compiler.disable``), else ``function`` itself: importing the compiler costs a second."""
    import sys

    if "torch._dynamo" not in sys.modules:
        return function
    try:
        return _torch().compiler.disable(function, recursive=True)
    except Exception:  # a torch without it: the frames are compiled, as before
        return function


def skips_compiling(code: Any) -> bool:
    """Tell torch's compiler, where it is loaded and can be told, to run frames of ``code`` as they
    are, never compiling them (a trace function's: its calls of Python functions must be wrapped
    with :func:`not_compiled` still); whether it was told."""
    import sys

    if "torch._dynamo" not in sys.modules:
        return True  # (nothing compiles a frame: the compiler is not loaded)
    try:
        from torch._dynamo.eval_frame import skip_code

        skip_code(code)
    except Exception:  # a torch without it
        return False
    return True


def _minor(version: str) -> tuple[int, int] | None:
    parts = version.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def version_notes(torch: Any, device: str) -> list[str]:
    """One sentence for each way this torch differs from the tested ones that a user should know of:
    a release outside the tested range, a feature the device in use needs that this torch lacks."""
    version = str(getattr(torch, "__version__", "unknown"))
    minor = _minor(version)
    notes = []
    if minor is not None and minor > NEWEST_TESTED:
        notes.append(
            f"torch {version} is newer than the newest tested ({'.'.join(map(str, NEWEST_TESTED))}): "
            "where its internals changed, a check that cannot read them says so on its test"
        )
    elif minor is not None and minor < OLDEST_TESTED:
        notes.append(f"torch {version} is older than the oldest supported ({'.'.join(map(str, OLDEST_TESTED))})")
    if device.startswith("cuda") and not hasattr(torch.cuda, "host_memory_stats"):
        notes.append(f"torch {version} has no torch.cuda.host_memory_stats: pinned host memory is not checked")
    return notes

"""Where a tensor was made, as a site reads it: the user's frames of the stack tracemalloc saved."""

from __future__ import annotations

import torch

from pytest_vramleak.tracking.sites import user_sites

TORCH_FILE = torch.overrides.__file__


def test_a_frame_repeated_at_the_same_line_is_shown_once() -> None:
    # modes on torch's stack each call the next through torch's own code: the user's line repeats,
    # once per mode, and the line that called into the first one must still be reached
    mode = ("/suite/test_it.py", 11, "__torch_function__")
    frames = [mode, (TORCH_FILE, 1700, "handle_torch_function")] * 5 + [("/suite/test_it.py", 29, "test_it")]
    assert user_sites(frames) == (mode, ("/suite/test_it.py", 29, "test_it"))


def test_a_recursive_function_at_other_lines_keeps_each_frame() -> None:
    frames = [("/suite/tree.py", 4, "walk"), ("/suite/tree.py", 6, "walk"), ("/suite/test_it.py", 9, "test_it")]
    assert user_sites(frames) == tuple(frames)

"""Where a tensor was made, as a site reads it: the user's frames of the stack tracemalloc saved."""

from __future__ import annotations

import sys
import tracemalloc

import torch

from pytest_vramleak.tracking.sites import SiteRecorder, _frames_of, objects_untraced, user_sites

TORCH_FILE = torch.overrides.__file__


def test_frames_repeated_at_one_line_are_shown_twice() -> None:
    # modes on torch's stack each call the next through torch's own code: the user's line repeats,
    # once per mode, and the line that called into the first one must still be reached
    mode = ("/suite/test_it.py", 11, "__torch_function__")
    frames = [mode, (TORCH_FILE, 1700, "handle_torch_function")] * 5 + [("/suite/test_it.py", 29, "test_it")]
    assert user_sites(frames) == (mode, mode, ("/suite/test_it.py", 29, "test_it"))


def test_two_scopes_on_one_line_are_both_shown() -> None:
    # a lambda called on the line that defines it, and the function around it: the same line twice
    # (functions are named later, from the source)
    frames = [("/suite/test_it.py", 8, ""), ("/suite/test_it.py", 8, "")]
    assert user_sites(frames) == tuple(frames)


def test_a_recursive_function_at_other_lines_keeps_each_frame() -> None:
    frames = [("/suite/tree.py", 4, "walk"), ("/suite/tree.py", 6, "walk"), ("/suite/test_it.py", 9, "test_it")]
    assert user_sites(frames) == tuple(frames)


def test_objects_made_while_untraced_are_not_traced_and_tracing_goes_on() -> None:
    """The plugin's own objects, made while it groups what a body made, are not traced (the
    memory tracemalloc counts does not grow by them, where the same objects made traced grow it);
    what is made after is traced again, and a user's own tracing is left alone."""
    recorder = SiteRecorder()
    recorder.start()
    try:
        assert recorder.owns_tracing
        made_traced: list[object] = [None] * 1000
        made_inside: list[object] = [None] * 1000
        traced = tracemalloc.get_traced_memory()[0]
        for index in range(1000):
            made_traced[index] = torch.ones(1)
        grew_traced = tracemalloc.get_traced_memory()[0] - traced
        untraced = tracemalloc.get_traced_memory()[0]
        with objects_untraced():
            for index in range(1000):
                made_inside[index] = torch.ones(1)
        grew_inside = tracemalloc.get_traced_memory()[0] - untraced
        after = torch.ones(1)
        assert grew_traced > 1000 * sys.getsizeof(made_traced[0])
        assert grew_inside < grew_traced / 10, (grew_inside, grew_traced)
        assert _frames_of(after)
    finally:
        recorder.stop()
    tracemalloc.start()
    try:
        with objects_untraced():
            users = torch.ones(1)
        assert _frames_of(users)
    finally:
        tracemalloc.stop()


def test_alike_tensors_share_one_group_object() -> None:
    """Grouping 10^5 alike tensors holds one group, not a copy of it per tensor."""
    from pytest_vramleak.tracking.sites import groups_of

    tensors = [torch.ones(4) for _ in range(100)] + [torch.ones(2, 2) for _ in range(100)]
    groups = groups_of(tensors, torch._C.TensorBase)
    assert len(groups) == 200
    assert len({id(group) for group in groups}) == 2
    assert groups[0] == (torch.Tensor, torch.float32, torch.Size([4]), torch.device("cpu"))


def test_the_storage_recorders_trace_function_runs_unwrapped_where_the_compiler_skips_it() -> None:
    # it runs for every call the test makes: torch.compiler.disable's wrapper around it cost a
    # compiling test (e3nn's) seconds; its frames are left to run as they are instead
    import torch._dynamo  # noqa: F401  (loaded: what start() must keep off the trace function)

    from pytest_vramleak.tracking.sites import StorageSites

    recorder = StorageSites()
    before = sys.gettrace()
    tracemalloc.start(1)
    try:
        sys.settrace(None)
        recorder.start()
        try:
            assert sys.gettrace() == recorder._call  # the method itself, not a wrapper
            kept = torch.ones(3)  # a function of this file returns below: its tensors are noted
            _made_here(kept)
        finally:
            recorder.stop()
        assert sys.gettrace() is None
        facts = kept.untyped_storage()
        assert recorder.site_of(kept, facts) is not None
    finally:
        tracemalloc.stop()
        sys.settrace(before)


def _made_here(tensor: torch.Tensor) -> torch.Tensor:
    return tensor

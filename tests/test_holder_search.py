"""The holder search's economies: what it collects, what it lists once, what it does not count as a holder."""

from __future__ import annotations


def test_the_frames_searched_are_the_callers_not_the_listing_functions_own() -> None:
    # The listing function's own frame in the list it returns would be a cycle (its locals hold the
    # list) keeping its caller's frame, and everything that frame's locals hold, until collected.
    from pytest_vramleak.referrers import _frames_not_ours

    names = [frame.f_code.co_name for frame in _frames_not_ours(set())]
    assert names[0] == "test_the_frames_searched_are_the_callers_not_the_listing_functions_own"

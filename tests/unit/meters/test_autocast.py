"""Autocast regions open in other threads, found from their stacks without running their code."""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import torch

from pytest_vramleak.meters.autocast import regions_in_other_threads


@pytest.fixture
def serve() -> Iterator[Callable[[str, Callable[[queue.Queue[object]], None]], None]]:
    """Start a named thread running ``loop(requests)`` and wait until it waits for a request; each
    is stopped (its loop returns on ``None``) after the test."""
    started: list[tuple[threading.Thread, queue.Queue[object]]] = []

    def start(name: str, loop: Callable[[queue.Queue[object]], None]) -> None:
        requests: queue.Queue[object] = queue.Queue()
        thread = threading.Thread(target=loop, args=(requests,), name=name, daemon=True)
        thread.start()
        started.append((thread, requests))
        deadline = time.monotonic() + 5
        while not _waiting(thread) and time.monotonic() < deadline:
            time.sleep(0.001)

    yield start
    for thread, requests in started:
        requests.put(None)
        thread.join(5)


def _waiting(thread: threading.Thread) -> bool:
    """Whether the thread waits in ``queue.Queue.get``."""
    frame = sys._current_frames().get(thread.ident or 0)
    while frame is not None:
        if frame.f_code.co_name == "get" and frame.f_code.co_filename == queue.__file__:
            return True
        frame = frame.f_back
    return False


def _until_none(requests: queue.Queue[object]) -> None:
    while requests.get() is not None:
        pass


@torch.autocast("cpu", dtype=torch.bfloat16)
def serve_forever(requests: queue.Queue[object]) -> None:
    _until_none(requests)


def serve_in_a_block(requests: queue.Queue[object]) -> None:
    with torch.autocast("cpu", dtype=torch.float16):
        _until_none(requests)


def serve_each_request(requests: queue.Queue[object]) -> None:
    while requests.get() is not None:
        with torch.autocast("cpu"):
            pass


def test_a_decorated_loop_and_a_with_block_are_found_with_their_thread_and_dtype(serve) -> None:
    serve("decorated", serve_forever)
    serve("in-a-block", serve_in_a_block)
    found = {region.thread: region for region in regions_in_other_threads()}
    assert set(found) == {"decorated", "in-a-block"}
    assert found["decorated"].function == "serve_forever() (test_autocast.py)"
    assert found["decorated"].dtype == "bfloat16"
    assert found["in-a-block"].function == "serve_in_a_block() (test_autocast.py)"
    assert found["in-a-block"].dtype == "float16"


def test_a_thread_that_enters_autocast_per_request_holds_no_region_between_them(serve) -> None:
    serve("per-request", serve_each_request)
    assert regions_in_other_threads() == []


def test_a_region_only_a_with_block_holds_is_named_only_where_one_thread_can_hold_it(serve) -> None:
    serve("per-request", serve_each_request)  # its code names autocast too
    serve("in-a-block", serve_in_a_block)
    assert regions_in_other_threads() == []  # two threads could hold it: neither is named


def test_the_checks_own_thread_is_left_to_its_own_check(serve) -> None:
    serve("decorated", serve_forever)
    with torch.autocast("cpu"):
        assert regions_in_other_threads() == []

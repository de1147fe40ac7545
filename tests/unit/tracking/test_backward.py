"""The backward watch: which tensors a backward pass may give a gradient, and torch left as it was."""

from __future__ import annotations

import pytest
import torch
import torch.autograd.graph

from pytest_vramleak.tracking.backward import BackwardWatch, graph_leaves


def _entry_points() -> tuple[object, object]:
    return torch.autograd._engine_run_backward, torch.autograd.graph._engine_run_backward


@pytest.fixture
def noted():
    """A started watch's notes, one list per backward pass; torch's entry point restored after."""
    found: list[list[torch.Tensor]] = []
    watch = BackwardWatch(found.append)
    original = _entry_points()
    assert watch.start() and watch.watching
    yield found
    watch.stop()
    assert _entry_points() == original


def test_a_backward_pass_notes_the_leaves_its_graph_reaches(noted) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    frozen = torch.nn.Parameter(torch.ones(2), requires_grad=False)
    (model(torch.ones(3, 4)) * frozen).sum().backward()
    assert [{id(tensor) for tensor in tensors} for tensors in noted] == [{id(p) for p in model.parameters()}]


def test_backward_on_a_leaf_and_backward_with_inputs_note_those(noted) -> None:
    leaf = torch.ones(3, requires_grad=True)
    other = torch.ones(3, requires_grad=True)
    hidden = leaf * other
    leaf.backward(torch.ones(3))
    hidden.sum().backward(inputs=[hidden])
    assert [id(tensor) for tensor in noted[0]] == [id(leaf)]
    assert id(hidden) in {id(tensor) for tensor in noted[1]}  # a non-leaf input: its .grad is written too


def test_autograd_grad_writes_no_gradient_and_notes_nothing(noted) -> None:
    weight = torch.ones(3, requires_grad=True)
    torch.autograd.grad((weight * 2).sum(), [weight])
    assert noted == [] and weight.grad is None


def test_gradient_edges_are_followed() -> None:
    weight = torch.ones(3, requires_grad=True)
    hidden = weight * 2
    edge = torch.autograd.graph.get_gradient_edge(hidden)
    assert [id(tensor) for tensor in graph_leaves((edge,), ())] == [id(weight)]


def test_the_walk_runs_no_code_of_a_tensor_subclass(noted) -> None:
    calls: list[str] = []

    class Logged(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            calls.append(getattr(func, "__name__", str(func)))
            return super().__torch_function__(func, types, args, kwargs or {})

    def run() -> list[str]:
        calls.clear()
        weight = torch.ones(3).as_subclass(Logged).requires_grad_()
        (weight * 2).sum().backward()
        return list(calls)

    watched = run()
    assert len(noted) == 1
    BackwardWatch(lambda tensors: None).stop()  # a watch never started changes nothing
    assert calls and watched == run()


def test_a_replacement_made_over_the_watch_is_left_in_place() -> None:
    found: list[list[torch.Tensor]] = []
    watch = BackwardWatch(found.append)
    original = _entry_points()
    watch.start()
    ours = torch.autograd._engine_run_backward

    def theirs(*args, **kwargs):
        return ours(*args, **kwargs)

    torch.autograd._engine_run_backward = torch.autograd.graph._engine_run_backward = theirs
    try:
        assert not watch.watching
        watch.stop()
        assert _entry_points() == (theirs, theirs)
    finally:  # they put back what they replaced: the watch, stopped, only passes through
        torch.autograd._engine_run_backward = torch.autograd.graph._engine_run_backward = ours
    weight = torch.ones(3, requires_grad=True)
    (weight * 2).sum().backward()
    assert found == [] and weight.grad is not None
    torch.autograd._engine_run_backward, torch.autograd.graph._engine_run_backward = original


def test_a_walk_that_fails_leaves_backward_to_run_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    import pytest_vramleak.tracking.backward as backward

    def broken(roots, inputs):
        raise RuntimeError("unreadable graph")

    monkeypatch.setattr(backward, "graph_leaves", broken)
    watch = BackwardWatch(lambda tensors: None)
    watch.start()
    try:
        weight = torch.ones(3, requires_grad=True)
        (weight * 2).sum().backward()
    finally:
        watch.stop()
    assert watch.failed and weight.grad is not None


def test_a_check_whose_watch_failed_compares_every_gradient(monkeypatch: pytest.MonkeyPatch) -> None:
    import pytest_vramleak.tracking.backward as backward
    from pytest_vramleak.tracking.tracker import COMPARED_PER_CHECK, Tracker

    params = [torch.nn.Parameter(torch.zeros(1)) for _ in range(COMPARED_PER_CHECK + 1)]
    monkeypatch.setattr(backward, "graph_leaves", lambda roots, inputs: 1 / 0)
    tracker = Tracker()
    tracker.begin()
    try:
        before = tracker.observe()
        (params[0] * 2).sum().backward()
        tracker.observe(since=before)
        assert tracker.grad_reads == 1
        assert [ref.nbytes for ref in tracker.created("cpu", since=before.clock)] == [4]
    finally:
        tracker.end()


def _made_on(tensor: torch.Tensor) -> int | None:
    """The line of this file where tracemalloc saw the tensor's Python object made."""
    from pytest_vramleak.tracking.sites import _frames_of

    frames = _frames_of(tensor) or []
    return next((line for filename, line, _ in frames if filename == __file__), None)


def test_while_tracing_a_gradient_is_made_where_backward_was_called(noted, recwarn) -> None:
    from pytest_vramleak.tracking.sites import SiteRecorder

    model = torch.nn.Linear(4, 4)
    hidden = model(torch.ones(2, 4))
    recorder = SiteRecorder()
    recorder.start()
    try:
        (hidden * hidden).sum().backward(inputs=[hidden, model.weight])  # backward
        line = _made_on(model.weight.grad)
    finally:
        recorder.stop()
    with open(__file__) as source:
        backward_line = next(n for n, text in enumerate(source, 1) if text.rstrip().endswith("# backward"))
    assert line == backward_line
    assert not recwarn.list  # (nothing read .grad of the input that is no leaf)


def test_without_tracing_the_gradient_is_left_unread(noted) -> None:
    from pytest_vramleak.tracking.sites import SiteRecorder

    model = torch.nn.Linear(4, 4)
    model(torch.ones(2, 4)).sum().backward()
    recorder = SiteRecorder()
    recorder.start()
    try:
        gradient = model.weight.grad  # read
        line = _made_on(gradient)
    finally:
        recorder.stop()
    with open(__file__) as source:
        read_line = next(n for n, text in enumerate(source, 1) if text.rstrip().endswith("# read"))
    assert line == read_line  # its object was made here, not by the watch during backward

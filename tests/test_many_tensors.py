"""A test that keeps thousands of tensors: its groups are counted whole, and their holders and
sites are looked for in a bounded sample of each."""

from __future__ import annotations

import textwrap
import warnings

import pytest

from pytest_vramleak.tracking import sites as sites_module
from pytest_vramleak.tracking.sites import SITES_PER_GROUP, SiteRecorder


def test_one_list_of_many_tensors_is_named_with_its_full_count(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_many=textwrap.dedent(
            """
            import torch

            KEPT = []

            def test_keeps_many():
                for _ in range(3000):
                    KEPT.append(torch.ones(4))
            """
        )
    )
    # (a process of its own: 3,000 tensors kept in this worker would put later inline runs in the
    # mode of a process holding over 2,000 storages, where growth in place is charged to no test)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--vramleak")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "float32?4? on cpu: 3000 tensors, 46.9 KiB",
            "    allocated at test_many.py:7 in test_keeps_many()",
            "    held by test_many.KEPT?*?",
            "    held by test_many.KEPT?*?",
            "    held by test_many.KEPT?*?",
            "    ... and 2,997 more alike, whose holders were not searched",
        ]
    )


@pytest.mark.parametrize(
    ("per_run", "sites", "runs", "noted"),
    [
        (3000, "auto", 3, ", the second recording where tensors are made (each run more"),
        (3000, "off", 3, " (each run more would read and name as many)"),
        (100, "auto", 5, None),
    ],
)
def test_a_first_run_keeping_many_storages_is_confirmed_by_two_runs_the_last_recording_sites(
    pytester: pytest.Pytester, per_run: int, sites: str, runs: int, noted: str | None
) -> None:
    """From 2,000 storages kept by the first run on, two runs again confirm the growth and the
    second records where tensors are made (three runs, each read whole and named; three without
    sites too: the verdict does not hang on them); fewer are confirmed by three, and the test runs
    once more to record sites (five runs)."""
    pytester.makepyfile(
        test_many=textwrap.dedent(
            f"""
            import pathlib
            import torch

            KEPT = []

            def test_keeps_many():
                with pathlib.Path("runs.txt").open("a") as runs:
                    runs.write("run\\n")
                for _ in range({per_run}):
                    KEPT.append(torch.ones(4))
            """
        )
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--vramleak", f"--vramleak-sites={sites}")
    result.assert_outcomes(failed=1)
    assert (pytester.path / "runs.txt").read_text().count("run") == runs
    result.stdout.fnmatch_lines([f"ran {3 if per_run > 2000 else 4} times (1 warm-up)*"])
    if sites == "auto":
        result.stdout.fnmatch_lines(["*allocated at test_many.py:10 in test_keeps_many()"])
    text = result.stdout.str()
    if noted is None:
        assert "2 runs again confirm it" not in text
    else:
        assert "the first run kept 3,000 storages: 2 runs again confirm it, not 3" + noted in text


def test_many_storages_kept_once_pass_after_two_runs_again(pytester: pytest.Pytester) -> None:
    """A cache the first run fills with thousands of tensors, and no later run adds to, is kept
    once: it passes, confirmed by two runs again."""
    pytester.makepyfile(
        test_cache=textwrap.dedent(
            """
            import pathlib
            import torch

            CACHE = []

            def test_fills_a_cache_once():
                with pathlib.Path("runs.txt").open("a") as runs:
                    runs.write("run\\n")
                if not CACHE:
                    CACHE.extend(torch.ones(4) for _ in range(3000))
            """
        )
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--vramleak")
    result.assert_outcomes(passed=1)
    assert (pytester.path / "runs.txt").read_text().count("run") == 3


def test_tensors_of_three_shapes_are_three_groups_each_counted_whole(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_shapes=textwrap.dedent(
            """
            import torch

            KEPT = []

            def test_keeps_three_shapes():
                for index in range(3000):
                    KEPT.append(torch.ones(index % 3 + 1))
            """
        )
    )
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--vramleak", "--vramleak-confirm=0", "--vramleak-fail-on=any"
    )
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    for size, kib in ((1, "3.9"), (2, "7.8"), (3, "11.7")):
        assert f"float32[{size}] on cpu: 1000 tensors, {kib} KiB" in text
    assert text.count("held by test_shapes.KEPT[") == 9
    assert text.count("    ... and 997 more alike, whose holders were not searched") == 3


def test_sites_are_captured_for_a_sample_of_each_group(monkeypatch: pytest.MonkeyPatch) -> None:
    """The recording run looks up where at most ``SITES_PER_GROUP`` tensors of each group were
    made; the rest of a group takes whether library code made them from its sample."""
    torch = pytest.importorskip("torch")
    looked_up = []
    frames_of = sites_module._frames_of

    def counting(obj: object) -> object:
        looked_up.append(obj)
        return frames_of(obj)

    monkeypatch.setattr(sites_module, "_frames_of", counting)
    recorder = SiteRecorder()
    recorder.start()
    try:
        tensors = [torch.ones(4) for _ in range(500)] + [torch.ones(2, 2) for _ in range(500)]
        recorder.capture([(tensor, tensor.untyped_storage()) for tensor in tensors])
    finally:
        recorder.stop()
    assert len(looked_up) == 2 * SITES_PER_GROUP
    assert {recorder.made_inside_library(tensor) for tensor in tensors} == {False}
    assert recorder.site_of(tensors[-1], tensors[-1].untyped_storage()) is not None


def test_tensors_made_before_tracing_take_the_answer_of_a_full_sample() -> None:
    """Tensors made before the recorder began (an earlier run's) are grouped as they are asked
    about, once tracing stopped: they take their group's answer where the sample of the group
    was full and agreed, else none."""
    torch = pytest.importorskip("torch")
    earlier = [torch.ones(4) for _ in range(100)]
    older_of_a_small_group = [torch.ones(3)]
    recorder = SiteRecorder()
    recorder.start()
    try:
        assert recorder.owns_tracing
        later = [torch.ones(4) for _ in range(SITES_PER_GROUP + 5)]
        few = [torch.ones(3) for _ in range(SITES_PER_GROUP - 1)]
        recorder.capture([(tensor, tensor.untyped_storage()) for tensor in later + few])
    finally:
        recorder.stop()
    assert {recorder.made_inside_library(tensor) for tensor in earlier + later + few} == {False}
    assert recorder.made_inside_library(older_of_a_small_group[0]) is None


def test_what_set_up_and_the_body_made_are_captured_at_once() -> None:
    """As the body ends, the pairs set-up made and the body's objects (each with its own storage)
    are sampled together: each group's sample answers for its tensors made before tracing."""
    torch = pytest.importorskip("torch")
    earlier_setup, earlier_body = [torch.ones(3) for _ in range(10)], [torch.ones(4) for _ in range(10)]
    recorder = SiteRecorder()
    recorder.start()
    try:
        setup = [torch.ones(3) for _ in range(SITES_PER_GROUP + 5)]
        body = [torch.ones(4) for _ in range(SITES_PER_GROUP + 5)]
        recorder.capture_objects(setup + body, [t.untyped_storage() for t in setup] + [None] * len(body))
    finally:
        recorder.stop()
    assert {recorder.made_inside_library(t) for t in earlier_setup + earlier_body + setup + body} == {False}
    assert recorder.site_of(body[-1], body[-1].untyped_storage()) is not None
    assert body[-1].untyped_storage().data_ptr() in recorder.captured_pointers()


@pytest.mark.parametrize(
    "make",
    [
        lambda torch: [torch.ones(4), torch.ones(2, 3, dtype=torch.int8), torch.nn.Parameter(torch.ones(3))],
        lambda torch: [torch.ones(4).untyped_storage(), torch.ones(2).untyped_storage()],
        lambda torch: [torch.ones(4), torch.ones(4).untyped_storage(), torch.ones(2).storage(), torch.ones(1)],
        lambda torch: [torch.ones(4), torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])],
        lambda torch: [],
    ],
    ids=["tensors", "storages", "mixed", "nested", "none"],
)
def test_objects_are_grouped_alike_one_at_a_time_and_all_at_once(make: object) -> None:
    torch = pytest.importorskip("torch")
    with warnings.catch_warnings():  # (typed storages and strided nested tensors are deprecated)
        warnings.simplefilter("ignore")
        objects = make(torch)  # type: ignore[operator]
    base = torch._C.TensorBase
    with torch._C.DisableTorchFunction():
        one_at_a_time = [sites_module._group_of(obj, base, {}) for obj in objects]
        assert sites_module.groups_of(objects, base) == one_at_a_time
        assert sites_module.groups_of(objects, base, distinct=True) == set(one_at_a_time)


def test_the_recording_run_pairs_only_what_was_read_since_it_began() -> None:
    """The pairs of the tensors and storage objects read since a clock keep the order
    :meth:`Index.pairs` gives them (storage objects last); those read before are left out."""
    torch = pytest.importorskip("torch")
    from pytest_vramleak.tracking.index import Index
    from pytest_vramleak.tracking.ledger import Ledger

    ledger = Ledger()
    index = Index(ledger)
    old, new = torch.ones(4), torch.ones(4)
    index.reread([old])
    ledger.clock += 1
    index.reread([new])
    refs = [index.storages[id(tensor.untyped_storage())] for tensor in (old, new)]
    later = index.pairs_since(refs, ledger.clock)
    new_storage = new.untyped_storage()
    assert [(id(a), id(b)) for a, b in later] == [(id(new), id(new_storage)), (id(new_storage), id(new_storage))]
    assert index.pairs_since(refs, ledger.clock + 1) == []

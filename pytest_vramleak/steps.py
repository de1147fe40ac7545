"""Watching repeated steps (training or inference iterations) for memory that keeps growing."""

from __future__ import annotations

import inspect
import operator
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from .holders.naming import name_storages
from .holders.referrers import NamedRoot
from .holders.snapshot import STEP_FUNCTION, Leak, meter_for
from .judging.sizes import format_size
from .judging.verdict import (
    LATE_GROWTH_STEPS,
    SURE_STEPS,
    TREND_CERTAIN,
    GrowthVerdict,
    floor_rise,
    grew_late,
    growth_message,
    judge_growth,
    rose_each,
    trend_score,
)
from .meters.devices import Meter
from .readings import StepReading, readings_for
from .tracking.sites import SiteRecorder
from .tracking.tracker import NODE_BYTES, KeptGraph, StorageRef, Tracker

RECORDED_STEPS = 2
"""Measured steps whose allocation sites are recorded, from the first that grows; the rest of a
loop runs without: a clean loop records none."""


@dataclass
class StepResult:
    """What a step check measured and decided."""

    device: str
    warmup: int
    steps: list[int]
    """Bytes above the warm-up baseline after each measured step."""
    verdict: GrowthVerdict | None
    """None where the loop stopped before two steps were measured (see ``reason``)."""
    leak: Leak | None = None
    """Tensors created after warm-up that outlived a step, with their holders; only when memory grew."""
    warmup_steps: list[int] = field(default_factory=list)
    """Bytes above the warm-up baseline after each warm-up step (the last is the baseline: 0)."""
    planned: int = 0
    """Steps the loop was asked for."""
    ran: int = 0
    """Steps that ran to their end (fewer where the loop was left early)."""
    reason: str | None = None
    """Why the loop was not judged."""
    fragmentation: GrowthVerdict | None = None
    """CUDA: the growth rule applied to memory reserved but not allocated after each measured step,
    where it grew while allocated memory did not (the caching allocator fragmenting)."""
    history: list[int] = field(default_factory=list)
    """Autograd nodes made after warm-up, before each measured step began, that tensors alive
    after that step keep: each step's graph kept past its step (empty where torch does not
    number its nodes)."""
    history_verdict: GrowthVerdict | None = None
    """The growth rule applied to ``history`` (at :data:`~pytest_vramleak.tracking.tracker.NODE_BYTES` a node)."""
    kept: list[int] | None = None
    """CPU: ``steps`` less the storages each step made and left alive (its batch, its outputs):
    what earlier steps kept, net of what they freed."""
    undecided: str | None = None
    """Why the measured steps could not tell growth from the steps' own tensors varying in size."""

    @property
    def grows(self) -> bool:
        return (self.verdict is not None and self.verdict.grows) or self.fragmentation is not None or self.history_grows

    @property
    def history_grows(self) -> bool:
        return self.history_verdict is not None and self.history_verdict.grows

    @property
    def stopped_early(self) -> bool:
        """The loop was left (``break``, ``return``, an exception) before its last step ended."""
        return self.ran < self.planned

    @property
    def settled_after(self) -> int | None:
        """Where memory rose and then stayed flat: the loop's step (from 0) after which it did."""
        if self.verdict is None or self.verdict.settled_at is None:
            return None
        return self.warmup + self.verdict.settled_at - 1

    def describe(self) -> str:
        """The failure text of a loop that grew, or a line on one that settled or was not judged."""
        if self.reason:
            return self.reason
        if self.undecided and not self.grows:
            return self.undecided
        if self.fragmentation is not None:
            growth = self.fragmentation
            return (
                f"memory reserved but not allocated grew {format_size(growth.per_step_bytes)} per step over {len(self.steps)} "
                f"measured steps ({format_size(growth.kept_bytes)} in total) on {self.device}, while allocated memory did not: "
                "the caching allocator's cache is fragmenting, so reserved memory "
                "climbs toward an out-of-memory error; set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, or keep "
                "tensor shapes steady across steps (pad variable-length batches to a few sizes)"
            )
        if self.grows:
            assert self.verdict is not None
            early = (
                f" (the loop was left early: {len(self.steps)} of {self.planned - self.warmup} steps measured)"
                if self.stopped_early
                else ""
            )
            lines = []
            if self.verdict.grows:
                lines += [
                    self.verdict.message + early,
                    "after each measured step, above the warm-up baseline: "
                    + ", ".join(format_size(s) for s in self.steps),
                ]
                if self.kept is not None and self.kept != self.steps:
                    lowest = min(self.kept)  # its level is net of what the first step freed: see decide()
                    lines.append(
                        "of which made by earlier measured steps and still alive, net of what they freed, from the lowest: "
                        + ", ".join(format_size(kept - lowest) for kept in self.kept)
                    )
            if self.history_grows:
                lines += [
                    self._history_message() + ("" if self.verdict.grows else early),
                    "autograd nodes kept from earlier steps after each measured step: "
                    + ", ".join(f"{n:,}" for n in self.history),
                ]
            if self.leak is not None:
                heading = (
                    "tensors created after warm-up that outlived their step:"
                    if self.verdict.grows
                    else "what keeps that history:"
                )
                lines += [heading, self.leak.render()]
            if self.undecided:  # the history grew; what the storages did is not decided
                lines.append(self.undecided)
            return "\n".join(lines)
        settled = self.settled_after
        if settled is not None:
            assert self.verdict is not None
            return (
                f"memory rose by {format_size(self.verdict.kept_bytes)} during the measured steps and stayed flat after "
                f"step {settled} (settled: not a leak); warmup={settled + 1} would leave it out of the measured steps"
            )
        return ""

    def _history_message(self) -> str:
        growth = self.history_verdict
        assert growth is not None
        # The rate of the series printed beside it (0, 11, 22: 11 a step), where it has two figures.
        history = self.history
        per_step = (
            (history[-1] - history[0]) / (len(history) - 1) if len(history) > 1 else growth.per_step_bytes / NODE_BYTES
        )
        nodes = f"{per_step:,.0f}" if per_step >= 10 else f"{per_step:,.1f}".removesuffix(".0")
        noun = "node" if nodes == "1" else "nodes"
        return (
            f"the autograd history kept across steps grew {nodes} {noun} per step over {len(self.history)} measured steps "
            f"(about {format_size(round(per_step * NODE_BYTES))} of host memory per step; {self.history[-1]:,} nodes after the last): "
            "a tensor that outlives its step links each step's graph to the one before, even where backward freed "
            "what the graph saved; keep loss.item() or loss.detach() instead"
        )


def decide(
    figures: Sequence[int], kept: Sequence[int] | None, tolerance: int, device: str
) -> tuple[GrowthVerdict, str | None]:
    """The growth verdict on a loop's figures, and why it is undecided where it is.

    On CPU ``kept`` (see :attr:`StepResult.kept`) leaves out what each step made and still
    holds, whose size varies with its batch. Its level says nothing (the first measured step
    frees what warm-up made, gradients and a batch, and replaces it with its own, which ``kept``
    leaves out), only its changes do: it is judged from its lowest figure. Memory grows where
    ``kept`` grows by the rule of :func:`~pytest_vramleak.judging.verdict.judge_growth`, at ``kept``'s
    rate.

    ``kept`` sees what a step keeps one step late: where each of the last
    :data:`~pytest_vramleak.judging.verdict.LATE_GROWTH_STEPS` figures rose and each of the last but one
    of ``kept`` did, that is growth that started late. Where ``figures`` grow and ``kept`` did
    not rise, no tensor outlived the step after the one that made it: either each step replaces
    a tensor by a bigger one (``torch.cat`` onto itself), which rises at nearly every step, or
    the steps' own tensors vary in size. A rise as steady as
    :data:`~pytest_vramleak.judging.verdict.TREND_CERTAIN` asks is growth. A weaker one is not, where
    the steps are enough for a rise at every step to reach it
    (:data:`~pytest_vramleak.judging.verdict.SURE_STEPS`); over fewer steps, it is undecided.

    Over fewer than :data:`~pytest_vramleak.judging.verdict.SURE_STEPS` measured steps, growth every
    third step rises once or twice, and a loop that rose once and settled, or that keeps a
    tensor every third step, show the same figures: there memory that did not grow is undecided
    where a tensor a measured step made outlived the step after it (``kept`` rose from one step
    to the next). And growth is undecided where the figures rose and then held flat while
    ``kept`` grew: ``kept`` sees what a step keeps one step late, and state that appeared once
    (an optimizer's) or gradients made again after being set to None count as kept in the step
    after the figures stopped rising. From :data:`~pytest_vramleak.judging.verdict.SURE_STEPS` steps on,
    every loop is decided.

    Where ``kept`` is not known (an allocator counts the memory), the rule applies to ``figures``.
    """
    verdict = judge_growth(figures, tolerance, device)
    if kept is None or len(kept) != len(figures):
        return verdict, None
    count, floor = len(figures), min(kept)
    lasting_figures = [value - floor for value in kept]
    lasting = judge_growth(lasting_figures, tolerance, device)
    if lasting.grows:
        if count < SURE_STEPS and _held_flat(figures, verdict, tolerance):
            return GrowthVerdict(False, verdict.growth_bytes, 0.0, ""), (
                f"undecided: memory rose {format_size(verdict.kept_bytes)} over {count} measured steps on {device} and "
                f"then held flat, while tensors that measured steps made outlived the step after them: fewer than {SURE_STEPS} "
                "measured steps cannot tell state that appeared once (an optimizer's, gradients made again after being set "
                f"to None) from growth; {_MORE_STEPS}"
            )
        # At the rate of what the steps kept, and the total that rate makes: its floor is no
        # baseline, so where it did not grow late, the rate is how fast its floor rose (what the
        # last step holds above it includes a tooth of whatever the steps replace, gradients
        # set to None every other step).
        rate = lasting.per_step_bytes if grew_late(lasting_figures, tolerance) else floor_rise(lasting_figures)
        total = round(rate * count)
        message = growth_message(rate, count, total, tolerance, device)
        return GrowthVerdict(True, figures[-1], rate, message, None, total), None
    if not verdict.grows:
        if count < SURE_STEPS and any(
            after - before > tolerance for before, after in zip(kept, kept[1:], strict=False)
        ):
            return verdict, (
                f"undecided: memory did not grow over {count} measured steps on {device}, but tensors that measured steps "
                f"made outlived the step after them: fewer than {SURE_STEPS} measured steps cannot tell memory that "
                f"settled or varies from growth every few steps; {_MORE_STEPS}"
            )
        return verdict, None
    if (rose_each(figures, LATE_GROWTH_STEPS) and rose_each(kept, LATE_GROWTH_STEPS - 1)) or trend_score(
        figures
    ) >= TREND_CERTAIN:
        return verdict, None
    if count >= SURE_STEPS:  # a rise at every step would have been steady enough: the steps' own tensors vary
        return GrowthVerdict(False, verdict.growth_bytes, 0.0, ""), None
    return GrowthVerdict(False, verdict.growth_bytes, 0.0, ""), (
        f"undecided: memory rose {format_size(verdict.kept_bytes)} over {count} measured steps on {device}, but no "
        "tensor a measured step made outlived the step after it, and the rise is not steady enough to tell a tensor "
        f"replaced by a bigger one each step from the steps' own tensors varying in size; {_MORE_STEPS}"
    )


_MORE_STEPS = "allow more steps with steps(n, warmup=k, max_steps=m)"


def _held_flat(figures: Sequence[int], verdict: GrowthVerdict, tolerance: int) -> bool:
    """Whether the figures settled (see :class:`~pytest_vramleak.judging.verdict.GrowthVerdict`) and
    stayed within ``tolerance`` of one another from their last new high on."""
    if verdict.settled_at is None:
        return False
    since = figures[verdict.settled_at - 1 :]
    return max(since) - min(since) <= tolerance


def _whole(value: Any) -> int | None:
    """``value`` as an int where it is an integer of any type but bool, else None."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


@dataclass
class StepWatcher:
    """Runs steps, measures memory after each, and decides whether it keeps growing.

    ``warmup`` steps run first unmeasured, so state created lazily (optimizer moments, cuBLAS
    workspaces, caches filled on first use) is part of the baseline rather than a leak.
    """

    device: str | None = "auto"
    warmup: int = 2
    tolerance: int = 0
    meter: Meter | None = None
    tracker: Tracker | None = None
    """Tracks storages between steps; one is made for the loop when none is given."""
    record_sites: bool = True
    """Record where the tensors of the first measured steps are made (see :mod:`pytest_vramleak.tracking.sites`)."""
    on_result: Callable[[StepResult], None] | None = None
    """Called with each loop's result as the loop ends, also one left early."""
    named_roots: Callable[[], Sequence[NamedRoot]] | None = None
    """Values to name as their owner calls them when they hold a leak (a test's fixtures)."""
    explain: bool = True
    """Where memory grew, name the tensors that outlived their step and what holds them
    (``StepResult.leak``): a search of the heap, a good part of a second in a large process.
    With ``False`` the check gives its verdict alone (``leak`` stays None) and records no
    allocation sites: the verdict does not depend on the explanation."""
    results: list[StepResult] = field(default_factory=list)

    def check_arguments(self, n: int, warmup: int | None, max_steps: int | None = None) -> tuple[int, int, int]:
        """``(n, warm-up, max_steps)`` for ``steps(n, warmup=..., max_steps=...)`` as ints;
        ValueError for arguments that cannot work. ``max_steps`` is ``n`` where not given.

        Any integer type counts (``numpy.int64``, a 0-d integer tensor: what ``operator.index``
        takes), but not ``bool``."""
        warmup = self.warmup if warmup is None else warmup
        whole = [_whole(value) for value in (n, warmup)]
        if whole[0] is None or whole[1] is None or whole[1] < 0:
            raise ValueError(f"steps(n, warmup=k) takes whole numbers, got n={n!r}, warmup={warmup!r}")
        n, warmup = whole[0], whole[1]
        if n - warmup < 2:
            raise ValueError(
                f"steps({n}, warmup={warmup}) leaves {max(0, n - warmup)} measured step(s); at least 2 are needed"
            )
        if max_steps is None:
            return n, warmup, n
        most = _whole(max_steps)
        if most is None or most < n:
            raise ValueError(
                f"steps(n, max_steps=m) takes a whole number m of at least n={n}, got max_steps={max_steps!r}"
            )
        return n, warmup, most

    def steps(
        self, n: int, *, warmup: int | None = None, max_steps: int | None = None, step: Callable[..., Any] | None = None
    ) -> Iterator[int]:
        """Yield ``0 .. n-1``; after the loop, ``self.results[-1]`` holds the verdict.

        The first ``warmup`` iterations are not measured; at least two must remain. Where the
        ``n`` steps leave the verdict undecided (see :func:`decide`), the loop runs on to twice
        as many steps, then four times, up to ``max_steps`` in all, until it is decided. A loop
        left early is judged on the steps measured so far where there are two or more. ``step``
        is the function :meth:`check` runs: where it keeps a leak (in a closure variable), it is
        named as its holder.
        """
        n, warmup, max_steps = self.check_arguments(n, warmup, max_steps)
        meter = self.meter or meter_for(self.device)
        named = self.named_roots
        if step is not None:
            root = NamedRoot(
                f"{STEP_FUNCTION}{getattr(step, '__qualname__', type(step).__name__)} given to check()", step, "step"
            )
            others = self.named_roots
            named = (lambda: [*others(), root]) if others is not None else (lambda: [root])
        loop = _Loop(meter, self.tracker or Tracker(meter.name), self.record_sites and self.explain, named)
        loop.open()
        ran = 0
        try:
            if warmup == 0:
                loop.take_baseline()
            index, look = 0, n
            while index < look:
                yield index
                ran = index + 1
                if index < warmup - 1:
                    loop.measure_warmup()
                elif index == warmup - 1:
                    loop.take_baseline()
                else:
                    loop.measure_step()
                index += 1
                if (
                    index == look < max_steps
                    and decide(loop.figures(), loop.kept_figures(), self.tolerance, meter.name)[1]
                ):
                    # undecided: run as many steps again (up to max_steps) and look once more;
                    # looking after every step would give noise a chance at each look
                    look = min(2 * look, max_steps)
        finally:
            # Also where the loop is left early: the generator is closed, and nothing may be raised.
            result = self._judge(loop, warmup, n, ran)
            loop.close()
            self.results.append(result)
            if self.on_result is not None:
                self.on_result(result)

    def _judge(self, loop: _Loop, warmup: int, planned: int, ran: int) -> StepResult:
        device = loop.meter.name
        figures = loop.figures()
        if len(figures) < 2:
            reason = f"not checked: the loop was left early, with {len(figures)} of {planned - warmup} steps measured (at least 2 are needed)"
            return StepResult(device, warmup, figures, None, None, loop.warmup_figures(), planned, ran, reason)
        kept = loop.kept_figures()
        verdict, undecided = decide(figures, kept, self.tolerance, device)
        if undecided and ran > planned:
            undecided += f" (undecided after all {ran} steps max_steps allowed)"
        history = loop.history[: len(figures)]
        history_verdict = (
            judge_growth([nodes * NODE_BYTES for nodes in history], self.tolerance, device)
            if len(history) >= 2
            else None
        )
        history_grows = history_verdict is not None and history_verdict.grows
        explained = self.explain and (verdict.grows or history_grows)
        leak = (
            loop.explain(verdict.per_step_bytes, storages=verdict.grows, history=history_grows) if explained else None
        )
        result = StepResult(
            device,
            warmup,
            figures,
            verdict,
            leak,
            loop.warmup_figures(),
            planned,
            ran,
            history=history,
            history_verdict=history_verdict,
            kept=kept,
            undecided=undecided,
        )
        slack = loop.slack_figures()
        if not verdict.grows and len(slack) >= 2:
            fragmenting = judge_growth(slack, self.tolerance, device)
            if fragmenting.grows:
                result.fragmentation = fragmenting
        return result

    def check(
        self, step: Callable[..., Any], *, steps: int = 10, warmup: int | None = None, max_steps: int | None = None
    ) -> StepResult:
        """Call ``step(i)`` (or ``step()``) for ``i`` in ``0 .. steps-1`` (up to ``max_steps - 1``
        where undecided) and return the result of the check."""
        __tracebackhide__ = True
        call = step_caller(step)
        for index in self.steps(steps, warmup=warmup, max_steps=max_steps, step=step):
            call(index)
        return self.results[-1]


def step_caller(step: Callable[..., Any]) -> Callable[[int], None]:
    """``step`` as a function of the step's index: it may take the index or nothing.

    A generator or coroutine function would return without running its body: that is an error,
    as is a step that returns a generator or coroutine (a lambda around one).
    """
    if not callable(step):
        raise StepNotRun(f"check() needs a function that runs one step, got {type(step).__name__} {step!r}")
    if inspect.isgeneratorfunction(step) or inspect.iscoroutinefunction(step) or inspect.isasyncgenfunction(step):
        raise StepNotRun(_NOT_RUN.format(name=getattr(step, "__qualname__", repr(step))))
    takes_index = True
    try:
        signature = inspect.signature(step)
    except (TypeError, ValueError):  # a builtin without a signature: give it the index
        pass
    else:
        try:
            signature.bind(0)
        except TypeError:
            try:
                signature.bind()
            except TypeError:
                raise StepNotRun(
                    f"check() calls step(i) or step(), and {getattr(step, '__qualname__', repr(step))}{signature} takes neither"
                ) from None
            takes_index = False

    def call(index: int) -> None:
        __tracebackhide__ = True
        returned = step(index) if takes_index else step()
        if inspect.isgenerator(returned) or inspect.iscoroutine(returned) or inspect.isasyncgen(returned):
            if inspect.iscoroutine(returned):
                returned.close()  # never awaited, on purpose: no RuntimeWarning
            raise StepNotRun(_NOT_RUN.format(name=getattr(step, "__qualname__", repr(step))))

    return call


class StepNotRun(TypeError):
    """A step function that does not run a step: a usage error."""


_NOT_RUN = (
    "check() was given {name}, which returns a generator or coroutine without running its body: "
    "pass a plain function that runs one step, or iterate `for i in vramleak.steps(n)` yourself"
)


class _Loop:
    """One step loop's measurements: the warm-up baseline, then memory after each step.

    The loop reads the device through its :class:`~pytest_vramleak.readings.Readings`: on CPU each
    measurement is a tracker observation (what the step made and freed); on an accelerator, the
    allocator's counter, and the tracker is read only to name a leak.
    """

    def __init__(
        self,
        meter: Meter,
        tracker: Tracker,
        record_sites: bool,
        named_roots: Callable[[], Sequence[NamedRoot]] | None = None,
    ) -> None:
        self.named_roots = named_roots
        self.meter = meter
        self.tracker = tracker
        self.readings = readings_for(meter, tracker)
        self.owns_tracker = not tracker.active
        # On accelerators the allocator's history names sites (--vramleak-trace); steps are not observed.
        self.recorder = SiteRecorder() if record_sites and self.readings.names_each_storage else None
        self.warming: list[int] = []
        self.measured: list[int] = []
        self.slack: list[int] = []
        """CUDA: bytes reserved but not allocated at the baseline, then after each measured step."""
        self.baseline_bytes = 0
        self.baseline_clock = 0
        self.penultimate_clock = 0
        self._last_reading: StepReading | None = None
        self.recording_until: int | None = None
        """Measured steps, counted from 1, after which site recording stops (None: not started)."""
        self.recording_since = 0
        self.recording = False
        self.graph_base: int | None = None
        """This thread's autograd counter at the baseline: nodes numbered from it on were made by
        the measured steps (None: not known)."""
        self.graph_last: int | None = None
        """The counter at the last measurement: nodes numbered from it on belong to the step since."""
        self.history: list[int] = []
        self.kept_graph = KeptGraph(0, [])
        self.kept: list[int] | None = [] if self.readings.names_each_storage else None
        """Where the readings name each storage (CPU): after each measured step, its figure less the
        storages that step made and left alive."""
        self.made: list[list[StorageRef]] = []
        """CPU: after each measured step, the storages it made and left alive then."""
        self.previous_clock = 0

    def open(self) -> None:
        if self.owns_tracker:
            self.tracker.begin(index=self.readings.names_each_storage)

    def close(self) -> None:
        self.stop_recording()
        if self.owns_tracker:
            self.tracker.end()

    def _measure(self, *, generations: int = 2) -> int:
        self._last_reading = self.readings.step_reading(generations=generations)
        return self._last_reading.in_use_bytes

    def measure_warmup(self) -> None:
        # Warm-up steps may import much (an optimizer's first step): the objects they leave in
        # the oldest unfrozen generation are not collected here, and the baseline freezes them.
        self.warming.append(self._measure(generations=1))

    def take_baseline(self) -> None:
        # Garbage left in the oldest unfrozen generation is frozen with the baseline and stays
        # until the loop ends: it cannot die during the measured steps, where each collection is
        # full but walks only what was made since.
        self.baseline_bytes = self._measure(generations=1)
        if self._last_slack is not None:
            self.slack = [self._last_slack]
        self.tracker.freeze_young()  # each step's observation then reads what that step made
        self.warming.append(self.baseline_bytes)
        self.baseline_clock = self.penultimate_clock = self.previous_clock = self.tracker.clock
        self.graph_base = self.graph_last = self._graph_clock()

    @property
    def _last_slack(self) -> int | None:
        """CUDA: bytes reserved but not allocated at the last measurement."""
        return self._last_reading.slack if self._last_reading is not None else None

    def _graph_clock(self) -> int | None:
        """This thread's autograd counter at the last measurement."""
        return self._last_reading.graphs if self._last_reading is not None else None

    def _count_history(self) -> None:
        """Count the autograd nodes made after warm-up and before the step just measured that
        tensors alive now keep. A loop's last loss keeps its own step's graph until the next step
        rebinds it: those nodes are followed but not counted, so a clean loop counts none."""
        clock, base, before = self._graph_clock(), self.graph_base, self.graph_last
        if clock is None or base is None or before is None:
            return
        self.graph_last = clock
        if before == base:  # no step before this one built a graph since the baseline
            self.history.append(0)
            return
        self.kept_graph = self.readings.kept_graph(base, before=before)
        self.history.append(self.kept_graph.nodes)

    def measure_step(self) -> None:
        self.penultimate_clock = self.tracker.clock
        self.measured.append(self._measure())
        self._count_history()
        if self.kept is not None:
            made = self.tracker.created(self.meter.name, since=self.previous_clock)
            self.made.append(made)
            own = sum(ref.nbytes for ref in made)
            self.kept.append(self.measured[-1] - self.baseline_bytes - own)
            self.previous_clock = self.tracker.clock
        if self.slack and self._last_slack is not None:
            self.slack.append(self._last_slack)
        if self.recorder is None:
            return
        # Tracing every allocation costs more than a small step, and a loop that does not grow
        # needs no sites: recording starts after the first step that rose to a new high and
        # lasts RECORDED_STEPS steps (what a loop leaks, it leaks in those too), then stops.
        count = len(self.measured)
        if self.recording_until is None:
            if self.measured[-1] > max([self.baseline_bytes, *self.measured[:-1]]):
                self.recording_until = count + RECORDED_STEPS
                self.recording_since, self.recording = self.tracker.clock, True
                self.recorder.start()
        elif count == self.recording_until:
            self.stop_recording()

    def stop_recording(self) -> None:
        """Note where the tensors made while recording were made, and stop (where it runs)."""
        if self.recorder is not None and self.recording:
            self.recording = False
            self.recorder.capture(self.tracker.pairs(self.tracker.created(self.meter.name, since=self.recording_since)))
            self.recorder.stop()

    def figures(self) -> list[int]:
        return [m - self.baseline_bytes for m in self.measured]

    def kept_figures(self) -> list[int] | None:
        """See :attr:`StepResult.kept`; None where an allocator counts the memory."""
        return list(self.kept) if self.kept is not None else None

    def slack_figures(self) -> list[int]:
        """Reserved-but-unallocated bytes after each measured step, above the baseline's (CUDA only)."""
        return [value - self.slack[0] for value in self.slack[1:]]

    def warmup_figures(self) -> list[int]:
        return [w - self.baseline_bytes for w in self.warming]

    def replacements(self, lasting: list[StorageRef]) -> list[StorageRef]:
        """The storages in ``lasting`` that are only the latest of their kind (CPU): storages of
        their size that earlier measured steps made have all been freed since, and at least one
        was. A gradient set to None and made again every other step, or accumulated over a few
        steps, outlives the step that made it and is then replaced: it takes a place, it does
        not add one. What a loop keeps adding is not among them: its earlier ones are alive."""
        step_of = {id(ref): index for index, made in enumerate(self.made) for ref in made}
        first_alive: dict[int, int] = {}
        first_freed: dict[int, int] = {}
        for index, made in enumerate(self.made):
            for ref in made:
                firsts = first_alive if ref() is not None else first_freed
                firsts.setdefault(ref.nbytes, index)
        return [
            ref
            for ref in lasting
            if (made_at := step_of.get(id(ref))) is not None
            and first_freed.get(ref.nbytes, made_at) < made_at
            and first_alive.get(ref.nbytes) == made_at
        ]

    def explain(self, per_step: float, *, storages: bool = True, history: bool = False) -> Leak:
        """The tensors made after warm-up that outlived a step (alive after the next-to-last step
        and at the end), with their holders, where ``storages`` grew; the last step's own
        temporaries are not among them, nor (on CPU) storages that outlived their step only as
        the latest of their kind (see :meth:`replacements`), unless nothing else did. With
        ``history``, also the tensors that keep the autograd history that grew, with theirs."""
        tracker, device = self.tracker, self.meter.name
        self.stop_recording()  # (a loop that grew in its last steps is still recording)
        if storages:
            self.readings.before_naming()
        lasting = (
            tracker.created(device, since=self.baseline_clock, before=self.penultimate_clock + 1) if storages else []
        )
        notes = []
        replacing = self.replacements(lasting)
        replaced = {id(ref) for ref in replacing}
        refs = [ref for ref in lasting if id(ref) not in replaced] or lasting
        if len(refs) < len(lasting):
            several = len(replacing) > 1
            notes.append(
                f"not listed: {len(replacing)} storage{'s' if several else ''} "
                f"({format_size(sum(ref.nbytes for ref in replacing))}) that outlived "
                + (
                    "their step only as the latest of their kind: each"
                    if several
                    else "its step only as the latest of its kind: it"
                )
                + " took the place of storages of its size that earlier "
                "measured steps made and freed since (such as a gradient set to None and made again, or a buffer a loop "
                "replaces every few steps)"
            )
        if storages and not lasting:
            # No storage outlived a step: memory grows through one replaced by a bigger one each
            # step. That one is larger than a step's growth; the last step's temporaries are not.
            made = sorted(tracker.created(device, since=self.baseline_clock), key=lambda ref: -ref.nbytes)
            refs = [ref for ref in made if ref.nbytes > per_step] or made
            notes.append(
                "no tensor made after warm-up outlived its step: one is replaced each step by a bigger one "
                "(torch.cat onto itself, a buffer that grows): keep the pieces in a list and concatenate once, "
                "or preallocate and fill"
            )
        refs += [ref for ref, _ in tracker.grown_older(device, since=self.baseline_clock)]
        groups, kept = name_storages(
            tracker,
            device,
            refs,
            self.kept_graph.roots if history else [],
            sites=self.recorder,
            named=self.named_roots() if self.named_roots is not None else (),
        )
        groups += kept
        end = self.baseline_bytes + (self.figures()[-1] if self.measured else 0)
        return Leak(device, self.baseline_bytes, end, end - self.baseline_bytes, groups, notes=notes)

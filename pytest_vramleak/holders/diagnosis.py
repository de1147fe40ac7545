"""Recognise the common PyTorch leak patterns in a leaked group, and say the cause and the fix.

The contract of every rule: it reads a leaked group (its kind, its figures and its holder paths,
never their rendered text) and the diagnoses the rules before it gave, and returns its own
diagnosis (the cause, then the fix, in one line) or None where the group does not fit it.
:data:`SOLE_RULES` are tried first: the first that fits is the group's only diagnosis. Then every
rule of :data:`RULES` adds its own, in order.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Protocol

from ..judging.sizes import format_size
from ..judging.words import GroupKind
from ..tracking.census import KEEPS_ITS_OUTPUT, SAVED_A_VIEW_OF_ITS_OUTPUT
from .edges import PYTEST_WARNINGS
from .paths import Edge, HolderPath

__all__ = [
    "PYTEST_WARNINGS",
    "RULES",
    "SOLE_RULES",
    "Rule",
    "diagnose",
    "held_by_torch_cache",
    "in_gc_garbage",
    "kept_by_the_interpreter",
]

MODULE_HOOK_DICTS = frozenset(
    f"_{name}_hooks"
    for name in (
        "forward",
        "forward_pre",
        "backward",
        "backward_pre",
        "full_backward",
        "full_backward_pre",
        "state_dict",
    )
)
TORCH_CACHE_PACKAGES = frozenset({"torch._dynamo", "torch._inductor", "torch.fx", "torch._functorch"})
# torch.compile installs each compiled graph in the module of the code it compiled, as a global
# named __compiled_fn_<n>_<id> (__resume_at_<n> for code after a graph break): a user's module
# then holds the graph's constants, but the cache is PyTorch's.
_COMPILED_GLOBAL = re.compile(r"__(compiled_fn|resume_at)_\d")
_MOCK_TYPES = frozenset({"Mock", "MagicMock", "NonCallableMock", "NonCallableMagicMock", "AsyncMock", "_CallList"})
_SYS_LAST = frozenset({"last_traceback", "last_value", "last_type", "last_exc"})
_LRU_WRAPPER = "_lru_cache_wrapper"
TORCH_CACHE = (
    "held by a cache PyTorch keeps itself (a torch.compile graph and its constants): not the test's leak, and not "
    "counted as one"
)


class Group(Protocol):
    """What a rule reads of a leaked group (:class:`~.snapshot.TensorGroup`)."""

    kind: GroupKind
    dtype: str
    shape: tuple[int, ...]
    device: str
    bytes: int
    count: int
    viewed: int
    cls: str
    holders: list[HolderPath]
    graph_bytes: int
    graph_tensors: int
    graph_of_other_parts: int
    graph_hooks: set[str]
    nodes: int
    with_graph: int
    grad_fn: str
    hook: str
    grad_graph: bool
    made_inside_library: bool | None

    @property
    def told_by_part(self) -> bool: ...


Rule = Callable[[Group, Sequence[str]], "str | None"]
"""A rule: the group and the diagnoses given before it, to its own diagnosis or None."""


def diagnose(group: Group) -> list[str]:
    """One line per pattern the group matches, cause first, then the fix."""
    for rule in SOLE_RULES:
        sole = rule(group, ())
        if sole is not None:
            return [sole]
    found: list[str] = []
    for rule in RULES:
        finding = rule(group, found)
        if finding is not None:
            found.append(finding)
    return found


# What the rules read of holder paths.


def _named(group: Group) -> list[HolderPath]:
    """The holder paths that name a holder in Python."""
    return [path for path in group.holders if not path.opaque]


def _any_edge(group: Group, *kinds: str) -> bool:
    return any(edge.kind in kinds for path in group.holders for edge in path.edges)


def _module_hook_entry(path: HolderPath) -> bool:
    """Whether the path passes through an entry of a module's (or a tensor's) hook dict."""
    return any(edge.name in MODULE_HOOK_DICTS for edge in path.hook_entries())


def _first_edge(path: HolderPath) -> Edge | None:
    return path.edges[0] if path.edges else None


def _is_attribute(edge: Edge | None, *names: str) -> bool:
    return edge is not None and edge.kind in ("attribute", "hook dict") and (not names or edge.name in names)


def _sys_last(path: HolderPath) -> bool:
    """``sys.last_traceback`` and its kin: what pytest and consoles keep of the last error."""
    first = _first_edge(path)
    return path.root.kind == "module" and path.root.name == "sys" and first is not None and first.name in _SYS_LAST


def _echoed(path: HolderPath) -> bool:
    """``builtins._``: where ``sys.displayhook`` keeps the last value a console or a doctest echoed."""
    first = _first_edge(path)
    return path.root.kind == "module" and path.root.name == "builtins" and _is_attribute(first, "_")


def in_gc_garbage(path: HolderPath) -> bool:
    """``gc.garbage``: where the collector puts what it finds unreachable, rather than free it, while
    ``gc.DEBUG_SAVEALL`` is on."""
    first = _first_edge(path)
    return path.root.kind == "module" and path.root.name == "gc" and _is_attribute(first, "garbage")


def kept_by_the_interpreter(path: HolderPath) -> bool:
    """Whether the path starts at what the interpreter keeps of errors, garbage and echoed values
    (``sys.last_traceback``, ``gc.garbage``, ``builtins._``), not at a module's own state."""
    return _sys_last(path) or in_gc_garbage(path) or _echoed(path)


def _carried_by_loop(group: Group) -> bool:
    """A graph kept by a tensor only running frames' locals hold: a loop carries it from step to step."""
    return (
        bool(group.graph_bytes)
        and group.kind == "graph"
        and bool(group.holders)
        and all(path.through_local() for path in group.holders)
    )


_RERUN_FAILURES = "_rerun_condition_excinfos"
"""The attribute on which pytest-rerunfailures keeps a test item's failures (``ExceptionInfo``s)."""


def _kept_by_rerunfailures(group: Group) -> bool:
    return any(
        edge.kind == "attribute" and edge.name == _RERUN_FAILURES for path in group.holders for edge in path.edges
    )


def _traceback_kept(group: Group) -> bool:
    return _any_edge(group, "traceback", "traceback frame") or any(_sys_last(path) for path in group.holders)


def _torch_cache_path(path: HolderPath) -> bool:
    """A path from a module of PyTorch's compiler, or through a graph torch.compile installed as a global."""
    package = ".".join(path.root.name.split(".")[:2]) if path.root.kind == "module" else ""
    return package in TORCH_CACHE_PACKAGES or any(
        edge.kind == "attribute" and _COMPILED_GLOBAL.match(edge.name) for edge in path.edges
    )


def held_by_torch_cache(group: Group) -> bool:
    """Whether every path that holds the group starts in a cache of PyTorch's own (compiled
    graphs, their constants): memory no test is charged for."""
    return bool(group.holders) and all(_torch_cache_path(path) for path in group.holders)


def _module_container_entry(path: HolderPath) -> bool:
    """``pkg.module.NAME[...]`` or ``pkg.module.obj.attr[...]``: an entry of a container reached from a module."""
    *through, last = path.edges or (None,)
    return (
        path.root.kind == "module"
        and last is not None
        and last.kind == "item"
        and all(edge is not None and edge.kind == "attribute" for edge in through)
    )


def _fixture_paths(group: Group) -> list[HolderPath]:
    return [path for path in group.holders if path.root.kind == "fixture"]


def _parametrized(group: Group) -> list[HolderPath]:
    return [path for path in group.holders if path.root.kind == "parametrize"]


# The rules whose diagnosis, where they fit, is the group's only one.


def kept_history_in_a_gradient(group: Group, found: Sequence[str]) -> str | None:
    """A gradient made with backward(create_graph=True) that keeps the nodes of every backward."""
    if group.kind != "history" or not group.grad_graph:
        return None
    return (
        f"autograd history kept in a gradient: backward(create_graph=True) gave it a graph of {group.nodes:,} nodes "
        "the test made, and each backward adds its graph to the gradient's (a reference cycle with the parameter, "
        "PyTorch's documentation warns of it): take the gradients with torch.autograd.grad(loss, params, "
        "create_graph=True) instead, or set each parameter's .grad to None after use"
    )


def kept_history(group: Group, found: Sequence[str]) -> str | None:
    """A tensor whose grad_fn links every step's nodes (a running total of losses)."""
    if group.kind != "history":
        return None
    return (
        f"autograd history kept: the tensor's grad_fn links {group.nodes:,} nodes the test made, each step's "
        "graph behind the one before (total += loss after loss.backward() keeps every step's nodes even once "
        "backward freed what they saved): accumulate loss.item() or loss.detach() instead, or detach the "
        "tensor (x = x.detach()) where each step starts"
    )


def _checkpoint_hook(path: HolderPath) -> bool:
    """A path from a saved-tensor hook of torch.utils.checkpoint, which an autograd graph keeps in C++."""
    return path.root.kind == "outside gc" and path.root.name.split(".")[:3] == ["torch", "utils", "checkpoint"]


def checkpoint_hooks(group: Group, found: Sequence[str]) -> str | None:
    """What torch.utils.checkpoint's saved-tensor hooks keep for backward while the graph of a checkpointed output lives."""
    if not group.holders or not all(_checkpoint_hook(path) for path in group.holders):
        return None
    return (
        "torch.utils.checkpoint keeps what a checkpointed region saved or recomputed for backward in its "
        "saved-tensor hooks, which live as long as the autograd graph of its output: an output (or a loss) of "
        "checkpoint() was kept with its graph: keep out.detach() or loss.item() instead, or run backward() "
        "before the graph is dropped"
    )


def torch_cache(group: Group, found: Sequence[str]) -> str | None:
    """Memory only PyTorch's own caches (compiled graphs and their constants) hold."""
    return TORCH_CACHE if held_by_torch_cache(group) else None


# The rules that each add a diagnosis.


def create_graph_cycle(group: Group, found: Sequence[str]) -> str | None:
    """Gradients with graphs of their own, kept through a cycle with their parameters."""
    if not group.grad_graph:
        return None
    return (
        "backward(create_graph=True) gave these gradients autograd graphs of their own, and a gradient's graph "
        "refers back to its parameter: a reference cycle (PyTorch's documentation warns of it) that keeps the "
        "gradients and every graph behind them alive: take the gradients with torch.autograd.grad(loss, params, "
        "create_graph=True) instead, or set each parameter's .grad to None after use (where .grad is set by hand "
        "from such a gradient, p.grad = g, set it from g.detach())"
    )


def graph_carried_by_a_loop(group: Group, found: Sequence[str]) -> str | None:
    """A graph behind a tensor a running loop carries from step to step (a hidden state)."""
    if group.grad_graph or not _carried_by_loop(group):
        return None
    return (
        f"autograd graph kept alive: {format_size(group.graph_bytes)} in {group.graph_tensors} saved tensors "
        "behind a tensor a running loop carries from step to step with its grad_fn (a hidden state, a running "
        "total), so each step's graph holds every earlier one: detach it each step (hidden = hidden.detach()), "
        "or keep loss.item() instead"
    )


def through_checkpoint(group: Group) -> bool:
    """Whether the group's graph went through a torch.utils.checkpoint region (its hooks packed some of it)."""
    return any(name.split(".")[:3] == ["torch", "utils", "checkpoint"] for name in group.graph_hooks)


def user_hooks(group: Group) -> list[str]:
    """The unpack hooks met in the group's graph that are not PyTorch's own, by name."""
    return sorted(
        name
        for name in group.graph_hooks
        if name != KEEPS_ITS_OUTPUT
        and not name.startswith(SAVED_A_VIEW_OF_ITS_OUTPUT)
        and name.split(".")[0] not in ("torch", "")
    )


def saved_views_of_outputs(group: Group) -> list[str]:
    """The functions (``module.qualname``) whose nodes in the group's graph saved a view of their own output."""
    return sorted(
        name.removeprefix(SAVED_A_VIEW_OF_ITS_OUTPUT)
        for name in group.graph_hooks
        if name.startswith(SAVED_A_VIEW_OF_ITS_OUTPUT)
    )


def pack_hook_kept_its_output(group: Group, found: Sequence[str]) -> str | None:
    """A saved_tensors_hooks pack hook that kept an op's output with its grad_fn: a cycle through C++."""
    if group.grad_graph or KEEPS_ITS_OUTPUT not in group.graph_hooks:
        return None
    where = (
        " inside a torch.utils.checkpoint region (as used to switch checkpointing off)"
        if through_checkpoint(group)
        else ""
    )
    return (
        f"a torch.autograd.graph.saved_tensors_hooks pack hook{where} returned the tensor it was given as it is "
        "(lambda t: t), and where an op saves its own output (relu, sigmoid, exp) the output's grad_fn then "
        "holds the output: a reference cycle through C++ that gc.collect() cannot break, so unless backward() "
        "runs, the graph and all it saved stay: return t.detach() from the pack hook (autograd restores the "
        "grad_fn on unpack), or run passes without backward under torch.no_grad()"
    )


def saved_a_view_of_its_output(group: Group, found: Sequence[str]) -> str | None:
    """A custom autograd.Function that saved a view of its own output: a cycle through C++."""
    functions = saved_views_of_outputs(group)
    if group.grad_graph or not functions:
        return None
    return (
        f"autograd.Function {', '.join(functions)} saved a view of its own output for backward "
        "(ctx.save_for_backward(out.view(...))): the view keeps the output as its base and the output's grad_fn "
        "keeps the view, a reference cycle through C++ that gc.collect() cannot break (pytorch/pytorch#94990), so "
        "unless backward() runs, the output and all its graph saved stay: save the view detached "
        "(ctx.save_for_backward(out.view(-1).detach())), or save the output itself (autograd keeps a saved "
        "output without its grad_fn) and take the view in backward"
    )


def distribution_kept_with_its_graph(group: Group, found: Sequence[str]) -> str | None:
    """A torch.distributions object kept with the autograd graph of the parameters it was made from."""
    if group.grad_graph or not (group.graph_bytes or group.with_graph):
        return None
    kept = [
        _spelled(path, index + 1)
        for path in group.holders
        for index, edge in enumerate(path.edges)
        if edge.distribution
    ]
    if not kept:
        return None
    return (
        f"{kept[0]} is a torch.distributions object, which keeps the parameters it was made from (logits, probs, "
        "loc, scale) with the autograd graph that made them, so each one kept keeps its step's graph: where it is "
        "kept for later, make it from detached parameters (Categorical(logits=logits.detach())), or keep only what "
        "is needed of it (dist.log_prob(action).detach(), dist.entropy().item())"
    )


IN_PLACE_WRITES = frozenset(
    {
        "CopySlices",
        "CopyBackwards",
        "IndexPutBackward0",
        "IndexCopyBackward0",
        "IndexAddBackward0",
        "IndexFillBackward1",
        "MaskedScatterBackward0",
        "MaskedFillBackward1",
        "ScatterBackward0",
        "ScatterAddBackward0",
        "PutBackward0",
    }
)
"""The grad_fn classes of a tensor last written into (``bank[ids] = out``, ``.copy_()``, ``index_put_``)
by a value that carries a graph (the ``1`` variants: where the value written is a tensor)."""


def written_with_a_graph(group: Group, found: Sequence[str]) -> str | None:
    """A kept tensor written into, in place, with values that carry their autograd graph (a feature bank, a memory)."""
    if group.grad_graph or group.grad_fn not in IN_PLACE_WRITES or not group.graph_bytes:
        return None
    path = next((path for path in group.holders if not path.opaque), None)
    name = _spelled(path, len(path.edges)) if path is not None else "the tensor"
    return (
        f"{name} was written into with values that carry their autograd graph (its grad_fn is {group.grad_fn}: "
        f"tensor[index] = value, .copy_(), index_put_()), so it keeps every write's graph, "
        f"{format_size(group.graph_bytes)} in {group.graph_tensors} saved tensors, as long as it lives: write "
        "value.detach(), or write under torch.no_grad()"
    )


def _attribute_state(group: Group) -> tuple[str, str] | None:
    """Where every tensor of the group is held by one attribute (``MODEL[1].running_mean``), or by
    entries of the tuple it holds (an LSTM's ``MODEL.hidden``, ``(h, c)``), through no container's
    entry before it: state an object keeps and sets again, not values a list gains. The attribute
    as the code spells it, and its name."""
    named = _named(group)
    if not named or len(named) != group.count:
        return None
    path = named[0]
    containers = path.type_names()
    end = len(path.edges)
    while end > 0 and path.edges[end - 1].kind == "item" and containers[end - 1] == "tuple":
        end -= 1
    if end == 0 or path.edges[end - 1].kind != "attribute":
        return None
    if any(_LAST_EDGE_KINDS.get(edge.kind) in ("item", "dict key") for edge in path.edges[: end - 1]):
        return None
    if any(other.root != path.root or other.edges[:end] != path.edges[:end] for other in named):
        return None
    return _spelled(path, end), path.edges[end - 1].name


def _gained_entries(group: Group) -> tuple[str, str] | None:
    """Where the group's holders are entries of one container that differ between them
    (``RUN.history.rows[40]``, ``[41]``): the container and the first entry, as the code spells them."""
    named = _named(group)
    if len(named) < 2 or named[0].root.kind not in SPELLED_ROOTS:
        return None  # (a root the code does not spell: the holder line says it)
    path = named[0]
    decisive = _decisive_edge(path, named[1:])
    if (
        decisive < 0
        or _LAST_EDGE_KINDS.get(path.edges[decisive].kind) not in ("item", "dict key")
        or path.type_names()[decisive] == "tuple"
        or not _read_as_code(path.edges[:decisive])
    ):
        return None
    if not any(
        len(other.edges) == len(path.edges) and other.edges[decisive] != path.edges[decisive] for other in named
    ):
        return None
    return _spelled(path, decisive), _spelled(path, decisive + 1)


def _held_as_code(group: Group) -> str | None:
    """The holder of a group of one tensor as the code spells it (``CACHE['step-4']``,
    ``T.stats['mean']``), where one path from a root of :data:`SPELLED_ROOTS` names it through
    attributes and entries only."""
    named = _named(group)
    if group.count != 1 or len(named) != 1 or named[0].root.kind not in SPELLED_ROOTS:
        return None
    path = named[0]
    return _spelled(path, len(path.edges)) if path.edges and _read_as_code(path.edges) else None


def _read_as_code(edges: Sequence[Edge]) -> bool:
    """Whether ``edges`` read as the code spells them: attributes and entries only (no closure
    variable, no frame's local)."""
    return all(edge.kind in ("attribute", "item") for edge in edges)


def graph_kept(group: Group, found: Sequence[str]) -> str | None:
    """A graph behind a stored tensor that still has its grad_fn (a loss stored with its graph)."""
    if group.grad_graph or not group.graph_bytes or _carried_by_loop(group) or found:
        return None
    kept = f"autograd graph kept alive: {format_size(group.graph_bytes)} in {group.graph_tensors} saved tensors"
    if through_checkpoint(group):
        return (
            f"{kept} behind a tensor that still has its grad_fn, a graph that goes through a torch.utils.checkpoint "
            "region, whose saved-tensor hooks keep the region's inputs (and RNG state) to recompute it in "
            "backward: store loss.item() or out.detach() instead, or run backward() before the graph is dropped"
        )
    state = _attribute_state(group)
    if state is not None:
        spelled, name = state
        keep = (
            f"keep a number instead (self.{name} += loss.item())"
            if group.shape == ()
            else f"set it from detached values (self.{name} = h.detach(), self.{name} += x.detach())"
        )
        return (
            f"{kept} behind {spelled}, a tensor that still has its grad_fn: a state set from a "
            "computation made with autograd on (a running statistic, a hidden state, a running total) keeps that "
            "computation's graph, and where each update reads the last value, the graph of every update before it: "
            f"{keep}, or update it under torch.no_grad()"
        )
    gained = _gained_entries(group)
    if gained is not None:
        container, entry = gained
        return (
            f"{kept} behind tensors that still have their grad_fn, kept in {container} ({entry}, ...): each keeps the graph "
            "of the step that made it (a loss or an output stored, logged or collected as it was computed): store "
            f"loss.item() or tensor.detach() instead, and empty {container} when done"
        )
    held = _held_as_code(group)
    behind = f"behind {held}, a tensor" if held is not None else "behind a tensor"
    if group.graph_of_other_parts:
        detach = f"{held} = value.detach()" if held is not None else "state = value.detach()"
        return (
            f"{kept} {behind} that still has its grad_fn, whose graph holds what other runs of the test computed: a value "
            "computed from its own last value (a hidden state, a running statistic, a running total) chains each "
            f"update's graph onto every one before it: set it from a detached value ({detach}), or make the update "
            "under torch.no_grad()"
        )
    if group.told_by_part:
        return (
            f"{kept} {behind} that still has its grad_fn: a loss or an output stored as it was computed keeps the graph of "
            "the step that made it: store loss.item() or tensor.detach() instead, or compute it under torch.no_grad()"
        )
    return (
        f"{kept} behind a tensor that still has its grad_fn (a loss or output stored with its graph, or a state computed "
        "from its own last value, a hidden state, a running statistic, a buffer written in place, whose graph "
        "chains onto every step's before it); store loss.item() or tensor.detach() instead (self.hidden = "
        "h.detach(), buffer[i] = value.detach()), or run the step, or the update, under torch.no_grad()"
    )


def grad_fn_kept(group: Group, found: Sequence[str]) -> str | None:
    """An autograd node the test's code holds (not one held from C++): the node was kept, not a tensor."""
    if group.grad_graph or not any(path.has("autograd node") for path in _named(group)):
        return None
    return (
        "an autograd node (a grad_fn) was kept, not a tensor: it keeps what its graph saved for backward and "
        "the leaves it accumulates into; keep loss.item() or a detached tensor instead of loss.grad_fn"
    )


def numpy_array(group: Group, found: Sequence[str]) -> str | None:
    """A numpy array made by tensor.numpy() on the path, which shares the tensor's memory."""
    if not any(path.has("array base", "numpy memory") for path in group.holders):
        return None
    return (
        "a numpy array made by tensor.numpy() shares the tensor's memory and keeps it alive as long as the array "
        "lives: drop the arrays when done (a list that gains one each run keeps them all), or keep only what is "
        "needed of each (a summary, or a copy of the small part used: array[:k].copy())"
    )


def hook_keeps(group: Group, found: Sequence[str]) -> str | None:
    """A module's or a tensor's hook that keeps what it is given (through its hook dict, or a container its closure fills)."""
    if not group.hook and not any(_module_hook_entry(path) and not _pruned(path) for path in group.holders):
        return None
    tensor = any(path.has("tensor hooks") for path in group.holders)
    return (
        ("a tensor's hook (register_hook) keeps what it is given" if tensor else "a module hook keeps what it is given")
        + (f" ({group.hook})" if group.hook else "")
        + ": keep the handle register_*_hook() returns and call handle.remove() when done, or clear what the "
        "hook appends to"
    )


def _pruned(path: HolderPath) -> bool:
    """Whether the path goes through what torch.nn.utils.prune keeps of the prunings applied to a
    parameter (a PruningContainer of them, on the module's forward pre-hook)."""
    return any(edge.type_name == "PruningContainer" or edge.name == "_pruning_methods" for edge in path.edges)


def pruned_again(group: Group, found: Sequence[str]) -> str | None:
    """Prunings applied again and again to a parameter, each kept with its mask in a PruningContainer."""
    if not any(_pruned(path) for path in group.holders):
        return None
    return (
        "torch.nn.utils.prune keeps every pruning applied to a parameter (its method and its mask) in a "
        "PruningContainer on the module's forward pre-hook, and pruning a pruned parameter again adds one more: "
        "call prune.remove(module, name) after each round (it makes the pruning permanent and drops the hook and "
        "the masks), or prune once"
    )


def _cached_method(path: HolderPath) -> tuple[str, bool] | None:
    """``("Detector.anchors", property)`` where the path goes from a class into a method it caches
    with functools.lru_cache, ``property`` where the method is the getter of a property over the cache."""
    edges = path.edges
    for index, edge in enumerate(edges[:-1]):
        after = edges[index + 1]
        if edge.type_name not in _CLASS_TYPES:
            continue
        if after.type_name == _LRU_WRAPPER:
            return f"{edge.name}.{after.name}", False
        getter = edges[index + 2] if index + 2 < len(edges) else None
        if after.type_name == "property" and getter is not None and getter.type_name == _LRU_WRAPPER:
            return f"{edge.name}.{after.name}", True
    return None


def _stacked_parametrization(path: HolderPath) -> tuple[str, str] | None:
    """``("disc[0]", "weight")`` where the path goes through a parametrization registered after
    the first on the same tensor (an entry past the first of a ``ParametrizationList``)."""
    edges = path.edges
    for index, edge in enumerate(edges[:-1]):
        entry = edges[index + 1]
        if (
            edge.type_name == "ParametrizationList"
            and index >= 1
            and edges[index - 1].name == "parametrizations"
            and entry.kind == "attribute"
            and entry.name.isdigit()
            and entry.name != "0"
        ):
            return _spelled(path, index - 1), edge.name
    return None


def parametrization_stacked(group: Group, found: Sequence[str]) -> str | None:
    """Parametrizations registered again and again on one tensor (spectral_norm applied to a module each time)."""
    stacked = [at for path in group.holders if (at := _stacked_parametrization(path)) is not None]
    if not stacked:
        return None
    module, name = stacked[0]
    return (
        f"{module}.parametrizations.{name} holds one parametrization more each time one is registered on "
        f"{module}.{name} (spectral_norm, weight_norm, orthogonal or register_parametrization applied again to a "
        "parametrized tensor: they stack, each with its own state, spectral_norm's _u and _v), for as long as the "
        f"module lives: register it once (skip it where torch.nn.utils.parametrize.is_parametrized({module}, "
        f"'{name}')), or remove the earlier first (torch.nn.utils.parametrize.remove_parametrizations({module}, "
        f"'{name}'))"
    )


def lru_cache(group: Group, found: Sequence[str]) -> str | None:
    """A functools.lru_cache that keeps every result it returned (and every argument, as its key)."""
    if not _any_edge(group, "lru_cache", "lru_cache entry"):
        return None
    methods = [method for path in group.holders if (method := _cached_method(path)) is not None]
    if methods and methods[0][1]:
        name = methods[0][0]
        return (
            f"functools.lru_cache / functools.cache under @property keeps every result it returned, and every self "
            f"it was read on as its key: {name} is cached on its class, so every instance stays alive in the cache "
            f"with its result for as long as the class: use functools.cached_property instead (it keeps the value "
            f"on the instance, and goes with it), or call {name}.fget.cache_clear() when done"
        )
    if methods:
        return (
            f"functools.lru_cache / functools.cache keeps every result it returned, and the arguments of every call "
            f"as its keys: {methods[0][0]} is a method cached on its class, so every self it was called with (a whole "
            "model) stays alive in the cache for as long as the class, with every result: cache in a function of "
            "what the result depends on (not self), or keep a cache per instance (set in __init__), or at least give "
            "it a maxsize and call .cache_clear() when done"
        )
    if group.cls == "Parameter":
        return (
            "functools.lru_cache / functools.cache keeps every result it returned, and the arguments of every call "
            "as its keys: its results hold a model's parameters, so every model passed to it stays alive with them: "
            "cache on something small that names the model (its name), not the model itself, or call .cache_clear() "
            "when done with a model"
        )
    return (
        "functools.lru_cache / functools.cache keeps every result it returned: give it a maxsize, "
        "call .cache_clear(), or do not cache tensors"
    )


def last_error(group: Group, found: Sequence[str]) -> str | None:
    """sys.last_traceback / sys.last_value, which keep the last reported error's frames."""
    if not any(_sys_last(path) for path in group.holders):
        return None
    return (
        "sys.last_traceback / sys.last_value keep the last reported error's frames and their local tensors "
        "(pytest sets them for a failed test, interactive consoles for an error they print): delete them "
        "when done, or call traceback.clear_frames(sys.last_traceback)"
    )


def echoed_value(group: Group, found: Sequence[str]) -> str | None:
    """builtins._, where sys.displayhook keeps the last value a console or a doctest echoed."""
    if not any(_echoed(path) for path in group.holders):
        return None
    return (
        "builtins._ is where sys.displayhook keeps the last value an interactive console or a doctest echoed (an "
        "expression whose value is printed), until another is echoed: assign such a value to a name, or echo only "
        "what is needed of it (.item(), tuple(t.shape)), or set builtins._ = None when done"
    )


def collector_saved_garbage(group: Group, found: Sequence[str]) -> str | None:
    """gc.garbage, which keeps everything the collector finds unreachable while gc.DEBUG_SAVEALL is on."""
    if not any(in_gc_garbage(path) for path in group.holders):
        return None
    return (
        "gc.garbage keeps these tensors: while gc.DEBUG_SAVEALL is on (gc.set_debug), the collector puts everything "
        "it finds unreachable there instead of freeing it, so every reference cycle made from then on stays: set the "
        "flags back when done (flags = gc.get_debug() before, gc.set_debug(flags) after) and empty the list "
        "(gc.garbage.clear())"
    )


def _kept_frame(path: HolderPath) -> bool:
    """Whether the path goes through a frame object a container or an attribute keeps (not a
    traceback's, not one still running) into one of its locals."""
    return any(
        edge.type_name == "frame"
        and edge.kind in ("item", "dict key", "container item", "set element", "attribute", "closure variable")
        and after is not None
        and after.kind == "local"
        for edge, after in path.pairs()
    )


def kept_frame(group: Group, found: Sequence[str]) -> str | None:
    """A frame object stored (by a tracer, a profiler, inspect.currentframe()), which keeps every local of its call."""
    if not any(_kept_frame(path) for path in group.holders):
        return None
    return (
        "a frame object is kept (a tracer or profiler storing the frames it is given, inspect.currentframe() or "
        "sys._getframe() stored): a frame keeps every local of its call, and its callers' frames, for as long as it "
        "lives: keep what is needed of it (frame.f_code.co_name, frame.f_lineno, reprs of its locals), never the "
        "frame, or del it when done"
    )


def rerunfailures_failure(group: Group, found: Sequence[str]) -> str | None:
    """A failed test's traceback that pytest-rerunfailures keeps on its test item."""
    if not _kept_by_rerunfailures(group):
        return None
    return (
        "pytest-rerunfailures keeps each failure's traceback on its test item (item._rerun_condition_excinfos) until "
        "the test is set up again, for the session where it is not run again, and with it the failed test's frames "
        "and their local tensors: the failure's, freed when the session ends (-p no:rerunfailures runs without it)"
    )


def stored_exception(group: Group, found: Sequence[str]) -> str | None:
    """A stored exception whose traceback keeps its frames' locals."""
    if not _traceback_kept(group) or any(_sys_last(path) for path in group.holders) or _kept_by_rerunfailures(group):
        return None
    return (
        "a stored exception keeps its traceback, whose frames keep their local tensors: "
        "store str(error) instead, or call traceback.clear_frames(error.__traceback__)"
    )


def _exception_attribute(path: HolderPath) -> str | None:
    """``errors[4].batch`` where the path goes from an exception into what it was given (an
    attribute, its args), not through its traceback."""
    for index, (edge, after) in enumerate(path.pairs()):
        if edge.exception and after is not None and after.kind == "attribute":
            return _spelled(path, index + 2)
    return None


def exception_arguments(group: Group, found: Sequence[str]) -> str | None:
    """A stored exception that keeps the tensors it was given, as attributes or in its args."""
    held = [at for path in group.holders if (at := _exception_attribute(path)) is not None]
    if not held:
        return None
    return (
        f"a stored exception keeps the tensors it was given ({held[0]}), for as long as it is kept: keep "
        "str(error), or what the tensors tell (their shapes, .item()), instead of the exception, or give the "
        "exception those rather than the tensors"
    )


def closure(group: Group, found: Sequence[str]) -> str | None:
    """A closure (not a hook's, nor a traceback's frame) that captured the tensor."""
    if (
        _traceback_kept(group)
        or not _any_edge(group, "closure variable")
        or all(path.root.kind == "signal handler" or _exit_stack_callback(path) for path in group.holders)
        or any(_module_hook_entry(path) or _global_hook_entry(path) for path in group.holders)
        or any(_memo_entry(path) is not None for path in group.holders)
    ):
        return None
    return (
        "a closure (a callback, a logger) captured it and lives on: drop the callback when done, or "
        "capture a detached copy or a Python number instead"
    )


def thread_frame(group: Group, found: Sequence[str]) -> str | None:
    """A frame still running in another thread (a loader loop never stopped) that keeps the tensor."""
    threads = sorted(
        {path.root.thread for path in group.holders if path.root.kind == "thread local" and not _pending_work(path)}
    )
    if not threads:
        return None
    named = ", ".join(f"'{thread}'" for thread in threads)
    return (
        f"the thread {named} is still running, and a frame of it keeps these tensors (a loader or pin-memory "
        "loop that was never stopped, or that keeps what it handed on): stop the thread when done (set an Event "
        "its loop checks, then join() it), and let its loop drop each batch once handed on"
    )


def exit_callback(group: Group, found: Sequence[str]) -> str | None:
    """A callback registered with atexit (its closure, its object, its arguments), kept until exit."""
    kept = [path.root.label for path in group.holders if path.root.kind == "atexit"]
    if not kept:
        return None
    return (
        f"atexit keeps every callback registered with it, and what the callback refers to, until the interpreter "
        f"exits ({kept[0]}): registering one per call or per object keeps each of them: register once (at import), "
        "atexit.unregister() the callback when its object is done (a close() method), or give it a Python number "
        "(.item()) instead of a tensor"
    )


def signal_handler(group: Group, found: Sequence[str]) -> str | None:
    """A handler given to signal.signal (its closure, its object), kept until another replaces it."""
    kept = [path.root.label for path in group.holders if path.root.kind == "signal handler"]
    if not kept:
        return None
    return (
        f"the signal module keeps {kept[0]} until another handler replaces it, and with it what the handler refers "
        "to (a handler that calls the one it replaced keeps that one too, and so every earlier object that installed "
        "one): give the previous handler back when done (previous = signal.signal(sig, handler), then "
        "signal.signal(sig, previous)), or install one handler once, not one per object"
    )


def module_made_at_run_time(group: Group, found: Sequence[str]) -> str | None:
    """A module code made and put in sys.modules, which keeps its globals for as long as it is there."""
    made = [path.root.label for path in group.holders if path.root.kind == "run-time module"]
    if not made:
        return None
    return (
        f"{made[0]} is a module the code made (exec of generated source, module_from_spec) and put in sys.modules, "
        "which keeps it and its globals until the process ends: one made under a new name each time is never let "
        "go: del sys.modules[name] when done with it, or reuse one module (one name) instead of making another"
    )


def saved_tensors_stored_by_a_pack_hook(group: Group, found: Sequence[str]) -> str | None:
    """A saved_tensors_hooks pack hook that stores what it packs, given back only by its unpack hook in backward."""
    stores = [edge for path in group.holders for edge in path.edges if edge.pack_hook]
    if not stores:
        return None
    return (
        f"{stores[0].pack_hook} is a pack hook of torch.autograd.graph.saved_tensors_hooks that keeps each tensor "
        f"autograd saves (in {stores[0].name}), and only its unpack hook, which backward() calls, lets it go: a "
        "forward pass under the hooks whose backward never runs (an evaluation pass, an output or loss dropped "
        "unused) leaves what it saved there for good: run a pass that will not call backward() under "
        "torch.no_grad() (nothing is saved then), and clear the store after each step"
    )


def finalizer_keeps_its_object(group: Group, found: Sequence[str]) -> str | None:
    """A weakref.finalize entry, whose callback and arguments live until it runs (a bound method keeps its object)."""
    if not any("finalize._Info" in path.type_names() for path in group.holders):
        return None
    return (
        "weakref.finalize keeps its callback and arguments until it runs, and a callback that refers to the object "
        "(a bound method such as self.close, or self among its arguments) keeps the object alive, so it never runs: "
        "register a plain function with only what it needs (weakref.finalize(self, release, self.handle)), or call "
        "the finalizer (or .detach() it) when done"
    )


def fixture_gradients(group: Group, found: Sequence[str]) -> str | None:
    """Gradients backward() made on a model a wider-scoped fixture keeps for many tests."""
    fixtures = _fixture_paths(group)
    if not fixtures:
        return None
    gradients = group.kind == "grad" or any(
        edge.kind == "gradient" or _is_attribute(edge, "grad") for path in fixtures for edge in path.edges
    )
    if not gradients:
        return None
    return (
        f"backward() gave the model that {fixtures[0].root.label} keeps for many tests its gradients, which stay "
        "with the model: call model.zero_grad(set_to_none=True) at the end of the test or in the fixture's teardown, "
        "or give each test its own model (a function-scoped fixture)"
    )


def gradient_of_an_input(group: Group, found: Sequence[str]) -> str | None:
    """A gradient backward() wrote into a tensor that is no parameter (an input attacked or explained)."""
    if found or group.kind != "grad":
        return None
    path = next((path for path in _named(group) if path.edges and path.edges[-1].kind == "gradient"), None)
    if path is None or len(path.edges) < 2 or path.type_names()[-2] in _PARAMETER_CLASSES:
        return None  # (a tensor reached by no edge: its class is not on the path)
    owner = _spelled(path, len(path.edges) - 1) if path.root.kind in SPELLED_ROOTS else "the tensor"
    return (
        f"backward() wrote a gradient into {owner}, a tensor that is no parameter on which requires_grad was set (an "
        "input an attack, a saliency map or an input optimisation takes the gradient of), and its .grad lives as long "
        "as it does: work on a copy (x = images[i].clone().detach().requires_grad_()), or set its .grad to None (and "
        "requires_grad_(False)) once read; torch.autograd.grad(loss, inputs) gives the gradient without storing it"
    )


_PARAMETER_CLASSES = frozenset({"Parameter", "UninitializedParameter"})


def fixture_state(group: Group, found: Sequence[str]) -> str | None:
    """Other state kept on a value a wider-scoped fixture shares between tests, where nothing more specific fits."""
    fixtures = _fixture_paths(group)
    if found or not fixtures or fixture_gradients(group, found) is not None:
        return None
    if fixtures[0].root.name == "doctest_namespace":
        entry = _spelled(fixtures[0], 1) if fixtures[0].edges else "doctest_namespace[name]"
        return (
            "doctest_namespace is pytest's own session-scoped dict of the names doctests see: what a fixture puts "
            "in it (an autouse fixture of a conftest, for every test) stays for the session: have that fixture "
            f"yield, then delete what it put there (del {entry})"
        )
    return (
        f"state kept on a value that {fixtures[0].root.label} shares between tests (a cached result, lazily made "
        "state): clear it at the end of the test or in the fixture's teardown, or make the fixture function-scoped"
    )


def test_instance(group: Group, found: Sequence[str]) -> str | None:
    """What a test set on self, which pytest keeps with the test's class instance; not where
    something else holds the group too (a hook each instance added): letting go of self's
    attribute would not free it."""
    kept = [path for path in group.holders if path.root.kind == "pytest instance"]
    if not kept or len(kept) < len(_named(group)):
        return None
    attribute = next((edge.name for edge in map(_first_edge, kept) if edge is not None and _is_attribute(edge)), "")
    return (
        "pytest keeps each test's class instance until the session ends, and with it what the test set on self"
        + (f" (self.{attribute})" if attribute else "")
        + ": set it to None in teardown_method, or keep tensors in locals or fixtures"
    )


_EMPTY = {"list": "[]", "dict": "{}", "set": "set()"}
_TEARDOWN = {
    "test class": ("teardown_method", "setup_method", "teardown_class"),
    "TestCase class": ("tearDown", "setUp", "tearDownClass"),
}


def test_class_attribute(group: Group, found: Sequence[str]) -> str | None:
    """An attribute of a test's class, which every test of the class shares and the session keeps."""
    held = [
        (path, edge)
        for path in group.holders
        if path.root.kind in _TEARDOWN and (edge := _first_edge(path)) is not None and _is_attribute(edge)
    ]
    if not held:
        return None
    path, edge = held[0]
    teardown, setup, class_teardown = _TEARDOWN[path.root.kind]
    cause = (
        f"{path.root.label}.{edge.name} is a class attribute, not an instance attribute: pytest makes "
        "a fresh instance for every test, but the test class and what its attributes hold live until the session ends"
    )
    if path.has("item", "container item", "set element"):
        empty = _EMPTY.get(edge.type_name, f"{edge.type_name}()")
        return (
            f"{cause}, so what every test adds to it stays: clear it in {teardown} (self.{edge.name}.clear()), or "
            f"give each test its own (self.{edge.name} = {empty} in {setup})"
        )
    return f"{cause}: set it back to None in {class_teardown}, or set it on self in {setup}"


def record_property(group: Group, found: Sequence[str]) -> str | None:
    """A tensor given to record_property, which pytest keeps for the JUnit XML report."""
    if not any(path.root.kind == "record_property" for path in group.holders):
        return None
    return (
        "pytest keeps every record_property value until the session ends (for the JUnit XML report): record a "
        "number or a string (t.item(), str(t.shape)), not a tensor"
    )


def recorded_warning(group: Group, found: Sequence[str]) -> str | None:
    """A tensor in a warning's arguments, which pytest keeps with every warning it recorded."""
    if not any(path.root.kind == "pytest warnings" for path in group.holders):
        return None
    return (
        "pytest keeps every warning it recorded, with its arguments, until the session ends: warn with a string "
        "(f'{t.shape}'), not a tensor"
    )


def parametrized_list_appended_to(group: Group, found: Sequence[str]) -> str | None:
    """Entries added to a list or dict pytest keeps as a parametrize value."""
    if not any((edge := _first_edge(path)) is not None and edge.kind == "item" for path in _parametrized(group)):
        return None
    return (
        "the test (or code it called) added entries to a list or dict that pytest keeps as a parametrize value for "
        "the whole session (a trainer appending its own callbacks to the callbacks list it was given): pass a copy "
        "(list(callbacks)), or build the list inside the test"
    )


def parametrized_object_state(group: Group, found: Sequence[str]) -> str | None:
    """State the test computed on an object pytest keeps as a parametrize value (a metric's compute())."""
    parametrized = _parametrized(group)
    if not parametrized or parametrized_list_appended_to(group, found) is not None:
        return None
    computed = any(_is_attribute(_first_edge(path), "_computed") for path in parametrized)
    return (
        "an object pytest keeps as a parametrize value for the whole session kept what the test computed on it ("
        + ("a metric's cached compute() result" if computed else "a cached result, lazily made state")
        + "): build the object inside the test or in a function-scoped fixture, or reset it"
        + (" (metric.reset())" if computed else "")
        + " at the end of the test"
    )


def mock_calls(group: Group, found: Sequence[str]) -> str | None:
    """A unittest.mock mock on the path, which keeps the arguments of every call."""
    if not any(name in _MOCK_TYPES for path in group.holders for name in path.type_names()):
        return None
    return (
        "a unittest.mock mock keeps the arguments of every call made to it (call_args, call_args_list, mock_calls) "
        "for as long as it lives: call reset_mock() when done, patch it for the test alone, or pass it numbers or "
        "strings (t.item(), t.shape) instead of tensors"
    )


_WEAK_KEY_DICTS = frozenset({"WeakKeyDictionary", "WeakIdKeyDictionary"})
"""weakref's, and torch's (``torch.utils.weak.WeakTensorKeyDictionary``, which keys by identity)."""


def _through_weak_key_data(path: HolderPath) -> bool:
    """Whether the path passes from a weak-key dictionary into its ``.data`` (its entries)."""
    return any(
        name in _WEAK_KEY_DICTS and index < len(path.edges) and _is_attribute(path.edges[index], "data")
        for index, name in enumerate(path.type_names())
    )


def weak_key_value_holds_its_key(group: Group, found: Sequence[str]) -> str | None:
    """A weak-key dictionary's value, kept while its key lives (and it refers to its key)."""
    if not any(_through_weak_key_data(path) for path in group.holders):
        return None
    return (
        "a weak-key dictionary (WeakKeyDictionary, torch's WeakTensorKeyDictionary) keeps each value while its key "
        "is alive, and this key is alive: a value that is its own key (x.to(device) gives x itself where x is there "
        "already) or refers to it keeps its entry for ever: keep weakref.ref(key) in the value instead, store nothing "
        "where the value would be the key, or delete the entry when done"
    )


def done_task_result(group: Group, found: Sequence[str]) -> str | None:
    """An asyncio task, or a future of asyncio's or concurrent.futures', kept after it is done, with its result or its exception."""
    if not any(
        _through(path, kind, name)
        for path in group.holders
        for kind in ("Task", "Future")
        for name in ("_result", "_exception")
    ):
        return None
    return (
        "an asyncio Task, or a Future (asyncio's or concurrent.futures'), keeps its result, or its exception with its "
        "traceback, for as long as anything refers to it: drop it once it is done (a set of background tasks: "
        "task.add_done_callback(tasks.discard); a list of futures: future.add_done_callback(futures.remove)), or keep "
        "its result rather than the task or future"
    )


# Rules for mechanisms told by the objects on the path: their classes, the edges between them.


NAMED_ROOTS = ("fixture", "parametrize", "frame local")
"""Roots the code names by a name of its own (a fixture's, a parametrize argument's, a local's)."""
SPELLED_ROOTS = ("module", *NAMED_ROOTS)
"""Roots whose paths :func:`_spelled` reads as the code spells them."""


def _spelled(path: HolderPath, stop: int) -> str:
    """How the path reads up to (not including) its edge ``stop``: ``ACCELERATOR._models`` from a
    module's namespace, ``accelerator._models`` from a fixture's value (as the test names it) or a frame's local,
    ``<label>._models`` from another root."""
    edges = path.edges[:stop]
    if path.root.kind in NAMED_ROOTS and path.root.name:  # (as the code names it)
        return path.root.name + "".join(edge.text() for edge in edges)
    if path.root.kind != "module" or not edges or edges[0].kind != "attribute":
        return path.root.label + "".join(edge.text() for edge in edges)
    return edges[0].name + "".join(edge.text() for edge in edges[1:])


def _global_hook_entry(path: HolderPath) -> bool:
    """Whether the path passes through an entry of torch.nn's global module hooks (``_global_forward_hooks[3]``)."""
    return (
        path.root.kind == "module"
        and path.root.name == "torch.nn.modules.module"
        and any(edge.kind == "hook dict" and edge.name.startswith("_global_") for edge in path.hook_entries())
    )


def global_module_hook(group: Group, found: Sequence[str]) -> str | None:
    """A global module hook (register_module_forward_hook and kin) that keeps what it captured or appends to."""
    entries = [edge for path in group.holders if _global_hook_entry(path) for edge in path.hook_entries()]
    if not entries:
        return None
    return (
        f"a global module hook (torch.nn.modules.module.{entries[0].name}, registered with "
        "register_module_*_hook) runs for every module of the process and lives until it is removed, with what it "
        "captured and what it appends to: keep the handle register_module_*_hook() returns and call handle.remove() "
        "when done, and register it once, not on every run"
    )


_HOOK_CALLABLES = frozenset({"partial", "function", "method"})


def _hook_of_a_node(path: HolderPath) -> bool:
    """A hook dict only C++ holds (an autograd node's: grad_fn.register_hook), through one of its hooks."""
    first = _first_edge(path)
    return (
        path.root.kind == "outside gc"
        and path.root.type_name == "OrderedDict"
        and first is not None
        and first.kind == "item"
        and first.type_name in _HOOK_CALLABLES
    )


def hook_on_an_autograd_node(group: Group, found: Sequence[str]) -> str | None:
    """A hook on an autograd node (grad_fn.register_hook) whose callable keeps an object that keeps the node."""
    hooks = [path for path in group.holders if _hook_of_a_node(path)]
    if not hooks:
        return None
    partial = any((edge := _first_edge(path)) is not None and edge.type_name == "partial" for path in hooks)
    return (
        "a hook registered on an autograd node (tensor.grad_fn.register_hook) is kept by the node in C++, where "
        "Python's gc cannot see it, and keeps what it is bound to"
        + (" (functools.partial(hook, self) keeps self)" if partial else " (self, through a bound method or a closure)")
        + ": an object whose tensor's grad_fn holds such a hook keeps itself alive in a cycle gc cannot break: give "
        "the hook a weakref.ref(self) and look the object up through it, or remove the hook (handle.remove()) "
        "when done"
    )


def _tensor_hook_entry(path: HolderPath) -> Edge | None:
    """The callable kept in a tensor's hook dict read in C (register_post_accumulate_grad_hook's), or None."""
    for edge, after in path.pairs():
        if after is None or after.kind != "item" or edge.type_name != "OrderedDict":
            continue
        # (every entry of a tensor's own hook dict is a hook, a callable object's too; a dict a
        # tensor refers to in C is its hook dict where the entry is a function)
        if edge.kind == "tensor hooks" or (
            edge.kind == "reference" and edge.name in ("Parameter", "Tensor") and after.type_name in _HOOK_CALLABLES
        ):
            return after
    return None


def hook_bound_to_a_tensor(group: Group, found: Sequence[str]) -> str | None:
    """A hook on a tensor (register_post_accumulate_grad_hook and kin) whose callable keeps an object it is bound to."""
    entries = [entry for path in group.holders if (entry := _tensor_hook_entry(path)) is not None]
    if not entries:
        return None
    partial = any(entry.type_name == "partial" for entry in entries)
    parameter = any(
        (edge.kind == "reference" and edge.name == "Parameter")
        or (edge.type_name == "Parameter" and after is not None and after.kind == "tensor hooks")
        for path in group.holders
        for edge, after in path.pairs()
    )
    return (
        "a hook registered on a tensor (register_hook, register_post_accumulate_grad_hook) stays with the tensor"
        + (", here a parameter that outlives the test," if parameter else "")
        + " and keeps what it is bound to"
        + (" (functools.partial(fn, obj) keeps obj)" if partial else "")
        + ": each run registers another: keep the handle it returns and call handle.remove() when done"
    )


def _memo_entry(path: HolderPath) -> Edge | None:
    """The dict of a memoizing wrapper the path passes through, keyed by a call's arguments: a
    closure variable of the wrapper, or an attribute of the object it memoizes for, keyed by the
    function and the arguments (``obj._memoize__cache[(<function key>, (3,), ...)]``)."""
    for edge, after in path.pairs():
        if after is None or after.kind != "item":
            continue
        if edge.kind == "closure variable" and after.name.startswith("("):
            return edge
        if edge.kind == "attribute" and after.name.startswith("(<function key>,"):
            return edge
    return None


def memoizing_wrapper(group: Group, found: Sequence[str]) -> str | None:
    """A memoizing decorator's dict, in its wrapper's closure or on the object, that keeps every result by the call's arguments."""
    memos = [(path, memo) for path in group.holders if (memo := _memo_entry(path)) is not None]
    if not memos:
        return None
    path, memo = memos[0]
    if memo.kind == "attribute":
        cache = _spelled(path, path.edges.index(memo) + 1)
        return (
            f"a memoizing wrapper keeps every result it returned in a dict it sets on the object ({cache}), keyed by "
            "the function and the call's arguments, for as long as the object lives (a dataset: every item any index "
            "gave): do not memoize what returns tensors (a dataset's __getitem__), or bound the cache, or clear it "
            f"when done ({cache}.clear())"
        )
    return (
        f"a memoizing wrapper keeps every result it returned in a dict it closes over ('{memo.name}'), keyed by "
        "the call's arguments, for as long as the function lives (a decorated method: as long as its class): "
        "do not memoize what returns tensors (a dataset's __getitem__), or use a bounded cache "
        "(functools.lru_cache(maxsize=...)) and clear it when done"
    )


_MODULE_CONTAINERS = frozenset({"ModuleDict", "ModuleList", "ParameterDict", "ParameterList"})


def _model_in_a_container(path: HolderPath) -> tuple[str, str] | None:
    """``(container, submodule)`` where the path ends at a parameter of a model kept as an entry of a
    container: a list's or dict's (``submodule`` empty), or a ModuleDict's or ModuleList's (its name)."""
    edges = path.edges
    if len(edges) < 3 or path.opaque or edges[-1].kind != "attribute" or edges[-1].type_name != "Parameter":
        return None
    holder, owner = edges[-3], edges[-2]
    if owner.kind == "attribute" and holder.type_name in _MODULE_CONTAINERS:
        return _spelled(path, len(edges) - 2), owner.name
    # (the model's entry, then its submodules down to the parameter: snapshots[4][0].weight)
    entry = len(edges) - 2
    while entry > 1 and edges[entry].kind == "attribute":
        entry -= 1
    if edges[entry].kind == "item" and edges[entry - 1].type_name in ("list", "dict", "deque", "OrderedDict"):
        return _spelled(path, entry), ""
    return None


def models_kept_in_a_registry(group: Group, found: Sequence[str]) -> str | None:
    """Models kept as entries of a container (an Accelerator's prepared models, adapters in a ModuleDict) with their parameters."""
    held = [at for path in group.holders if (at := _model_in_a_container(path)) is not None]
    if not held or any(_class_attribute(path) is not None or path.root.kind in _TEARDOWN for path in group.holders):
        return None  # (a class's own container: the class attribute's diagnosis says how to let it go)
    container, submodule = held[0]
    if submodule:
        return (
            f"{container} gained submodules ('{submodule}') and keeps each with its parameters for as long as it "
            "lives (adapters or heads loaded one after another and never deleted): delete the ones done with "
            f"(del {container}[name]; peft's model.delete_adapter(name)), or load each into the same slot"
        )
    return (
        f"{container} keeps every model put in it, with its parameters, after the test has dropped its own "
        "reference: a registry of prepared models (as an Accelerator keeps), or copies kept as checkpoints "
        "(copy.deepcopy(model) appended at each improvement), grows with every model: remove them when done "
        "(accelerator.free_memory(), or clear the registry), prepare one model once and reuse it, or keep only the "
        "copy needed (best = copy.deepcopy(model), replaced, or its state_dict)"
    )


def _optimizer_state(path: HolderPath) -> int | None:
    """The index of the ``.state`` edge where the path goes into an optimizer's state, keyed by a parameter."""
    for index, (edge, after) in enumerate(path.pairs()):
        if (
            _is_attribute(edge, "state")
            and after is not None
            and (
                (after.kind == "item" and after.name in ("<Parameter key>", "<Tensor key>"))
                or (after.kind == "dict key" and after.type_name in ("Parameter", "Tensor"))
            )
        ):
            return index
    return None


def optimizer_state(group: Group, found: Sequence[str]) -> str | None:
    """An optimizer's per-parameter state (Adam's moments), kept for parameters added or replaced, or by a registry of optimizers."""
    for path in group.holders:
        index = _optimizer_state(path)
        if index is None:
            continue
        owner = path.edges[index - 1] if index else None
        if owner is not None and owner.kind == "item":
            return (
                f"{_spelled(path, index - 1)} keeps every optimizer put in it, and with each its state (Adam's "
                "exp_avg and exp_avg_sq for every parameter) and the parameters it is keyed by: a registry of "
                "prepared optimizers (as an Accelerator keeps) grows with every run: remove them when done "
                "(accelerator.free_memory(), or clear the registry)"
            )
        return (
            "optimizer.state keeps the state of each parameter it stepped (Adam's exp_avg and exp_avg_sq), keyed by "
            "the parameter itself, for as long as the optimizer lives: parameters added to it (add_param_group, as "
            "a model grows) and parameters replaced in its param_groups (densified, pruned, resized) all stay, with "
            "their state: make a model that grows, and its optimizer, in the test or a function-scoped fixture, not "
            "once for the session; move a replaced parameter's state to the new one "
            "(optimizer.state[new] = optimizer.state.pop(old)), or make a new optimizer"
        )
    return None


def compiled_models_cached(group: Group, found: Sequence[str]) -> str | None:
    """Compiled models (torch.compile's OptimizedModule) kept as entries of a cache that is never evicted."""
    for path in group.holders:
        for index, edge in enumerate(path.edges):
            if edge.kind == "item" and edge.type_name == "OptimizedModule":
                return (
                    f"{_spelled(path, index)} is a cache of torch.compile'd models (OptimizedModule) that "
                    "gains one on every run and never evicts: each keeps its module with its parameters and buffers: "
                    "compile once and reuse it (torch.compile(model, dynamic=True) where shapes vary), or bound the "
                    "cache and evict old entries"
                )
    return None


_LOGGERS = frozenset({"Logger", "RootLogger"})


def _through(path: HolderPath, type_name: str, attribute: str) -> bool:
    """Whether the path goes from an object of class ``type_name`` on into its attribute ``attribute``."""
    return any(
        edge.type_name == type_name and after is not None and _is_attribute(after, attribute)
        for edge, after in path.pairs()
    )


def log_record_arguments(group: Group, found: Sequence[str]) -> str | None:
    """A tensor passed to a logger, kept in a LogRecord's args by a handler that buffers records."""
    if not any(_through(path, "LogRecord", "args") for path in group.holders):
        return None
    return (
        "a logging handler that buffers records (logging.handlers.MemoryHandler, a QueueHandler, a test's log "
        "capture) keeps each LogRecord with its args, the tensors passed to the logger"
        + (" (with their autograd graphs)" if group.graph_bytes else "")
        + ": log numbers (logger.info('loss %.4f', loss.item())), or flush and close the handler"
    )


def handler_on_a_logger(group: Group, found: Sequence[str]) -> str | None:
    """A handler added to a logger, which logging keeps for the process, with what the handler refers to."""
    if not any(
        (edge.type_name in _LOGGERS and after is not None and _is_attribute(after, "handlers"))
        or (path.root.type_name in _LOGGERS and _is_attribute(path.edges[0], "handlers"))
        for path in group.holders
        if path.edges
        for edge, after in path.pairs()
    ) or any(_through(path, "LogRecord", "args") for path in group.holders):
        return None
    return (
        "a handler added to a logger (logger.addHandler) stays as long as the logger, which logging keeps for the "
        "whole process, with what the handler refers to"
        + (" (here a model's parameters)" if group.cls == "Parameter" else "")
        + ": each run adds another: remove it when done "
        "(logger.removeHandler(handler), in a finally or a fixture's teardown), or add it once"
    )


def warning_arguments(group: Group, found: Sequence[str]) -> str | None:
    """A tensor among a warning's arguments, kept wherever the warning is kept (a list of caught warnings)."""
    if not any(_through(path, "WarningMessage", "message") for path in group.holders) or recorded_warning(group, found):
        return None
    return (
        "a warning made with a tensor among its arguments (warnings.warn(LossSpike('...', loss))) keeps it for as "
        "long as the warning is kept (catch_warnings(record=True) lists, a trainer's collected warnings): warn with a "
        "message made of numbers (f'loss spiked to {loss.max().item():.1f}')"
    )


def _through_reference_of(path: HolderPath, type_name: str) -> bool:
    """Whether the path goes from an object of class ``type_name`` into what it holds in C (a cycle's saved items)."""
    return any(
        edge.type_name == type_name and after is not None and after.kind == "reference" for edge, after in path.pairs()
    )


def itertools_cycle(group: Group, found: Sequence[str]) -> str | None:
    """An itertools.cycle, which keeps a copy of every item of its first pass."""
    if not any(_through_reference_of(path, "cycle") for path in group.holders):
        return None
    return (
        "itertools.cycle keeps every item of its first pass to repeat it, for as long as the cycle lives (cycling "
        "a DataLoader keeps every batch of its first epoch): loop over the loader again instead (while True: yield from loader), which "
        "keeps no batch"
    )


def tee_buffer(group: Group, found: Sequence[str]) -> str | None:
    """What itertools.tee buffers for a branch that has not read it yet."""
    if not any(edge.type_name == "_tee_dataobject" for path in group.holders for edge in path.edges):
        return None
    return (
        "itertools.tee keeps every item one branch has read until every other branch has read it too: a branch that "
        "lags, or is never read, keeps all of them: read the branches in step, drop a branch that is not read (del "
        "it), or keep the items in a list where every branch needs them all anyway"
    )


def _pickle_memo(path: HolderPath) -> bool:
    """Whether the path goes through a pickle.Pickler's memo (the C Pickler's, read as a reference)."""
    return any(
        (edge.kind == "reference" and edge.name == "Pickler")
        or (edge.type_name in ("Pickler", "_Pickler") and after is not None and after.name == "memo")
        for edge, after in path.pairs()
    )


def pickle_memo(group: Group, found: Sequence[str]) -> str | None:
    """A pickle.Pickler reused across dump() calls, whose memo keeps every object it pickled."""
    if not any(_pickle_memo(path) for path in group.holders):
        return None
    return (
        "a pickle.Pickler keeps every object it has pickled in its memo (so that an object pickled twice is written "
        "once) until clear_memo(), and this one is reused across dump() calls: call clear_memo() after each dump(), "
        "or pickle each record on its own (pickle.dumps, or a Pickler per record)"
    )


def _scheduled_callback(path: HolderPath) -> bool:
    """Whether the path goes into the arguments of a callback scheduled on an asyncio event loop."""
    return any(_through(path, kind, "_args") for kind in ("Handle", "TimerHandle"))


def loop_not_run(group: Group, found: Sequence[str]) -> str | None:
    """A callback scheduled on an asyncio event loop, waiting with its arguments for the loop to run it."""
    if not any(_scheduled_callback(path) for path in group.holders):
        return None
    return (
        "a callback scheduled on an asyncio event loop (call_soon, call_soon_threadsafe, call_later) keeps its "
        "arguments until the loop runs it, and this loop has not: run the loop callbacks are scheduled on "
        "(loop.run_forever() in its own thread), close a loop no longer run (loop.close() drops what waits on it), "
        "or do not schedule on it"
    )


def _exit_stack_callback(path: HolderPath) -> bool:
    """Whether the path goes into what a contextlib.ExitStack keeps to call as it closes."""
    return any(_through(path, kind, "_exit_callbacks") for kind in ("ExitStack", "AsyncExitStack"))


def exit_stack_not_closed(group: Group, found: Sequence[str]) -> str | None:
    """A contextlib.ExitStack not closed, which keeps every callback and context given to it."""
    if not any(_exit_stack_callback(path) for path in group.holders):
        return None
    return (
        "a contextlib.ExitStack keeps every callback and context manager given to it, with their arguments, until it "
        "is closed, and this one was not: use one with ExitStack() block per unit of work, or call close() (or "
        "pop_all()) when each is done"
    )


def mode_left_on_the_stack(group: Group, found: Sequence[str]) -> str | None:
    """A TorchFunctionMode or TorchDispatchMode entered and never exited, which torch keeps on its mode stack."""
    if not any(path.root.kind == "mode stack" for path in group.holders):
        return None
    return (
        "a mode entered and not exited stays on torch's mode stack, with what it keeps, and runs on every torch call "
        "after (in the tests after this one too): enter it in a with block, or call its __exit__ in a finally"
    )


def _generator_kept(path: HolderPath) -> tuple[str, bool] | None:
    """What keeps the unfinished generator the path goes into (``LOOP._iterator``), and whether
    that is a DataLoader's iterator; or None."""
    if path.opaque or path.through_local():
        return None
    for index, (edge, after) in enumerate(path.pairs()):
        if edge.type_name == "generator" and after is not None and after.kind in ("suspended local", "reference"):
            loaders = [at for at, kept in enumerate(path.edges[:index]) if kept.type_name.endswith("DataLoaderIter")]
            return _spelled(path, (loaders[0] if loaders else index) + 1), bool(loaders)
    return None


def suspended_generator(group: Group, found: Sequence[str]) -> str | None:
    """An unfinished generator kept alive (a DataLoader iterator kept between epochs), whose frame keeps its locals."""
    kept = [at for path in group.holders if (at := _generator_kept(path)) is not None]
    if not kept:
        return None
    holder, loader = kept[0]
    if not loader:
        return (
            "an unfinished generator keeps the locals of its suspended frame (its inputs, what it computed last) for "
            f"as long as it lives, here {holder}: run it to its end, close() it when done with it, or drop it"
        )
    return (
        "an unfinished generator keeps the locals of its suspended frame (a shuffle buffer, batches read ahead) for "
        f"as long as the iterator that runs it lives, here {holder}: drop the iterator when the epoch ends "
        "(set it to None, and start a new iter(loader) for the next), or close() the generator"
    )


def threading_local(group: Group, found: Sequence[str]) -> str | None:
    """A threading.local, which keeps one value per thread, each cleared only by its own thread."""
    locals_ = [edge for path in group.holders for edge, after in path.pairs() if edge.type_name == "_local" and after]
    if not locals_:
        return None
    return (
        f"{locals_[0].name} is a threading.local: it keeps a separate value for every thread, and what it caches in "
        "one thread stays until that thread clears it or ends: clear it when done (in the thread that filled it), or "
        "bound the cache"
    )


def mutable_default_argument(group: Group, found: Sequence[str]) -> str | None:
    """A function's default argument, made once as the function is defined and shared by every call."""
    for path in group.holders:
        for index, edge in enumerate(path.edges):
            if edge.kind == "attribute" and edge.name in ("__defaults__", "__kwdefaults__") and index > 0:
                function = path.edges[index - 1].name
                return (
                    f"a default argument of {function}() is made once, as the function is defined, and every call "
                    "shares it: what a call adds to it stays as long as the function: default to None and make a "
                    "new one in the call (seen=None, then seen = [] if seen is None else seen)"
                )
    return None


_QUEUES = frozenset({"Queue", "LifoQueue", "PriorityQueue"})


def queue_not_drained(group: Group, found: Sequence[str]) -> str | None:
    """Items put on a queue.Queue that nothing got from it."""
    if not any(_through(path, kind, "queue") for path in group.holders for kind in _QUEUES):
        return None
    return (
        "a queue.Queue keeps every item put on it until something gets it, and nothing did (its consumer stopped, "
        "or is slower than its producer): drain it when done (get() until empty), bound it (Queue(maxsize=...)) so "
        "that the producer waits, or put only what the consumer needs"
    )


def _pending_work(path: HolderPath) -> bool:
    """Whether the path goes into the arguments of work submitted to a concurrent.futures executor
    that no worker has run yet."""
    return any(_through(path, "_WorkItem", attribute) for attribute in ("args", "kwargs", "fn"))


def pending_work(group: Group, found: Sequence[str]) -> str | None:
    """Work submitted to an executor, waiting on its queue with its arguments."""
    if not any(_pending_work(path) for path in group.holders):
        return None
    return (
        "work submitted to a concurrent.futures executor keeps its function and arguments until a worker runs it, "
        "and this work has not run: submitted faster than the workers finish, the queue of pending work grows: wait "
        "for the last future (future.result()) before submitting more, or bound what is pending, and "
        "executor.shutdown(cancel_futures=True) when done"
    )


def open_figure(group: Group, found: Sequence[str]) -> str | None:
    """What a figure pyplot keeps open holds (the data given to its plots, ticks or images),
    where only such figures hold the group."""
    named = _named(group)
    figures = [path.root.label for path in named if path.root.kind == "pyplot figure"]
    if not figures or len(figures) < len(named):
        return None
    return (
        f"{figures[0].removesuffix(' (open)')} is still open: pyplot keeps every figure it made until it is closed, "
        "and with it what its plots were given (tensors, or numpy arrays over them): close each figure the test "
        "makes (plt.close(fig), or plt.close('all') at its end or in a fixture's teardown)"
    )


def thread_not_ended(group: Group, found: Sequence[str]) -> str | None:
    """What a thread object keeps (its target, its arguments, its attributes) until the thread ends."""
    threads = [path.root.label for path in group.holders if path.root.kind == "thread"]
    if not threads:
        return None
    return (
        f"the {threads[0]} keeps its target, its arguments and its attributes until it ends, and it has not: a "
        "threading.Timer still waiting, a worker blocked or looping: cancel the timer (timer.cancel()), or stop the "
        "thread and join it when done (a daemon thread is never joined for you), or pass it only what it needs"
    )


def context_variable(group: Group, found: Sequence[str]) -> str | None:
    """A value a contextvars.ContextVar was set to, kept by the context it was set in."""
    names = [edge.name for path in group.holders for edge in path.edges if edge.kind == "context variable"]
    if not names:
        return None
    return (
        f"the ContextVar {names[0]} keeps the value it was set to in the context it was set in, as long as that "
        "context lives (a thread's own: as long as the thread; the main thread's: the whole process): reset it when "
        "done (token = var.set(value), then var.reset(token) in a finally), or set it inside "
        "contextvars.copy_context().run(...)"
    )


_ITEM_BYTES = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
    "complex64": 8,
    "complex128": 16,
}
SMALL_VIEW_RATIO = 4
"""A group whose storages are this many times the size of its tensors' own elements is kept by views."""


def small_view_of_a_large_storage(group: Group, found: Sequence[str]) -> str | None:
    """Small tensors that are views on much larger storages (a slice, an index, a loaded slice) and keep them whole."""
    item = _ITEM_BYTES.get(group.dtype)
    if group.kind != "tensor" or item is None or not group.count:
        return None
    elements = group.count * item
    for size in group.shape:
        elements *= size
    # (every row of a batch kept, each a view: together they view the whole storage)
    elements = max(elements, group.viewed)
    if group.bytes < SMALL_VIEW_RATIO * elements or group.bytes - elements < 4096:
        return None
    return (
        f"a view keeps its whole storage: these tensors' elements take {format_size(elements)}, the storages they "
        f"view {format_size(group.bytes)} (an index or slice such as hidden[0], or a slice torch.load gives back, "
        "shares the storage of the whole tensor): keep a copy of what you need (hidden[0].clone()) and drop the rest"
    )


def autocast_region_left_open(group: Group, found: Sequence[str]) -> str | None:
    """Tensors held from C++ while an autocast region the test entered, or another thread's, is still open."""
    if not group.holders or not all(path.root.kind == "autocast cache" for path in group.holders):
        return None
    thread = group.holders[0].root.thread
    if thread:
        return (
            f"an autocast region that thread '{thread}' keeps open around its whole loop caches the low-precision "
            "cast of each weight it casts, and each cast's grad_fn keeps its weight: the cache is per thread, and "
            "only that thread's outermost region exit clears it, so every model it serves stays: enter "
            "torch.autocast inside the loop, around each request (`with torch.autocast(...):`), not around the "
            "thread's whole loop"
        )
    return (
        "an autocast region entered and never exited (region.__enter__() without __exit__) caches the "
        "low-precision cast of each weight it casts, and the cast's grad_fn keeps the weight, until the region "
        "exits: enter it with `with torch.autocast(...):`, or call its __exit__(None, None, None) when done"
    )


def held_in_cpp_for_the_test(group: Group, found: Sequence[str]) -> str | None:
    """Tensors the test made that nothing in Python refers to: PyTorch keeps them in C++ for it."""
    if (
        not group.holders
        or not all(path.root.kind == "held from C++" for path in group.holders)
        or group.made_inside_library is not False
    ):
        return None
    return (
        "nothing in Python refers to these tensors the test made: PyTorch (or an extension) keeps them in C++ for "
        "something the test asked of it (torch.jit.script and torch.jit.trace keep a module's tensors with each "
        "compiled module, and a tensor a traced or scripted function reads from outside its arguments, a global "
        "or a closure variable, as a constant of its graph for the whole process; a hook registered in C++ keeps "
        "what it captured): script or trace once (in a module- or session-scoped fixture), pass such a tensor to "
        "the compiled function as an argument, or remove the hook when done"
    )


def all_from(group: Group, kind: str) -> bool:
    """Whether the group has holder paths, each from a root of ``kind``."""
    return bool(group.holders) and all(path.root.kind == kind for path in group.holders)


def cycle_kept_from_outside(group: Group, found: Sequence[str]) -> str | None:
    """Tensors an object keeps that lies on a reference cycle nothing in Python reaches, kept from outside gc."""
    if not all_from(group, "kept cycle"):
        return None
    return (
        "nothing in Python reaches the object that keeps these tensors: it lies on a reference cycle that something "
        "outside Python's gc keeps alive (PyTorch's C++: torch.jit.script and torch.jit.trace keep the Python methods "
        "of what they compiled, which refer back to it; a hook registered in C++; an extension): script or trace once "
        "(in a module- or session-scoped fixture), or release what keeps it"
    )


def cycle_frozen(group: Group, found: Sequence[str]) -> str | None:
    """Tensors an object keeps that lies on a reference cycle nothing in Python reaches, while the suite froze the heap."""
    if not all_from(group, "frozen cycle"):
        return None
    return (
        "nothing in Python reaches the object that keeps these tensors: it lies on a reference cycle, and the heap "
        "was frozen (gc.freeze()) as the test ran: a cycle frozen with it is never collected, even once garbage "
        "(collections skip what gc.freeze() set aside), unless something outside Python's gc keeps it: call "
        "gc.unfreeze() once what gc.freeze() was for is done, or break the cycle (an object keeping its own bound "
        "method, self.callback = self.report, can keep weakref.WeakMethod(self.report) instead)"
    )


_CLASS_TYPES = frozenset({"type", "ABCMeta"})
_METHOD_TYPES = frozenset({"function", _LRU_WRAPPER, "staticmethod", "classmethod", "property", "cached_property"})


def _method(edge: Edge) -> bool:
    """Whether the edge leads from a class to a method it defines (a function, a cached one), not to its data."""
    return edge.type_name in _METHOD_TYPES


def _class_attribute(path: HolderPath) -> tuple[str, bool] | None:
    """``("Model.CACHE", entry)`` where the path passes from a class to an attribute of its own
    (not an instance's), ``entry`` where it goes on into an entry of it; else None."""
    edges = path.edges
    for index, edge in enumerate(edges[:-1]):
        after = edges[index + 1]
        if edge.kind == "attribute" and edge.type_name in _CLASS_TYPES and _is_attribute(after) and not _method(after):
            entry = index + 2 < len(edges) and edges[index + 2].kind == "item"
            return f"{edge.name}.{after.name}", entry
    return None


def _registers_classes(path: HolderPath) -> bool:
    """Whether the path goes from a class's own container into an entry that is a class."""
    return any(
        edge.kind == "attribute"
        and edge.type_name in _CLASS_TYPES
        and after.kind == "attribute"
        and entry.kind == "item"
        and entry.type_name in _CLASS_TYPES
        for edge, after, entry in zip(path.edges, path.edges[1:], path.edges[2:], strict=False)
    )


def class_attribute(group: Group, found: Sequence[str]) -> str | None:
    """A class's own attribute (a cache, a registry, a last value): one for every instance, alive as long as the class."""
    held = [at for path in group.holders if (at := _class_attribute(path)) is not None]
    if not held or finalizer_keeps_its_object(group, found) is not None:  # (weakref.finalize._registry)
        return None
    name, entry = held[0]
    if any(_registers_classes(path) for path in group.holders):
        return (
            f"{name} keeps every class added to it (a registry that __init_subclass__ or a metaclass fills), and with "
            "each class its class attributes: classes made at run time (type(name, bases, namespace), a class "
            "statement in a function) then live for ever: register them weakly (a weakref.WeakSet), find them with "
            "cls.__subclasses__() instead, or do not register classes made at run time"
        )
    if entry:
        return (
            f"{name} is a class attribute, not an instance attribute: one container shared by every instance, "
            "alive as long as the class, so what any instance adds to it stays: make it an instance attribute (set "
            "it in __init__), or bound it and clear it after use"
        )
    return (
        f"{name} is a class attribute, not an instance attribute: it lives as long as the class, and so does what "
        "it is set to: set it on the instance (self.name = ... in a method), or set it back to None when done"
    )


_FILLED = frozenset({"list", "dict", "deque", "OrderedDict", "defaultdict"})

_RESET_SOURCES = frozenset({"_defaults"})
"""Containers reset() reads from rather than empties: torchmetrics' ``Metric._defaults`` keeps
each state's starting value, copied back on every reset, one entry per state however many
updates ran."""


def _accumulated_state(path: HolderPath) -> str | None:
    """``METRIC.preds`` where the path goes from an object with a reset() method (an edge's, or
    the root's: a fixture's value) into a container it keeps as an attribute, then into an entry of it."""
    edges = path.edges
    owners = [(path.root.name or path.root.label, path.root.resets), *((edge.name, edge.resets) for edge in edges)]
    for index, (name, resets) in enumerate(owners[: len(edges) - 1]):  # (each with a state and an entry after it)
        state, entry = edges[index], edges[index + 1]
        if (
            resets
            and state.kind == "attribute"
            and state.type_name in _FILLED
            and state.name not in _RESET_SOURCES
            and entry.kind == "item"
        ):
            return f"{name}.{state.name}"
    return None


def accumulator_never_reset(group: Group, found: Sequence[str]) -> str | None:
    """State a metric or meter (an object with a reset() method) accumulated in a container, never reset."""
    held = [at for path in group.holders if (at := _accumulated_state(path)) is not None]
    if not held:
        return None
    owner = held[0].rpartition(".")[0]
    return (
        f"{held[0]} accumulates what every update adds (a metric's or a meter's state) until {owner}.reset() is "
        f"called: call {owner}.reset() after compute() (at the end of each test or epoch), or make a new one per test"
    )


def tensors_kept_with_their_graphs(group: Group, found: Sequence[str]) -> str | None:
    """Tensors kept in numbers, each with the autograd graph that made it (a loss appended after backward)."""
    if group.kind != "tensor" or group.count <= 1 or group.with_graph != group.count or group.graph_bytes:
        return None
    return (
        f"each of the {group.count} tensors kept carries the autograd graph that made it (its grad_fn and the "
        "nodes behind it live as long as the tensor, even once backward freed what they saved): keep loss.item() "
        "for a number, or tensor.detach() for a value, instead of the tensor"
    )


def _deque_entry(path: HolderPath) -> int | None:
    """The index of the edge into a collections.deque's entry on the path, or None."""
    for index, (edge, after) in enumerate(path.pairs()):
        if edge.type_name == "deque" and after is not None and after.kind == "item":
            return index
    return None


def deque_filling(group: Group, found: Sequence[str]) -> str | None:
    """Entries a collections.deque keeps, where nothing more specific fits: it is unbounded, or bounded far above what is needed."""
    held = [(path, index) for path in group.holders if (index := _deque_entry(path)) is not None]
    if found or not held:
        return None
    path, index = held[0]
    deque = _spelled(path, index + 1)
    return (
        f"{deque} is a collections.deque, which keeps every entry appended until it holds its maxlen of them, for "
        "ever where it has none (a replay buffer, a history of steps): give it a maxlen no bigger than what is "
        f"needed (collections.deque(maxlen=N)), or take out what is done ({deque}.popleft(), .clear())"
    )


_NUMBERED = re.compile(r"(.*_)(\d{2,})")
"""An attribute named from a number, ``cos_sin_516``: its prefix and the number."""


def attribute_per_value(group: Group, found: Sequence[str]) -> str | None:
    """Tensors set as attributes (or buffers) named from a number that varies, one more for each value."""
    numbered = [
        (path, match)
        for path in _named(group)
        if path.edges and path.edges[-1].kind == "attribute" and (match := _NUMBERED.fullmatch(path.edges[-1].name))
    ]
    if found or not numbered:
        return None
    path, match = numbered[0]
    owner = _spelled(path, len(path.edges) - 1)
    return (
        f"{owner}.{match[0]} is named from a number ({match[2]}): where the code makes the name from a value that "
        f"varies (setattr or register_buffer(f'{match[1]}{{n}}', ...) for a sequence length, a step), each value adds "
        f"one more attribute, and every one stays with {owner}: keep one, for the largest value, and slice it "
        "(cache[:, :n]), or keep a bounded cache keyed by the value"
    )


def module_level_container(group: Group, found: Sequence[str]) -> str | None:
    """Entries a module-level container gained and never let go, where nothing more specific fits."""
    if (
        found
        or group.count <= 1
        or not group.holders
        or not all(_module_container_entry(path) for path in group.holders)
    ):
        return None
    return (
        f"a module-level container gained {group.count} entries and never let them go (a cache "
        "without eviction, a history list): bound it, evict old entries, or clear it after use"
    )


_ROOT_LIFETIMES: dict[str, str] = {
    "module": "it hangs from module {name}, alive as long as the process",
    "run-time module": "it hangs from {label}, alive until it is taken out",
    "frame local": "it hangs from a local of a frame still running ({label})",
    "thread local": "it hangs from a local of a frame of another thread ({label}), alive as long as that frame",
    "frame": "it hangs from a frame a traceback keeps ({label}), alive as long as the traceback",
    "class": "it hangs from {label}, alive as long as the process",
    "fixture": "it hangs from {label}, alive until that scope ends",
    "parametrize": "it hangs from {label}, which pytest keeps for the session",
    "pytest instance": "it hangs from {label}",
    "test class": "it hangs from {label}, which its module keeps for the session",
    "TestCase class": "it hangs from {label}, which its module keeps for the session",
    "failure": "it hangs from a frame of the test's failure ({label}), kept with its traceback",
    "step": "it hangs from the step function given to the check",
    "atexit": "it hangs from a callback registered with atexit, kept until the process exits",
    "cycle": "it hangs from a reference cycle ({label}) that only the cyclic collector frees",
    "thread": "it hangs from {label}, alive until the thread ends",
    "pyplot figure": "it hangs from {label}, which pyplot keeps until it is closed",
    "signal handler": "it hangs from {label}, which the signal module keeps until another replaces it",
    "mode stack": "it hangs from {label}, which torch keeps until the mode exits",
}
_LAST_EDGE_FIXES: dict[str, str] = {
    "item": "the code added this entry and never removed it: remove it (del, .pop(), .clear()) when done",
    "attribute": "the code set this attribute and never reset it: set it back to None (or del it) when done",
    "local": "the frame keeps it until its function returns: del the local when done, or return it",
    "gradient": "a parameter's .grad keeps it: model.zero_grad(set_to_none=True) or del param.grad when done",
    "closure variable": "a function's closure captured it: capture only what the function needs, or drop the "
    "function when done",
    "dict key": "a dict keeps its keys as it keeps its values, and these are keys: key it by a name or id(tensor) "
    "instead of the tensor, use torch.utils.weak.WeakTensorKeyDictionary, or remove the entry (del, .pop(), "
    ".clear()) when done",
}
_LAST_EDGE_KINDS: dict[str, str] = {
    "item": "item",
    "container item": "item",
    "set element": "item",
    "dict key": "dict key",
    "attribute": "attribute",
    "hook dict": "attribute",
    "local": "local",
    "suspended local": "local",
    "gradient": "gradient",
    "closure variable": "closure variable",
    "cell contents": "closure variable",
}
MAX_HOLDER_TEXT = 80
"""How much of a holder's path a fallback diagnosis quotes (its end, where it is longer)."""


def _decisive_edge(path: HolderPath, others: Sequence[HolderPath] = ()) -> int:
    """The index of the edge the fix is about: the last entry of a container on the path (what
    holds a kept model is the entry the model was added as, not its parameter's attribute), one
    the code can remove (a tuple's is part of what the entry before it holds: ``past_key_values[0][0]``
    of an output kept in a dict), else the last edge (-1 where there is none). Where ``others``,
    the group's other paths, go the same way but by other entries of one container (``_records[135]``,
    ``_records[143]``, each then ``.components[0].img``), that container's entry: it is the one
    that gains them."""
    containers = path.type_names()  # (the class of what each edge leaves is the one before it)
    entries = [
        index for index, edge in enumerate(path.edges) if _LAST_EDGE_KINDS.get(edge.kind) in ("item", "dict key")
    ]
    removable = [index for index in entries if containers[index] != "tuple"]
    alike = [other for other in others if len(other.edges) == len(path.edges)]
    varying = [index for index in removable if any(other.edges[index] != path.edges[index] for other in alike)]
    return (varying or removable or entries)[-1] if entries else len(path.edges) - 1


def _edges_text(edges: Sequence[Edge]) -> str:
    text = "".join(edge.text() for edge in edges).removeprefix(".")
    return text if len(text) <= MAX_HOLDER_TEXT else "..." + text[-MAX_HOLDER_TEXT:]


def what_keeps_it(group: Group, found: Sequence[str]) -> str | None:
    """Where no other rule fits a group with a holder named in Python, what holds it and for how long, from the path's root and its last entry or edge."""
    path = next((path for path in group.holders if not path.opaque), None)
    if found or path is None or (not path.edges and path.root.kind == "frame local"):
        return None  # (a running function's own local: its business until it returns)
    decisive = _decisive_edge(path, [other for other in group.holders if other is not path and not other.opaque])
    holder = _edges_text(path.edges[: decisive + 1]) or path.root.label
    rest = path.edges[decisive + 1 :]
    root = path.root
    lifetime = _ROOT_LIFETIMES.get(root.kind, "it hangs from {label}").format(
        name=root.name or root.label, label=root.label
    )
    last = path.edges[decisive].kind if path.edges else ("local" if path.through_local() else "")
    fix = _LAST_EDGE_FIXES.get(
        _LAST_EDGE_KINDS.get(last, ""), "drop this reference when done, or keep only what is needed"
    )
    what = f"what {holder} holds" if rest else holder  # (the held by line gives the rest of the path)
    if _LAST_EDGE_KINDS.get(last) in ("item", "attribute"):
        fix += _keep_less(group)
    return f"{what} keeps these tensors: {lifetime}, and {fix}"


def _keep_less(group: Group) -> str:
    """What to keep of the tensors instead, where the group says: a number of a tensor of one, a
    value without its autograd graph, a copy off an accelerator; nothing where none applies."""
    ways = [".item() for a number"] if group.shape == () else []
    graph = bool(group.with_graph or group.graph_bytes)
    accelerator = group.device.partition(":")[0] not in ("cpu", "meta")
    if graph or accelerator:
        ways.append(
            (".detach()" if graph else "")
            + (".cpu()" if accelerator else "")
            + " for a value"
            + (" without its graph" if graph else "")
            + (" off the device" if accelerator else "")
        )
    return f", or keep only what is needed ({', '.join(ways)})" if ways else ""


SOLE_RULES: list[Rule] = [kept_history_in_a_gradient, kept_history, torch_cache, checkpoint_hooks, open_figure]
"""Rules whose diagnosis, where one fits, is the group's only one (the first that fits)."""

RULES: list[Rule] = [
    create_graph_cycle,
    graph_carried_by_a_loop,
    pack_hook_kept_its_output,
    saved_a_view_of_its_output,
    distribution_kept_with_its_graph,
    echoed_value,
    written_with_a_graph,
    graph_kept,
    grad_fn_kept,
    numpy_array,
    pruned_again,
    parametrization_stacked,
    hook_keeps,
    lru_cache,
    last_error,
    collector_saved_garbage,
    rerunfailures_failure,
    stored_exception,
    exception_arguments,
    kept_frame,
    exit_callback,
    signal_handler,
    module_made_at_run_time,
    saved_tensors_stored_by_a_pack_hook,
    closure,
    thread_frame,
    finalizer_keeps_its_object,
    fixture_gradients,
    gradient_of_an_input,
    test_instance,
    test_class_attribute,
    record_property,
    recorded_warning,
    parametrized_list_appended_to,
    parametrized_object_state,
    mock_calls,
    weak_key_value_holds_its_key,
    done_task_result,
    global_module_hook,
    hook_on_an_autograd_node,
    hook_bound_to_a_tensor,
    memoizing_wrapper,
    models_kept_in_a_registry,
    optimizer_state,
    compiled_models_cached,
    log_record_arguments,
    handler_on_a_logger,
    warning_arguments,
    itertools_cycle,
    tee_buffer,
    pickle_memo,
    loop_not_run,
    exit_stack_not_closed,
    mode_left_on_the_stack,
    suspended_generator,
    threading_local,
    mutable_default_argument,
    queue_not_drained,
    pending_work,
    thread_not_ended,
    context_variable,
    small_view_of_a_large_storage,
    autocast_region_left_open,
    held_in_cpp_for_the_test,
    cycle_kept_from_outside,
    cycle_frozen,
    class_attribute,
    accumulator_never_reset,
    tensors_kept_with_their_graphs,
    deque_filling,
    attribute_per_value,
    fixture_state,
    module_level_container,
    what_keeps_it,
]
"""Rules that each add their diagnosis, in the order a report lists them (the last reads what came before)."""

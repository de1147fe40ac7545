"""Holder paths as data: a root with a kind, then the edges from it to a leaked tensor, each with a kind.

Every decision about what holds a leak (a diagnosis, memory set aside as PyTorch's own) reads these
kinds and names; the one-line text (``tests.test_cache.CACHE['user-42']``) is rendered only where a
report writes it out (:meth:`HolderPath.render`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

RootKind = Literal[
    "module",  # a module in sys.modules
    "run-time module",  # a module code made (no file) and put in sys.modules
    "frame local",  # a local of a frame running in the thread that searched (the test's)
    "thread local",  # a local of a frame running in another thread
    "frame",  # a frame nothing running refers to (kept by a traceback)
    "class",  # a class nothing in gc refers to
    "fixture",  # the value of a fixture wider than a test
    "parametrize",  # a parametrize value pytest keeps for the session
    "pytest instance",  # the class instance pytest keeps of a test
    "test class",  # a test's class (or a class it derives from), which its module keeps for the session
    "TestCase class",  # the same, for a unittest.TestCase
    "record_property",  # the record_property values pytest keeps of a test
    "pytest warnings",  # the warnings pytest recorded
    "failure",  # a frame of the test's own failure, kept with its traceback
    "step",  # the step function given to a step check
    "value",  # another value the caller names
    "atexit",  # a callback registered with atexit (or its object, or an argument), which CPython keeps outside gc
    "held from C++",  # nothing in Python refers to it
    "autocast cache",  # held from C++ while an autocast region the test entered is still open
    "own graph",  # held from C++ by its own autograd graph, to which a saved_tensors_hooks pack hook gave it
    "outside gc",  # the farthest holder found, which nothing gc sees refers to
    "search limit",  # the farthest holder found where the search stopped at its depth (its holders not looked for)
    "changed",  # its holders changed while they were searched
    "cycle",  # an object on a reference cycle the collector freed
    "context",  # a thread's contextvars context, which its thread state keeps outside gc
    "thread",  # a thread started and not ended, which threading keeps in its table of them
    "kept cycle",  # the nearest owner on a reference cycle of holders nothing found refers to, kept from outside gc
    "frozen cycle",  # as "kept cycle", found while the suite had frozen the heap (gc.freeze()): maybe garbage frozen
    "pyplot figure",  # a matplotlib figure pyplot made, which it keeps open until it is closed
    "signal handler",  # a handler given to signal.signal, which the signal module keeps outside gc
    "mode stack",  # a TorchFunctionMode or TorchDispatchMode entered and not exited, which torch keeps in C++
]
"""What a holder path starts at."""

EdgeKind = Literal[
    "attribute",  # .name: an object's attribute, a slot, a function's __globals__
    "item",  # [key]: a list's, tuple's or dict's entry
    "local",  # local 'name' of a frame
    "suspended local",  # local 'name' of an unfinished generator's (or coroutine's) suspended frame
    "dict key",  # a key of a dict (not its value)
    "container item",  # an entry of a list or tuple, not found again by identity
    "closure variable",  # closure var 'name' of a function
    "cell contents",
    "set element",
    "module state",  # what a C module keeps outside its namespace
    "class internals",
    "function internals",
    "calling frame",
    "frame internals",
    "traceback",  # an exception's __traceback__
    "traceback frame",  # a traceback entry's frame (name: function:line)
    "next traceback",
    "lru_cache",  # a functools.lru_cache wrapper's cache
    "lru_cache entry",
    "hook dict",  # an attribute named _*_hooks (a module's hooks)
    "tensor hooks",  # the hooks dict a tensor keeps in C (register_hook)
    "array base",  # a numpy array's base
    "reference",  # a reference read through none of the above (name: the class it leads to)
    "autograd node",  # a grad_fn Python holds whose graph keeps the tensor (name: the node's class)
    "gradient",  # a tensor's .grad
    "saved tensor",  # a TorchScript module attribute's autograd graph (name: the attribute)
    "numpy memory",  # a numpy array sharing the tensor's memory, unseen by gc
    "dlpack capsule",
    "future value",  # a finished torch.futures.Future's value
    "context variable",  # the value a ContextVar was set to in a context (name: the variable's name, quoted)
]
"""How one object on a holder path refers to the next."""

_EDGE_FORMS: dict[str, str] = {
    "attribute": ".{name}",
    "item": "[{name}]",
    "local": " local '{name}'",
    "suspended local": " local '{name}'",
    "dict key": " -> dict key",
    "container item": " -> {name} item",
    "closure variable": " -> closure var '{name}'",
    "cell contents": " -> cell contents",
    "set element": " -> set element",
    "module state": " -> module state",
    "class internals": " -> class internals",
    "function internals": " -> function internals",
    "calling frame": " -> calling frame",
    "frame internals": " -> frame internals",
    "traceback": ".__traceback__",
    "traceback frame": ".tb_frame ({name})",
    "next traceback": ".tb_next",
    "lru_cache": " -> lru_cache",
    "lru_cache entry": " -> lru_cache entry",
    "hook dict": ".{name}",
    "tensor hooks": ".{name}",
    "array base": ".base",
    "reference": " -> <{name}>",
    "autograd node": " -> autograd graph of {name}",
    "gradient": ".grad",
    "saved tensor": ".{name}.grad_fn",
    "numpy memory": " (a numpy array sharing its memory)",
    "dlpack capsule": " (a DLPack capsule of it)",
    "future value": ".value()",
    "context variable": "[ContextVar {name}]",
}

OPAQUE_ROOTS: frozenset[RootKind] = frozenset(
    {
        "held from C++",
        "autocast cache",
        "own graph",
        "outside gc",
        "search limit",
        "kept cycle",
        "frozen cycle",
        "changed",
    }
)
"""Roots that name no holder in Python the test's code can reach."""
LOCAL_ROOTS: frozenset[RootKind] = frozenset({"frame local", "thread local"})
PYTEST_LISTS: frozenset[RootKind] = frozenset({"record_property", "pytest warnings"})
"""pytest's lists that gain an entry with every run of a test."""

MAX_STEPS_SHOWN = 24
"""A path longer than this many steps is shown with its middle left out (a linked list of 5,000
nodes would make a line of 15 KB)."""

HELD_FROM_CPP = "<no Python reference: held from C++, e.g. by a hook or cache inside torch or an extension>"
CHANGED = "<its holders changed while they were searched (another thread at work?): not named>"


@dataclass(frozen=True)
class Root:
    """Where a holder path starts."""

    kind: RootKind
    label: str
    """How it reads: a module's name, ``test_fit:12 local 'model'``, ``fixture 'model' (module scope)``."""
    type_name: str = ""
    """The kind a drawn graph gives its node (a class name, ``module``, ``frame local``)."""
    name: str = ""
    """A module's ``__name__``, a local's name."""
    thread: str = ""
    """For ``thread local`` (and ``autocast cache`` of another thread): the thread's name."""
    thread_id: int = 0
    """For ``thread local`` (and ``autocast cache`` of another thread): the thread's ident (names repeat: a test run again starts its thread again)."""
    resets: bool = False
    """For a named value (a fixture's) and a frame local: whether the value has a ``reset()``
    method (a metric, a meter), as :attr:`Edge.resets`."""


@dataclass(frozen=True)
class Edge:
    """One reference on a holder path."""

    kind: EdgeKind
    name: str = ""
    """The attribute, local or closure variable, the key as source text, the class of a node."""
    type_name: str = ""
    """The class of the object it leads to."""
    resets: bool = False
    """Whether the object it leads to has a ``reset()`` method (a metric, a meter): state it
    accumulates is meant to be let go by calling it."""
    pack_hook: str = ""
    """Where the object it leads to is the state of a ``saved_tensors_hooks`` pack hook entered
    while a check ran (what the hook is bound to, or a container it stores in): the hook's name."""
    exception: bool = False
    """Whether the object it leads to is an exception."""
    distribution: bool = False
    """Whether the object it leads to is a ``torch.distributions`` distribution."""

    def text(self) -> str:
        """How the edge reads after what it leaves: ``.cache``, ``['user-42']``, `` -> closure var 'seen'``."""
        if self.kind == "attribute" and not all(part.isidentifier() for part in self.name.split(".")):
            # (a child a module names by number, nn.Sequential's and nn.ModuleList's: seq[0], not seq.0;
            # one nn.ModuleDict names by a key no attribute could be: layers['block-1'])
            return f"[{self.name}]" if self.name.isdigit() else f"[{self.name!r}]"
        return _EDGE_FORMS[self.kind].format(name=self.name)


@dataclass(frozen=True)
class HolderPath:
    """The references that keep a tensor alive: a root, then the edges from it to the tensor."""

    root: Root
    edges: tuple[Edge, ...] = ()
    cycle: tuple[Edge, ...] | None = None
    """For a ``cycle`` root: the edges that lead from it back to itself."""
    earlier_run: int = 0
    """For a path found for an alike tensor an earlier run of the test left, not for the group's
    own: that run (from 1), which :meth:`render` says."""

    def with_edge(self, edge: Edge) -> HolderPath:
        return HolderPath(self.root, (*self.edges, edge), self.cycle)

    def way(self) -> tuple[Any, ...]:
        """The path with the keys and indices of its entries, and the numbers in its root's label,
        left out: two paths the same way hold entries of one container (``LOSSES[3]``,
        ``LOSSES[4]``), or go alike from roots numbered apart (``pyplot figure 8``, ``10``)."""
        return (
            self.root.kind,
            re.sub(r"\d+", "", self.root.label),
            tuple((edge.kind, "" if edge.kind == "item" else edge.name) for edge in self.edges),
        )

    def parts(self) -> list[tuple[str, str]]:
        """``(text, kind)`` of the root, then of each edge: the form the JSON report and its graphs read."""
        return [(self.root.label, self.root.type_name), *((edge.text(), edge.type_name) for edge in self.edges)]

    def type_names(self) -> list[str]:
        """The class of each object on the path, the root's kind first."""
        return [self.root.type_name, *(edge.type_name for edge in self.edges)]

    def render(self) -> str:
        """One line, its middle left out where it is long: ``test_it.HEAD.next.next ... 4,976 steps ... .next.payload``."""
        text = "".join(elided([text for text, _ in self.parts()]))
        if self.cycle is not None:
            loop = self.root.label + "".join(elided([edge.text() for edge in self.cycle]))
            text += f", on the reference cycle {loop} (back to the same {self.root.label})"
        if self.earlier_run:
            text += f" (an alike tensor run {self.earlier_run} left)"
        return text

    def __str__(self) -> str:
        return self.render()

    @property
    def opaque(self) -> bool:
        """Whether it names no holder in Python (held from C++, outside gc, or not named)."""
        return self.root.kind in OPAQUE_ROOTS

    def has(self, *kinds: EdgeKind) -> bool:
        """Whether any edge is of one of ``kinds``."""
        return any(edge.kind in kinds for edge in self.edges)

    def through_local(self) -> bool:
        """Whether a running frame's local is on the path."""
        return self.root.kind in LOCAL_ROOTS or self.has("local")

    def pairs(self) -> list[tuple[Edge, Edge | None]]:
        """Each edge with the one after it (None after the last)."""
        return list(zip(self.edges, (*self.edges[1:], None), strict=False))

    def hook_entries(self) -> list[Edge]:
        """The hook dicts whose entry the path passes through (``._forward_hooks[3]``)."""
        return [
            edge
            for edge, after in self.pairs()
            if edge.kind in ("hook dict", "tensor hooks") and after is not None and after.kind == "item"
        ]


def elided(texts: list[str]) -> list[str]:
    """``texts`` with their middle left out where there are more than :data:`MAX_STEPS_SHOWN`."""
    if len(texts) <= MAX_STEPS_SHOWN:
        return texts
    keep = MAX_STEPS_SHOWN // 2
    return [*texts[:keep], f" ... {len(texts) - 2 * keep:,} steps ... ", *texts[-keep:]]


HELD_IN_CPP_PATH = HolderPath(Root("held from C++", HELD_FROM_CPP))
AUTOCAST_CACHE_PATH = HolderPath(
    Root(
        "autocast cache",
        "<no Python reference: held from C++ while an autocast region the test entered is still open "
        "(its cast cache keeps each weight's cast, and through it the weight)>",
    )
)
CHANGED_PATH = HolderPath(Root("changed", CHANGED))


def thread_autocast_path(thread: str, thread_id: int, function: str) -> HolderPath:
    """The holder of what another thread's open autocast region caches (its cache is its own)."""
    return HolderPath(
        Root(
            "autocast cache",
            f"<no Python reference: held from C++ by the autocast cast cache of thread '{thread}', whose "
            f"autocast region around {function} is still open (the cache keeps each weight's cast, and through "
            "it the weight, until that thread's outermost region exits)>",
            thread=thread,
            thread_id=thread_id,
        )
    )


def own_graph_path(hooks: Sequence[str], checkpointed: bool) -> HolderPath:
    """The holder of a tensor its own autograd graph keeps: a saved_tensors_hooks pack hook (of those
    named in ``hooks``) kept it with its grad_fn."""
    named = f" (unpack hook {', '.join(hooks)})" if hooks else ""
    where = " inside a torch.utils.checkpoint region" if checkpointed else ""
    return HolderPath(
        Root(
            "own graph",
            "<no Python reference: held by its own autograd graph: the pack hook of a "
            f"torch.autograd.graph.saved_tensors_hooks pair{named}{where} kept it with its grad_fn, a reference "
            "cycle through C++ that gc cannot collect>",
        )
    )


def own_view_path(functions: Sequence[str]) -> HolderPath:
    """The holder of a tensor its own autograd graph keeps: a node of one of ``functions`` saved a
    view of it for backward."""
    return HolderPath(
        Root(
            "own graph",
            f"<no Python reference: held by its own autograd graph: autograd.Function {', '.join(functions)} saved "
            "a view of it for backward, a reference cycle through C++ that gc cannot collect>",
        )
    )

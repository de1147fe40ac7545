"""Which tensors a backward pass can give a gradient, noted as it starts, at the cost of its graph.

Backward writes ``.grad`` only into the leaves its graph reaches (each behind an
``AccumulateGrad`` node) and into the tensors passed as its ``inputs``. Every backward run from
Python (``Tensor.backward``, ``torch.autograd.backward``, and ``torch.autograd.grad``, which
accumulates nothing) goes through ``torch.autograd.graph._engine_run_backward``, on whatever
thread it runs; torch itself replaces that function, in both modules that hold it, to trace
backward (``torch.compiler._patch_engine_backward``). :class:`BackwardWatch` does the same while a
check runs: before the engine starts, it walks the graph from the roots and hands the tensors it
may write to a callback, then runs the engine as it would have run. It keeps no reference to them
and calls no user code: it reads ``next_functions`` and ``variable`` of C++ nodes. While
tracemalloc traces (the run that records where tensors are made), it reads ``.grad`` of those
tensors once the engine returns, so that each new gradient's Python object, and with it the site
tracemalloc records, is made on the line that called backward.

What it cannot see: a backward started without that function (the C++ engine called directly,
TorchScript). :attr:`BackwardWatch.watching` says whether the wrapper is still the one torch calls.
"""

from __future__ import annotations

import sys
import tracemalloc
from collections.abc import Callable
from typing import Any

from .census import graph_nodes
from .graph_sites import own_anomaly_paused

_MODULES = ("torch.autograd.graph", "torch.autograd")
_NAME = "_engine_run_backward"


def graph_leaves(roots: Any, inputs: Any) -> list[Any]:
    """The tensors a backward from ``roots`` (tensors or gradient edges) can write ``.grad`` into:
    the leaves behind the ``AccumulateGrad`` nodes its graph reaches, a root that is itself a leaf,
    and the tensors among ``inputs``."""
    torch: Any = sys.modules["torch"]
    accumulate = torch._C._functions.AccumulateGrad
    tensor_type = torch._C.TensorBase
    found: list[Any] = []
    stack: list[Any] = []
    for root in roots if type(roots) in (tuple, list) else (roots,):
        if issubclass(type(root), tensor_type):
            node = tensor_type.grad_fn.__get__(root)
            if node is None:
                found.append(root)  # backward on a leaf accumulates into the leaf
            else:
                stack.append(node)
        elif type(root) is _gradient_edge():
            stack.append(root.node)
    walked: list[Any] = []
    found += [node.variable for node in graph_nodes(stack, set(), walked) if type(node) is accumulate]
    walked.clear()
    for tensor in inputs if type(inputs) in (tuple, list) else ():
        if issubclass(type(tensor), tensor_type):
            found.append(tensor)
        elif type(tensor) is _gradient_edge() and type(tensor.node) is accumulate:
            found.append(tensor.node.variable)
    return found


def _give_gradients_objects(leaves: list[Any]) -> None:
    """Make the Python object of each leaf's gradient now, in the frame of the code that called
    backward: while tracemalloc traces (a recording run), that is where a gradient is made. Left to
    itself, torch makes the object where Python first reads ``.grad`` (inside ``optimizer.step()``,
    say), which is not where the gradient was allocated."""
    tensor_type = sys.modules["torch"]._C.TensorBase
    read_grad, is_leaf = tensor_type.grad.__get__, tensor_type.is_leaf.__get__
    for leaf in leaves:
        try:
            if is_leaf(leaf):  # (reading .grad of a tensor given as inputs= that is no leaf warns)
                read_grad(leaf)
        except Exception:  # a leaf that will not say: its gradient keeps the site Python gives it
            pass


def _gradient_edge() -> Any:
    graph = sys.modules.get(_MODULES[0])
    return getattr(graph, "GradientEdge", None)


class BackwardWatch:
    """Wraps torch's backward entry point while started; see the module docstring."""

    def __init__(self, noted: Callable[[list[Any]], None]) -> None:
        self._noted = noted
        self._original: Any = None
        self._wrapper: Any = None
        self.failed = False
        """Set when a walk raised: the tensors of that backward are not known."""

    def start(self) -> bool:
        """Put the wrapper in place; False where torch has no such entry point (nothing is watched)."""
        graph = sys.modules.get(_MODULES[0])
        original = getattr(graph, _NAME, None)
        if original is None or not callable(original):
            return False
        self.failed = False
        noted = self._noted
        torch_function_off = sys.modules["torch"]._C.DisableTorchFunction  # tensor subclasses run no code of theirs

        def run_backward(t_outputs: Any, *args: Any, **kwargs: Any) -> Any:
            # (the arguments as torch's backward and grad pass them: tensors, grad_tensors,
            # keep_graph, create_graph, inputs, allow_unreachable, accumulate_grad)
            if self._wrapper is run_backward and (
                kwargs["create_graph"] if "create_graph" in kwargs else args[2:3] == (True,)
            ):
                with own_anomaly_paused():
                    return watched(t_outputs, *args, **kwargs)
            return watched(t_outputs, *args, **kwargs)

        def watched(t_outputs: Any, *args: Any, **kwargs: Any) -> Any:
            # torch.autograd.grad passes accumulate_grad=False: it writes no .grad. A wrapper left
            # in place after stop() (someone restored it over torch's own) only passes through.
            if self._wrapper is not run_backward or not kwargs.get("accumulate_grad", True):
                return original(t_outputs, *args, **kwargs)
            inputs = kwargs["inputs"] if "inputs" in kwargs else (args[3] if len(args) > 3 else ())
            leaves: list[Any] = []
            try:
                with torch_function_off():
                    leaves = graph_leaves(t_outputs, inputs)
                    noted(leaves)
            except Exception:
                self.failed = True
            if not tracemalloc.is_tracing():
                leaves = []  # (held through the engine's run only where their gradients are named)
            try:
                return original(t_outputs, *args, **kwargs)
            finally:
                if leaves and tracemalloc.is_tracing():
                    with torch_function_off():
                        _give_gradients_objects(leaves)

        run_backward.__wrapped__ = original  # type: ignore[attr-defined]
        self._original, self._wrapper = original, run_backward
        for name in _MODULES:
            module = sys.modules.get(name)
            if module is not None and getattr(module, _NAME, None) is original:
                setattr(module, _NAME, run_backward)
        return True

    @property
    def watching(self) -> bool:
        """Whether torch still calls the wrapper (someone may have replaced it since)."""
        wrapper = self._wrapper
        return wrapper is not None and all(
            getattr(sys.modules.get(name), _NAME, None) is wrapper for name in _MODULES if name in sys.modules
        )

    def stop(self) -> None:
        """Put torch's function back where the wrapper still stands (never over someone else's)."""
        wrapper, original = self._wrapper, self._original
        self._wrapper = self._original = None
        if wrapper is None:
            return
        for name in _MODULES:
            module = sys.modules.get(name)
            if module is not None and getattr(module, _NAME, None) is wrapper:
                setattr(module, _NAME, original)

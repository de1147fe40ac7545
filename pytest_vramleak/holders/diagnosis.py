"""Recognise the common PyTorch leak patterns in a leaked group, and say the cause and the fix."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ..judging.sizes import format_size

_HOOK_DICTS = re.compile(
    r"\._(forward|forward_pre|backward|backward_pre|full_backward|full_backward_pre|state_dict)_hooks\["
)
_TORCH_CACHES = ("torch._dynamo", "torch._inductor", "torch.fx", "torch._functorch")
# torch.compile installs each compiled graph in the module of the code it compiled, as a global
# named __compiled_fn_<n>_<id> (__resume_at_<n> for code after a graph break): a user's module
# then holds the graph's constants, but the cache is PyTorch's.
_COMPILED_GLOBALS = re.compile(r"\.__(compiled_fn|resume_at)_\d")
PYTEST_WARNINGS = "the warnings pytest recorded"
_MOCK_TYPES = frozenset({"Mock", "MagicMock", "NonCallableMock", "NonCallableMagicMock", "AsyncMock", "_CallList"})
_PYTEST_INSTANCE = re.compile(r"self \(the \w+ instance pytest keeps until the session ends\)(?:\.(\w+))?")


def diagnose(group: Any) -> list[str]:
    """One or two lines per pattern the group matches, cause first, then the fix."""
    chains: Sequence[str] = group.held_by
    found: list[str] = []
    if group.kind == "history" and getattr(group, "grad_graph", False):
        return [
            f"autograd history kept in a gradient: backward(create_graph=True) gave it a graph of {group.nodes:,} nodes "
            "the test made, and each backward adds its graph to the gradient's (a reference cycle with the parameter, "
            "PyTorch's documentation warns of it): take the gradients with torch.autograd.grad(loss, params, "
            "create_graph=True) instead, or set each parameter's .grad to None after use"
        ]
    if group.kind == "history":
        return [
            f"autograd history kept: the tensor's grad_fn links {group.nodes:,} nodes the test made, each step's "
            "graph behind the one before (total += loss after loss.backward() keeps every step's nodes even once "
            "backward freed what they saved): accumulate loss.item() or loss.detach() instead, or detach the "
            "tensor (x = x.detach()) where each step starts"
        ]
    if getattr(group, "grad_graph", False):
        found.append(
            "backward(create_graph=True) gave these gradients autograd graphs of their own, and a gradient's graph "
            "refers back to its parameter: a reference cycle (PyTorch's documentation warns of it) that keeps the "
            "gradients and every graph behind them alive: take the gradients with torch.autograd.grad(loss, params, "
            "create_graph=True) instead, or set each parameter's .grad to None after use"
        )
    elif group.graph_bytes and group.kind == "graph" and chains and all(" local '" in chain for chain in chains):
        found.append(
            f"autograd graph kept alive: {format_size(group.graph_bytes)} in {group.graph_tensors} saved tensors "
            "behind a tensor a running loop carries from step to step with its grad_fn (a hidden state, a running "
            "total), so each step's graph holds every earlier one: detach it each step (hidden = hidden.detach()), "
            "or keep loss.item() instead"
        )
    elif group.graph_bytes:
        found.append(
            f"autograd graph kept alive: {format_size(group.graph_bytes)} in {group.graph_tensors} saved tensors "
            "behind a tensor that still has its grad_fn (a loss or output stored with its graph); "
            "store loss.item() or tensor.detach() instead, or run the step under torch.no_grad()"
        )
    # A node reached from a holder the test's code has (not one held from C++ or outside gc, whose
    # chain starts with "<"): what the code kept is the node.
    if any(" -> autograd graph of " in chain and not chain.startswith("<") for chain in chains) and not getattr(
        group, "grad_graph", False
    ):
        found.append(
            "an autograd node (a grad_fn) was kept, not a tensor: it keeps what its graph saved for backward and "
            "the leaves it accumulates into; keep loss.item() or a detached tensor instead of loss.grad_fn"
        )
    if any(kind == "ndarray" for path in getattr(group, "held_by_paths", []) for _, kind in path):
        found.append(
            "a numpy array made by tensor.numpy() shares the tensor's memory and keeps it alive: keep array.copy() "
            "instead, or drop the array"
        )
    hook = getattr(group, "hook", "")
    if any(_HOOK_DICTS.search(chain) for chain in chains) or hook:
        found.append(
            (
                (
                    "a tensor's hook (register_hook) keeps what it is given"
                    if _tensor_hook(group)
                    else "a module hook keeps what it is given"
                )
                + (f" ({hook} appends to what holds these tensors)" if hook else "")
            )
            + ": keep the handle register_*_hook() returns and call handle.remove() when done, or clear what the "
            "hook appends to"
        )
    if any(" -> lru_cache" in chain for chain in chains):
        found.append(
            "functools.lru_cache / functools.cache keeps every result it returned: give it a maxsize, "
            "call .cache_clear(), or do not cache tensors"
        )
    if any(".__traceback__" in chain or ".tb_frame" in chain or chain.startswith("sys.last_") for chain in chains):
        if any(chain.startswith("sys.last_") for chain in chains):
            found.append(
                "sys.last_traceback / sys.last_value keep the last reported error's frames and their local tensors "
                "(pytest sets them for a failed test, interactive consoles for an error they print): delete them "
                "when done, or call traceback.clear_frames(sys.last_traceback)"
            )
        else:
            found.append(
                "a stored exception keeps its traceback, whose frames keep their local tensors: "
                "store str(error) instead, or call traceback.clear_frames(error.__traceback__)"
            )
    elif any(" -> closure var " in chain for chain in chains) and not any(_HOOK_DICTS.search(c) for c in chains):
        found.append(
            "a closure (a callback, a logger) captured it and lives on: drop the callback when done, or "
            "capture a detached copy or a Python number instead"
        )
    if any(chain.startswith("fixture '") for chain in chains):
        fixture = next(chain for chain in chains if chain.startswith("fixture '")).split(")")[0] + ")"
        if (
            any(".grad" in chain or chain.endswith(".grad") for chain in chains if chain.startswith("fixture '"))
            or group.kind == "grad"
        ):
            found.append(
                f"backward() through the model {fixture} keeps for many tests made its gradients, which stay with the "
                "model: call model.zero_grad(set_to_none=True) at the end of the test or in the fixture's teardown, "
                "or give each test its own model (a function-scoped fixture)"
            )
        else:
            found.append(
                f"state kept on a value that {fixture} shares between tests (a cached result, lazily made state): "
                "clear it at the end of the test or in the fixture's teardown, or make the fixture function-scoped"
            )
    if any(_PYTEST_INSTANCE.match(chain) for chain in chains):
        attribute = next(
            (
                match.group(1)
                for chain in chains
                for match in [_PYTEST_INSTANCE.match(chain)]
                if match and match.group(1)
            ),
            "",
        )
        found.append(
            "pytest keeps each test's class instance until the session ends, and with it what the test set on self"
            + (f" (self.{attribute})" if attribute else "")
            + ": set it to None in teardown_method, or keep tensors in locals or fixtures"
        )
    if any(chain.startswith("record_property values of ") for chain in chains):
        found.append(
            "pytest keeps every record_property value until the session ends (for the JUnit XML report): record a "
            "number or a string (t.item(), str(t.shape)), not a tensor"
        )
    if any(chain.startswith(PYTEST_WARNINGS) for chain in chains):
        found.append(
            "pytest keeps every warning it recorded, with its arguments, until the session ends: warn with a string "
            "(f'{t.shape}'), not a tensor"
        )
    paths: Sequence[Sequence[tuple[str, str]]] = getattr(group, "held_by_paths", [])
    parametrized = [path for path in paths if path and path[0][1] == "parametrize"]
    if any(len(path) > 1 and path[1][0].startswith("[") for path in parametrized):
        found.append(
            "the test (or code it called) added entries to a list or dict that pytest keeps as a parametrize value for "
            "the whole session (a trainer appending its own callbacks to the callbacks list it was given): pass a copy "
            "(list(callbacks)), or build the list inside the test"
        )
    elif parametrized or any(chain.startswith("parametrize value ") for chain in chains):
        computed = any(len(path) > 1 and path[1][0] == "._computed" for path in parametrized)
        found.append(
            "an object pytest keeps as a parametrize value for the whole session kept what the test computed on it ("
            + ("a metric's cached compute() result" if computed else "a cached result, lazily made state")
            + "): build the object inside the test or in a function-scoped fixture, or reset it"
            + (" (metric.reset())" if computed else "")
            + " at the end of the test"
        )
    if any(kind in _MOCK_TYPES for path in paths for _, kind in path):
        found.append(
            "a unittest.mock mock keeps the arguments of every call made to it (call_args, call_args_list, mock_calls) "
            "for as long as it lives: call reset_mock() when done, patch it for the test alone, or pass it numbers or "
            "strings (t.item(), t.shape) instead of tensors"
        )
    if any(
        kind == "WeakKeyDictionary" and index + 1 < len(path) and path[index + 1][0] == ".data"
        for path in paths
        for index, (_, kind) in enumerate(path)
    ):
        found.append(
            "a WeakKeyDictionary keeps each value while its key is alive, and this key is alive: a value that refers to "
            "its own key (directly or through what it holds) keeps its entry for ever: keep weakref.ref(key) in the value "
            "instead, or delete the entry when done"
        )
    if (
        chains
        and all(chain.startswith("<no Python reference") for chain in chains)
        and getattr(group, "made_inside_library", None) is False
    ):
        found.append(
            "nothing in Python refers to these tensors the test made: PyTorch (or an extension) keeps them in C++ for "
            "something the test asked of it (torch.jit.script and torch.jit.trace keep a module's tensors with each "
            "compiled module, a hook registered in C++ keeps what it captured): script or trace once (in a module- or "
            "session-scoped fixture), or release what keeps them"
        )
    if group.count > 1 and chains and all(_module_container_entry(chain) for chain in chains) and not found:
        found.append(
            f"a module-level container gained {group.count} entries and never let them go (a cache "
            "without eviction, a history list): bound it, evict old entries, or clear it after use"
        )
    if held_by_torch_cache(group):
        found = [
            "held by a cache PyTorch keeps itself (a torch.compile graph and its constants): not the "
            "test's leak, and not counted as one"
        ]
    return found


def _tensor_hook(group: Any) -> bool:
    """Whether the hooks dict on the path is a tensor's (``tensor.register_hook``), not a module's."""
    for path in getattr(group, "held_by_paths", []):
        for (_, kind), (text, _) in zip(path, path[1:], strict=False):
            if text == "._backward_hooks" and kind in ("Tensor", "Parameter"):
                return True
    return False


def held_by_torch_cache(group: Any) -> bool:
    """Whether every chain that holds the group starts in a cache of PyTorch's own (compiled
    graphs, their constants): memory no test is charged for."""
    chains: Sequence[str] = group.held_by
    return bool(chains) and all(chain.startswith(_TORCH_CACHES) or _COMPILED_GLOBALS.search(chain) for chain in chains)


def _module_container_entry(chain: str) -> bool:
    """``pkg.module.NAME[...]`` or ``pkg.module.obj.attr[...]``: an entry of a container reached from a module."""
    return bool(re.fullmatch(r"[A-Za-z_][\w.]*(\[[^\]]*\])", chain))

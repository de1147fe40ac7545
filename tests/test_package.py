"""The package's shape: its modules import one another without a cycle."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest_vramleak

PACKAGE = Path(pytest_vramleak.__file__).parent


def _imports() -> dict[str, set[str]]:
    """Each module's imports of the package's own modules, at any depth of its code."""
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.glob("*.py")):
        name = path.stem
        graph[name] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                if node.module:
                    graph[name].add(node.module.split(".")[0])
                else:
                    graph[name].update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pytest_vramleak."):
                graph[name].add(node.module.split(".")[1])
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        stack.append(module)
        for imported in sorted(graph.get(module, ())):
            if state.get(imported) == 1:
                return stack[stack.index(imported) :] + [imported]
            if imported not in state:
                found = visit(imported)
                if found:
                    return found
        stack.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state:
            found = visit(module)
            if found:
                return found
    return None


def test_the_modules_import_one_another_without_a_cycle() -> None:
    graph = _imports()
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])
    assert {"check", "ranks", "plugin"} <= set(graph) and "check" in graph["ranks"]


def test_a_cycle_is_found_where_there_is_one() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_the_readme_fits_a_first_screen_and_its_links_resolve() -> None:
    root = PACKAGE.parent
    readme = (root / "README.md").read_text()
    assert len(readme.splitlines()) < 150
    for page in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        text = page.read_text()
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):
            assert (page.parent / target).exists(), f"{page.name} links to {target}, which is not there"
        for target, anchor in re.findall(r"\]\(([^)#:]*)#([^)]+)\)", text):
            linked = (page.parent / target) if target else page
            headings = {_anchor(line) for line in linked.read_text().splitlines() if line.startswith("#")}
            assert anchor in headings, f"{page.name} links to {target}#{anchor}, which is no heading there"


def _anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = heading.lstrip("#").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


PYTEST_GROUP = {
    "plugin",
    "runs",
    "state",
    "marker",
    "fixture",
    "leftovers",
    "summary",
    "outputs",
    "protocol",
    "release",
    "options",
}


def test_the_engine_imports_nothing_of_the_pytest_layer() -> None:
    # A training script uses the engine (LeakCheck, StepWatcher, take_snapshot) without pytest's hooks.
    wrong = {
        name: sorted(imported & PYTEST_GROUP)
        for name, imported in _imports().items()
        if name not in PYTEST_GROUP and not name.startswith("__") and imported & PYTEST_GROUP
    }
    assert wrong == {}


def test_plugin_py_only_wires_hooks_in_under_500_lines() -> None:
    # Verdicts and text live in the modules it calls; what is left is pytest's hooks.
    source = (PACKAGE / "plugin.py").read_text()
    assert len(source.splitlines()) < 500
    functions = [
        node.name
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("pytest_")
    ]
    assert not [name for name in functions if re.search(r"word|format|render|text|message|verdict|judge", name)], (
        functions
    )


def test_no_class_is_over_300_lines() -> None:
    # Each class is one responsibility a reader can hold at once (the tracker is four parts).
    sizes = {
        f"{path.stem}.{node.name}": (node.end_lineno or node.lineno) - node.lineno + 1
        for path in sorted(PACKAGE.glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
    }
    assert sizes["tracker.Tracker"] > 100  # the measure counts a class's whole body
    assert {name: lines for name, lines in sizes.items() if lines > 300} == {}

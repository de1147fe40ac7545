"""The package's shape: folders that are its layers, each importing only the layers below it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import pytest_vramleak

PACKAGE = Path(pytest_vramleak.__file__).parent

LAYERS = ["judging", "reporting", "tracking", "meters", "holders", "", "plugin"]
"""From the bottom up: a module imports modules of its own layer and of the layers below it.
``""`` is the top level, the public engine (LeakCheck, StepWatcher, watch_rank); ``plugin`` is the
pytest layer, which nothing imports."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(importer: str, is_package: bool, node: ast.ImportFrom) -> list[str]:
    """The package's own modules an ``from ... import`` names, by their dotted names in the package."""
    if node.level == 0:
        if not (node.module or "").startswith("pytest_vramleak"):
            return []
        base = (node.module or "").split(".")[1:]
    else:
        here = importer.split(".") if importer else []
        if not is_package:
            here = here[:-1]
        base = here[: len(here) - (node.level - 1)] + (node.module.split(".") if node.module else [])
    if node.module is None or node.level == 0 and node.module == "pytest_vramleak":
        return [".".join([*base, alias.name]) for alias in node.names]
    return [".".join(base)]


def _typing_only(tree: ast.AST) -> set[int]:
    """The ids of the imports under ``if TYPE_CHECKING:``, which only a type checker runs."""
    return {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
        for statement in node.body
        for inner in ast.walk(statement)
    }


def _imports(*, typing: bool = True) -> dict[str, set[str]]:
    """Each module's imports of the package's own modules, at any depth of its code (without
    ``typing``: those Python runs, not the ones for type checkers alone)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = _module_name(path)
        graph[name] = set()
        tree = ast.parse(path.read_text())
        skipped = set() if typing else _typing_only(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and id(node) not in skipped:
                graph[name].update(_resolve(name, path.name == "__init__.py", node))
    known = set(graph)
    return {
        name: {imported for imported in found if imported in known and imported != name}
        for name, found in graph.items()
    }


def _layer(module: str) -> str:
    head = module.split(".")[0]
    return head if "." in module or head in LAYERS else ""


def _upward(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """Each module's imports of a layer above its own. The package's ``__init__`` re-exports the
    public names, ``vram_budget`` of the pytest layer among them (imported when asked for)."""
    rank = {layer: index for index, layer in enumerate(LAYERS)}
    wrong = {
        module: sorted(imported for imported in found if rank[_layer(imported)] > rank[_layer(module)])
        for module, found in graph.items()
        if module
    }
    return {module: found for module, found in wrong.items() if found}


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
    # (a checked test's state names the type of its runs for type checkers alone: no cycle Python runs)
    graph = _imports(typing=False)
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])
    assert "plugin.runs" in _imports()["plugin.state"] and "plugin.runs" not in graph["plugin.state"]
    assert {"check", "ranks", "plugin", "tracking.tracker"} <= set(graph) and "check" in graph["ranks"]


def test_a_cycle_is_found_where_there_is_one() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_every_module_sits_in_a_layer_and_imports_none_above_it() -> None:
    graph = _imports()
    folders = {path.name for path in PACKAGE.iterdir() if path.is_dir() and (path / "__init__.py").exists()}
    assert folders == set(LAYERS) - {""}
    assert _upward(graph) == {}


def test_an_import_upward_is_found() -> None:
    graph = {"judging.verdict": {"tracking.census"}, "tracking.census": {"judging.sizes"}, "check": {"plugin.state"}}
    assert _upward(graph) == {"judging.verdict": ["tracking.census"], "check": ["plugin.state"]}


def test_imports_are_read_relative_and_absolute() -> None:
    graph = _imports()
    assert "judging.sizes" in graph["judging.verdict"]  # from .sizes import
    assert "tracking.census" in graph["holders.referrers"]  # from ..tracking.census import
    assert "plugin.marker" in graph[""]  # the package's lazy re-export of vram_budget
    assert "reporting.merge" in graph["__main__"]


def test_every_public_name_is_listed_once_and_imported_on_first_use() -> None:
    assert pytest_vramleak.__all__ == sorted(pytest_vramleak._WHERE)
    for name in pytest_vramleak.__all__:
        assert getattr(pytest_vramleak, name).__name__ == name


def test_only_the_pytest_layer_imports_pytest() -> None:
    # A training script uses the engine (LeakCheck, StepWatcher, take_snapshot) without pytest.
    importing = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            if any(name.split(".")[0] in ("pytest", "_pytest") for name in names):
                importing.add(_module_name(path))
    assert importing and all(_layer(module) == "plugin" for module in importing), sorted(importing)


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


def test_the_plugin_module_only_wires_hooks() -> None:
    # Verdicts and text live in the modules it calls; what is left is pytest's hooks.
    source = (PACKAGE / "plugin" / "__init__.py").read_text()
    functions = [
        node.name
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("pytest_")
    ]
    assert not [name for name in functions if re.search(r"word|format|render|text|message|verdict|judge", name)], (
        functions
    )


CHAIN_TEXT = frozenset({"held_by", "chain", "chains", "held_by_paths", "render", "chain_text", "name_holders"})
"""Names that stand for holder paths rendered as text: the strings reports write out."""
RENDERED = frozenset({"HELD_FROM_CPP", "CHANGED"})
"""Rendered holder texts, which a decision must not compare with."""


def _names(node: ast.AST) -> set[str]:
    """Every name and attribute a piece of code reads."""
    found = set()
    for inner in ast.walk(node):
        if isinstance(inner, ast.Name):
            found.add(inner.id)
        elif isinstance(inner, ast.Attribute):
            found.add(inner.attr)
    return found


def _decisions_on_chain_text(source: str) -> list[int]:
    """The lines that test rendered holder text: a prefix, suffix, pattern or substring of a chain,
    or an equality with a rendered holder."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        read: set[str] = set()
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in ("startswith", "endswith", "search", "match", "fullmatch", "find", "split"):
                read = _names(node.func.value) | {n for arg in node.args for n in _names(arg)}
        elif isinstance(node, ast.Compare):
            operators = {type(op) for op in node.ops}
            read = _names(node)
            if operators & {ast.In, ast.NotIn}:
                read = {n for n in read if n in CHAIN_TEXT}
            elif operators & {ast.Eq, ast.NotEq}:
                read = {n for n in read if n in RENDERED or n in CHAIN_TEXT}
            else:
                read = set()
        if read & (CHAIN_TEXT | RENDERED):
            lines.append(node.lineno)
    return lines


def test_no_decision_reads_the_text_of_a_rendered_holder_path() -> None:
    # Holder paths are data (holders.paths): diagnoses and what is set aside read their kinds and
    # names; the text is only written out. A decision on the text stops firing when a wording changes.
    found = {
        _module_name(path): lines
        for path in sorted(PACKAGE.rglob("*.py"))
        if (lines := _decisions_on_chain_text(path.read_text()))
    }
    assert found == {}


@pytest.mark.parametrize(
    "source",
    [
        "ok = all(chain.startswith('<') for chain in group.held_by)",
        "ok = any(' -> closure var ' in chain for chain in chains)",
        "ok = group.held_by[0].endswith('.grad')",
        "ok = bool(PATTERN.search(chain))",
        "ok = all(chain == HELD_FROM_CPP for chain in group.held_by)",
        "ok = path.render().startswith('fixture')",
        "ok = 'fixture' in chain_text(found)",
    ],
)
def test_a_decision_on_rendered_holder_text_is_found(source: str) -> None:
    assert _decisions_on_chain_text(source) == [1]


def test_decisions_on_holder_data_are_not_taken_for_text() -> None:
    source = "ok = path.root.kind == 'fixture' and any(edge.kind == 'item' for edge in path.edges)\n"
    source += "keep = [c for c in group.held_by if c]\n"
    assert _decisions_on_chain_text(source) == []

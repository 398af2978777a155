"""The layers' import rules, read from the source (beside the sans-IO checks in
``test_public_api.py``).

* No import circles among Kinetic's modules: at module level (what runs on import),
  nor counting the lazy imports in functions.
* Backends (``kinetic/_backends/``) never import the engine (``kinetic/_engine/``).
* ``kinetic/_images/`` never imports the engine, nor ``kinetic`` itself.
* ``runner/`` never imports ``kinetic``: it runs in images without it.

The last three count every import, lazy ones in functions included, but not those
under ``if TYPE_CHECKING:`` (nor a module named in a string: the runner's store
plug-ins are named by its launcher, :mod:`runner.store`). :data:`KNOWN` lists the
breaches still to be removed; it only shrinks (an entry that no longer happens fails
too, so that it is struck off), and issues 25 and 26 emptied it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("kinetic", "runner")

KNOWN: frozenset[tuple[str, str]] = frozenset()


def _modules() -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package)."""
    found: dict[str, tuple[Path, bool]] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            found[".".join(parts)] = (path, is_package)
    return found


MODULES = _modules()


def _is_type_checking(node: ast.AST) -> bool:
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(node: ast.AST, module_level: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    """The imports under ``node``: its statements only when ``module_level`` (what
    runs on import: class bodies and blocks of ``if``/``try``/``with`` included,
    function bodies not), else every one. Never those under ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(node):
        if _is_type_checking(child):
            yield from (i for b in child.orelse for i in _imports_of_statement(b, module_level))
            continue
        yield from _imports_of_statement(child, module_level)


def _imports_of_statement(
    node: ast.AST, module_level: bool
) -> Iterator[ast.Import | ast.ImportFrom]:
    if isinstance(node, ast.Import | ast.ImportFrom):
        yield node
    elif module_level and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
        return
    else:
        yield from _imports(node, module_level)


def _targets(module: str, is_package: bool, node: ast.Import | ast.ImportFrom) -> set[str]:
    """The Kinetic and runner modules that ``node`` (in ``module``) imports."""
    if isinstance(node, ast.Import):
        names = {alias.name for alias in node.names}
    else:
        base = node.module or ""
        if node.level:
            parts = module.split(".") if is_package else module.split(".")[:-1]
            parts = parts[: len(parts) - node.level + 1]
            base = ".".join([*parts, *([node.module] if node.module else [])])
        names = {
            f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
            for alias in node.names
        }
    out = set()
    for name in names:
        while name and name not in MODULES:  # `import kinetic._core.x.y` names a module's attribute
            name = name.rpartition(".")[0]
        if name and name != module:
            out.add(name)
    return out


def _graph(module_level: bool) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, (path, is_package) in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        graph[module] = {
            target
            for node in _imports(tree, module_level)
            for target in _targets(module, is_package, node)
        }
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _breaches() -> set[tuple[str, str]]:
    found = set()
    for module, targets in _graph(module_level=False).items():
        for target in targets:
            engine = target == "kinetic._engine" or target.startswith("kinetic._engine.")
            if module.startswith("kinetic._backends") and engine:
                found.add((module, target))
            if module.startswith("kinetic._images") and (engine or target == "kinetic"):
                found.add((module, target))
            if module.startswith("runner") and target.split(".")[0] == "kinetic":
                found.add((module, target))
    return found


def test_no_import_circles_at_module_level() -> None:
    assert _circles(_graph(module_level=True)) == []


def test_no_import_circles_through_lazy_imports_either() -> None:
    # A lazy import keeps a module's import cheap; it is no way around the layers.
    assert _circles(_graph(module_level=False)) == []


def test_layers_import_only_downwards() -> None:
    breaches = _breaches()
    assert not breaches - KNOWN, f"new imports against the layers: {sorted(breaches - KNOWN)}"
    assert not KNOWN - breaches, f"gone: strike off KNOWN: {sorted(KNOWN - breaches)}"


def test_the_checker_sees_a_circle_and_a_breach() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _circles(graph) == [["a", "b", "c"]]
    lazy = _graph(module_level=False)
    assert "kinetic._cli.doctor_checks" in lazy["kinetic._cli.doctor"]  # imported in run()
    assert "kinetic._cli.doctor_checks" not in _graph(module_level=True)["kinetic._cli.doctor"]

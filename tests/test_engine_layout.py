"""The engine's layers import one way: serving -> core -> kernels, with no import cycle among its modules
(imports inside functions count; those under `if TYPE_CHECKING:` do not, as they never run)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("reference_engine",)


def _modules(packages: tuple[str, ...]) -> dict[str, Path]:
    mods = {}
    for package in packages:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            mods[".".join(parts)] = path
    return mods


def _runtime_nodes(tree: ast.AST):
    """Every node of `tree` except the bodies of `if TYPE_CHECKING:` blocks."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                stack.extend(child.orelse)
            else:
                stack.append(child)


def _absolute(mod: str, path: Path, node: ast.ImportFrom) -> str:
    """The module a `from ... import` names, with relative imports resolved against `mod`."""
    if not node.level:
        return node.module or ""
    base = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph(packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    """module -> the packages' modules it imports, at the top or inside functions."""
    mods = _modules(packages)

    def owner(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        for node in _runtime_nodes(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                module = _absolute(mod, path, node)
                names = [f"{module}.{a.name}" if f"{module}.{a.name}" in mods else module for a in node.names]
            else:
                continue
            for name in names:
                target = owner(name) if name.split(".")[0] in packages else None
                if target and target != mod:
                    graph[mod].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            component.append(v)
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def layer(module: str) -> str:
    if module == "reference_engine.server":  # `python -m reference_engine.server`: the front end's entry
        return "serving"
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or parts[-1] in ("kernels", "serving") else "core"


def test_no_relative_imports():
    relative = [
        f"{mod}: line {node.lineno}"
        for mod, path in _modules(PACKAGES).items()
        for node in _runtime_nodes(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and node.level
    ]
    assert relative == []


def test_no_import_cycle():
    assert cycles(import_graph()) == []


def test_layers_import_downwards():
    allowed = {"serving": {"serving", "core", "kernels"}, "core": {"core", "kernels"}, "kernels": {"kernels"}}
    wrong = [
        f"{m} -> {t}"
        for m, targets in import_graph().items()
        for t in targets
        if layer(t) not in allowed[layer(m)]
    ]
    assert wrong == []


if __name__ == "__main__":  # prints the graph: python tests/test_engine_layout.py
    graph = import_graph()
    edges = sum(map(len, graph.values()))
    print(f"{len(graph)} modules, {edges} import edges; cycles: {cycles(graph) or 'none'}")
    for m in sorted(graph):
        print(f"  [{layer(m)}] {m} -> {', '.join(sorted(graph[m])) or '-'}")

"""The comparator's packages import one way, compare -> workloads -> adapters, with no import cycle among
their modules, and the engine imports none of them; inside `compare/`, no module imports from a later stage
of the run (`STAGES`). Imports inside functions count; those under `if TYPE_CHECKING:` do not, as they never
run. The test instruments (`instruments/`) may use workloads and adapters, and no production package imports
them. Functions stay short enough to read: at most 100 lines and 8 parameters; `compare/cli.py` only parses,
prints and calls the runner."""

from __future__ import annotations

import ast
from pathlib import Path

from test_engine_layout import _runtime_nodes, cycles
from test_engine_layout import import_graph as package_import_graph

ROOT = Path(__file__).resolve().parent.parent
CHECKED = ("compare", "workloads", "adapters", "instruments")  # the size and cycle rules apply to these
PRODUCTION = ("compare", "workloads", "adapters", "reference_engine")  # what a comparison runs
PACKAGES = (*CHECKED, "reference_engine")
MAX_FUNCTION_LINES = 100
MAX_PARAMETERS = 8
MAX_CLI_LINES = 400
#: `compare/`'s stages in the order a run goes through them, each a package; a module may import from its own
#: stage and the earlier ones, never from a later one. `common` (types, text, exit codes, devices, the
#: throughput window) lies beneath them all; the top-level modules (`TOP`: cli, runner, terminal) above.
STAGES = ("common", "plan", "launch", "measure", "analysis", "report")
TOP = "top"


def import_graph() -> dict[str, set[str]]:
    """module -> the five packages' modules it imports, at the top or inside functions."""
    return package_import_graph(PACKAGES)


def _package(module: str) -> str:
    return module.split(".")[0]


def _functions(packages=CHECKED):
    """(where, function node) for every function and method in `packages`."""
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield f"{path.relative_to(ROOT)}:{node.lineno} {node.name}", node


def function_lines(node: ast.AST) -> int:
    return node.end_lineno - node.lineno + 1


def parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Named parameters, *args and **kwargs, not counting a method's self or cls."""
    a = node.args
    names = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    names += [p.arg for p in (a.vararg, a.kwarg) if p is not None]
    return len([n for n in names if n not in ("self", "cls")])


def stage_of(module: str) -> str | None:
    """The stage of a `compare` module (`TOP` for the modules beside the stages' packages); None outside."""
    parts = module.split(".")
    if parts[0] != "compare":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in STAGES else TOP


def stage_violations(graph: dict[str, set[str]]) -> list[str]:
    """`module (stage) -> module (later stage)` for every import that points up the stage order."""
    order = {name: i for i, name in enumerate((*STAGES, TOP))}
    wrong = []
    for module, targets in graph.items():
        here = stage_of(module)
        for target in sorted(targets):
            there = stage_of(target)
            if here is not None and there is not None and order[there] > order[here]:
                wrong.append(f"{module} ({here}) -> {target} ({there})")
    return sorted(wrong)


def test_no_import_cycle():
    graph = import_graph()
    checked = {
        m: {t for t in targets if _package(t) in CHECKED}
        for m, targets in graph.items()
        if _package(m) in CHECKED
    }
    assert cycles(checked) == []


def test_packages_import_one_way():
    forbidden = {
        "workloads": {"compare"},
        "adapters": {"workloads", "compare"},
        "reference_engine": {"compare", "workloads", "adapters"},
        "instruments": {"compare", "reference_engine"},
    }
    wrong = [
        f"{m} -> {t}"
        for m, targets in import_graph().items()
        for t in sorted(targets)
        if _package(t) in forbidden.get(_package(m), ())
    ]
    assert wrong == []


def production_imports_of_instruments(graph: dict[str, set[str]]) -> list[str]:
    """'module -> instruments module' for every production module that imports a test instrument."""
    return [
        f"{m} -> {t}"
        for m, targets in graph.items()
        for t in sorted(targets)
        if _package(m) in PRODUCTION and _package(t) == "instruments"
    ]


def test_production_never_imports_instruments():
    graph = import_graph()
    assert production_imports_of_instruments(graph) == []
    # the rule sees the instruments' own imports: they use the load generator, so an edge into it must show
    assert "workloads.loadgen" in graph["instruments.scripted_server"]


def test_stages_import_in_order():
    assert stage_violations(import_graph()) == []


def test_every_package_of_compare_is_a_stage():
    """A new package must take its place in `STAGES`, or the order says nothing about it."""
    packages = {p.name for p in (ROOT / "compare").iterdir() if (p / "__init__.py").is_file()}
    assert packages == set(STAGES)


def test_the_stage_rule_sees_an_import_inside_a_function_and_ignores_one_for_type_checking():
    code = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from compare.report.blocks import Block\n"
        "def f():\n"
        "    from compare.analysis.metrics import summarize\n"
    )
    imported = {node.module for node in _runtime_nodes(code) if isinstance(node, ast.ImportFrom)}
    assert imported == {"typing", "compare.analysis.metrics"}
    graph = {"compare.measure.point": {"compare.analysis.metrics", "compare.plan.run_options"}}
    assert stage_violations(graph) == [
        "compare.measure.point (measure) -> compare.analysis.metrics (analysis)"
    ]


def test_functions_short():
    longer = [
        f"{where}: {function_lines(f)} lines"
        for where, f in _functions()
        if function_lines(f) > MAX_FUNCTION_LINES
    ]
    assert longer == []


def test_functions_few_parameters():
    many = [
        f"{where}: {parameters(f)} parameters" for where, f in _functions() if parameters(f) > MAX_PARAMETERS
    ]
    assert many == []


def test_cli_short():
    assert len((ROOT / "compare" / "cli.py").read_text().splitlines()) <= MAX_CLI_LINES


if __name__ == "__main__":  # prints the numbers and the graph: python tests/test_code_layout.py
    graph = import_graph()
    longest = max(_functions(), key=lambda wf: function_lines(wf[1]))
    widest = max(_functions(), key=lambda wf: parameters(wf[1]))
    cli_lines = len((ROOT / "compare" / "cli.py").read_text().splitlines())
    print(f"longest function: {longest[0]} ({function_lines(longest[1])} lines)")
    print(f"most parameters: {widest[0]} ({parameters(widest[1])})")
    print(f"compare/cli.py: {cli_lines} lines")
    edges = sum(map(len, graph.values()))
    print(f"{len(graph)} modules, {edges} import edges; cycles: {cycles(graph) or 'none'}")
    print(
        f"stages of compare/: {' < '.join((*STAGES, TOP))}; "
        f"imports up the order: {stage_violations(graph) or 'none'}"
    )
    for m in sorted(graph):
        if _package(m) in CHECKED:
            print(f"  {m} -> {', '.join(sorted(graph[m])) or '-'}")

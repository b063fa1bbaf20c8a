"""The shape of src/qualify: no import cycles, and no way to Prefect (or flows/tasks/driver) from it.

Every import counts, including those inside functions: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
FORBIDDEN = {"prefect", "flows", "tasks", "driver", "qualify_prefect"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in (SRC / "qualify").rglob("*.py")}


def imports_of(name: str, path: Path) -> set[str]:
    """Absolute names imported anywhere in the file; `from pkg import mod` resolves to pkg.mod."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name if path.name == "__init__.py" else name.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}" if base else package
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found.add(candidate if candidate in MODULES else base)
    return found


GRAPH = {name: imports_of(name, path) for name, path in MODULES.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
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
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_in_the_library() -> None:
    internal = {m: {i for i in deps if i in MODULES and i != m} for m, deps in GRAPH.items()}
    assert cycles(internal) == []


def test_cycle_finder_sees_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_reaches_prefect_flows_tasks_or_driver() -> None:
    """Directly or through another qualify module."""
    for start in MODULES:
        seen, todo = {start}, [start]
        while todo:
            module = todo.pop()
            for name in GRAPH[module]:
                top = name.split(".")[0]
                assert top not in FORBIDDEN, f"{start} reaches {name} (through {module})"
                if name in MODULES and name not in seen:
                    seen.add(name)
                    todo.append(name)


def test_relative_and_from_imports_are_resolved() -> None:
    assert "qualify.progress" in GRAPH["qualify.cli.run"]
    assert "qualify.errors" in GRAPH["qualify.store.engine"]


def test_only_the_execution_package_imports_ray() -> None:
    """Ray is the execution path's business: the gate, the store, the CLI and the reports run without it."""
    outside = {m: sorted(i for i in deps if i.split(".")[0] == "ray")
               for m, deps in GRAPH.items() if not m.startswith("qualify.execution")}
    assert {m: d for m, d in outside.items() if d} == {}


def test_the_gate_imports_nothing_from_execution() -> None:
    """The gate reads the result-document format (qualify.result_document), never a runner."""
    gate = {m: sorted(i for i in deps if i.startswith("qualify.execution"))
            for m, deps in GRAPH.items() if m.startswith("qualify.gate")}
    assert {m: d for m, d in gate.items() if d} == {}


def test_readme_configuration_table_lists_exactly_the_variables_qualify_reads() -> None:
    """Every QUALIFY_* variable the code names is in the README's table, and the table names no other."""
    import re

    readme = (SRC.parent / "README.md").read_text()
    table = readme[readme.index("## Configuration"):readme.index("## The CLI")]
    documented = set(re.findall(r"QUALIFY_[A-Z_]+", table))
    read = set()
    for path in MODULES.values():
        read |= set(re.findall(r"[\"'](QUALIFY_[A-Z_]+)[\"']", path.read_text()))
    from qualify.settings import CREDENTIAL_ENVIRONMENT, ENVIRONMENT

    assert set(ENVIRONMENT) | set(CREDENTIAL_ENVIRONMENT) <= read
    assert documented == read, (sorted(read - documented), sorted(documented - read))


def test_no_two_test_modules_share_a_name() -> None:
    """pytest imports test modules by basename (no packages under tests/): two test_x.py in unit/ and integration/
    stop the whole suite at collection ("import file mismatch"), which the two halves run alone never show."""
    tests = Path(__file__).resolve().parents[1]
    names = [p.name for p in tests.rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []

"""The flow hands its tasks the run's context quoted (flows/qualify_release.py): Prefect walks into an unquoted task
argument to find futures and states, while the case threads and the heartbeat change the context; the walk failed at
random in CI ("Failed to resolve inputs in parameter 'ctx'"). tests/integration/test_flow_task_arguments_prefect.py
shows Prefect's side of it."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FLOWS = sorted((REPO / "flows").glob("*.py"))


def _task_calls(tree: ast.AST) -> list[ast.Call]:
    """Calls of a task: `x_task(...)`, and `x_task.submit(...)` / `x_task.with_options(...).submit(...)`."""
    calls = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id.endswith("_task"):
            calls.append(node)
        elif isinstance(func, ast.Attribute) and func.attr == "submit":
            root = func.value
            while isinstance(root, (ast.Call, ast.Attribute)):
                root = root.func if isinstance(root, ast.Call) else root.value
            if isinstance(root, ast.Name) and root.id.endswith("_task"):
                calls.append(node)
    return calls


def _bare_context_arguments(source: str) -> list[int]:
    lines = []
    for call in _task_calls(ast.parse(source)):
        for arg in [*call.args, *(k.value for k in call.keywords)]:
            if isinstance(arg, ast.Name) and arg.id == "ctx":
                lines.append(call.lineno)
    return lines


def test_no_task_is_handed_the_run_context_unquoted() -> None:
    calls = 0
    for path in FLOWS:
        source = path.read_text()
        calls += len(_task_calls(ast.parse(source)))
        assert _bare_context_arguments(source) == [], f"{path.name}: ctx passed to a task unquoted"
    assert calls >= 8  # open-run, candidate, verify, progress, cases, gate, report, promote


def test_the_check_sees_an_unquoted_context() -> None:
    source = ("gate_task(ctx)\n"
              "run_case_task.with_options(task_run_name=c).submit(ctx, case)\n"
              "report_task(quote(ctx), ctx.progress.done)\n")
    assert _bare_context_arguments(source) == [1, 2]

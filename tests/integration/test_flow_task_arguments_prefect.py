"""Prefect's side of tests/unit/test_flow_task_arguments.py: a task's arguments are walked twice (the task inputs
recorded when the run is made, the futures resolved when it starts), unless quoted. An argument whose contents change
while they are walked (here: a mapping whose iteration raises as a dict changed by another thread does) fails the
task before it runs; quoted, it is handed to the task as it is, never walked."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

pytestmark = [pytest.mark.prefect]


class ChangingDict(dict):
    def items(self):  # noqa: ANN201 - what iterating a dict another thread changes raises
        raise RuntimeError("dictionary changed size during iteration")

    def __iter__(self):  # noqa: ANN204
        raise RuntimeError("dictionary changed size during iteration")


@dataclass
class Context:
    started: ChangingDict = field(default_factory=ChangingDict)


def _resolve(value):  # what the task engine does with each parameter before the task runs (task_engine.py)
    from prefect.utilities.collections import visit_collection
    from prefect.utilities.engine import resolve_to_final_result

    return visit_collection(value, visit_fn=resolve_to_final_result, return_data=True, max_depth=-1,
                            remove_annotations=True, context={"parameter_name": "ctx"})


def test_an_unquoted_context_that_changes_is_walked_and_fails() -> None:
    with pytest.raises(RuntimeError, match="changed size"):
        _resolve(Context())


def test_a_quoted_context_is_handed_over_unwalked() -> None:
    from prefect.utilities.annotations import quote
    from prefect.utilities.engine import collect_task_run_inputs_sync

    ctx = Context()
    assert _resolve(quote(ctx)) is ctx
    assert collect_task_run_inputs_sync(quote(ctx)) == set()

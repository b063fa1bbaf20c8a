"""Judge the run: the gate's decision is stored, never rewritten."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from qualify import pipeline
from qualify.gate.service import evaluate_and_commit


@task(name="gate", cache_policy=NO_CACHE)
def gate_task(ctx: pipeline.RunContext) -> dict:
    evaluation = evaluate_and_commit(ctx.sessions, ctx.run_id)
    return {"verdict": evaluation.verdict.verdict, "decision_id": evaluation.decision.id,
            "reasons": evaluation.verdict.reason_dicts(), "baseline_run_id": evaluation.baseline_run_id}

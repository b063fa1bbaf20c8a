"""Judge the run: the gate's decision is stored, never rewritten."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from qualify import pipeline
from qualify.gate.judging import Evaluation


@task(name="gate", cache_policy=NO_CACHE)
def gate_task(ctx: pipeline.RunContext) -> Evaluation:
    return pipeline.judge(ctx)

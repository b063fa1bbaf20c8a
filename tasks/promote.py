"""Promote a PASS run's candidate by digest to every target."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from qualify import pipeline
from qualify.promote import TargetOutcome


@task(name="promote", cache_policy=NO_CACHE)
def promote_task(ctx: pipeline.RunContext) -> list[TargetOutcome]:
    """One outcome per target; a refusal (e.g. the candidate tag moved) is reported, never hidden."""
    logger = get_run_logger()
    outcomes = pipeline.promote(ctx, log=logger.error)
    for o in outcomes:
        (logger.info if o.ok else logger.error)("promotion %s -> %s: %s %s", o.target, o.target_ref, o.outcome,
                                                 o.detail)
    return outcomes

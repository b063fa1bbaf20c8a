"""Promote a PASS run's candidate by digest to every target."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from qualify import pipeline


@task(name="promote", cache_policy=NO_CACHE)
def promote_task(ctx: pipeline.RunContext) -> list[dict]:
    """One outcome per target; a refusal (e.g. the candidate tag moved) is reported, never hidden."""
    from qualify.promote import PromotionError, PromotionRefused, promote_run

    logger = get_run_logger()
    try:
        outcomes = promote_run(ctx.sessions, ctx.run_id, insecure=list(ctx.release.promotion.insecure_registries),
                               actor="qualify-flow")
    except PromotionRefused as exc:
        logger.error("promotion refused: %s", exc)
        outcomes = exc.outcomes
    except PromotionError as exc:
        logger.error("promotion not possible: %s", exc)
        return [{"target": "*", "outcome": "refused", "detail": str(exc)}]
    for o in outcomes:
        (logger.info if o.ok else logger.error)("promotion %s -> %s: %s %s", o.target, o.target_ref, o.outcome,
                                                 o.detail)
    return [o.to_dict() for o in outcomes]

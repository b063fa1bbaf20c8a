"""Promote a PASS run's candidate by digest to every target."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from qualify import pipeline


@task(name="promote", cache_policy=NO_CACHE)
def promote_task(ctx: pipeline.RunContext) -> list[dict]:
    from qualify.promote import promote_run

    outcomes = promote_run(ctx.sessions, ctx.run_id, dry_run=False, target=None, force=False, reason=None,
                           insecure=list(ctx.release.promotion.insecure_registries), actor="qualify-flow")
    return [o.__dict__ if hasattr(o, "__dict__") else dict(o) for o in outcomes]

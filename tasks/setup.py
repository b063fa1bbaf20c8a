"""Open (or resume) the run, obtain the candidate, verify its components."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from qualify import pipeline
from qualify.build import BuildResult


@task(name="open-run", cache_policy=NO_CACHE)
def open_run_task(sessions, manifest: str, resume_run: int | None, ray_address: str | None,  # type: ignore[no-untyped-def]
                  triggered_by: str | None) -> pipeline.RunContext:
    return pipeline.open_run(sessions, manifest, resume_run_id=resume_run, ray_address=ray_address,
                             triggered_by=triggered_by)


@task(name="obtain-candidate", cache_policy=NO_CACHE)
def obtain_candidate_task(ctx: pipeline.RunContext, wait: bool) -> BuildResult:
    return pipeline.obtain_candidate(ctx, wait=wait)


@task(name="verify-components", cache_policy=NO_CACHE)
def verify_components_task(ctx: pipeline.RunContext) -> list[dict]:
    return pipeline.verify_components(ctx)

"""Open (or resume) the run, obtain the candidate, verify its components."""

from __future__ import annotations

import functools
from typing import Any, Callable

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.states import Failed
from sqlalchemy.orm import Session, sessionmaker

from qualify import pipeline
from qualify.build import BuildResult
from qualify.errors import QualifyError


def expected_failures(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Bad input, a rejected candidate and an infrastructure failure qualify names (QualifyError) end the
    task as Failed with their message, without a traceback in the logs (the error says what to do; the
    console drops Prefect's own line about the state: driver/prefect_launcher.py); the flow re-raises them."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except QualifyError as exc:
            return Failed(message=str(exc), data=exc)

    return wrapper


@task(name="open-run", cache_policy=NO_CACHE)
@expected_failures
def open_run_task(sessions: sessionmaker[Session], manifest: str, resume_run: int | None,
                  ray_address: str | None, triggered_by: str | None) -> pipeline.RunContext:
    return pipeline.open_run(sessions, manifest, resume_run_id=resume_run, ray_address=ray_address,
                             triggered_by=triggered_by)


@task(name="obtain-candidate", cache_policy=NO_CACHE)
@expected_failures
def obtain_candidate_task(ctx: pipeline.RunContext, wait: bool) -> BuildResult:
    return pipeline.obtain_candidate(ctx, wait=wait)


@task(name="verify-components", cache_policy=NO_CACHE)
def verify_components_task(ctx: pipeline.RunContext) -> list[dict[str, Any]]:
    return pipeline.verify_components(ctx)

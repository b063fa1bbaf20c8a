"""One Prefect task run per case, named by its case id, so the UI shows the matrix."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.artifacts import update_progress_artifact
from prefect.cache_policies import NO_CACHE

from qualify import pipeline
from qualify.execution import attempts
from qualify.manifest.cases import Case
from qualify.outcomes import CaseOutcome


# No Prefect retries or timeout here: the Ray task enforces the case timeout, and the
# pipeline retries infrastructure failures only (a failed test is never retried into a pass).
@task(name="run-case", cache_policy=NO_CACHE)
def run_case_task(ctx: pipeline.RunContext, case: Case, progress_artifact_id: str | None = None) -> CaseOutcome:
    logger = get_run_logger()
    logger.info("%s: submitted to Ray (%s)", case.case_id, case.resources.model_dump(exclude_defaults=True))
    outcome = attempts.run_case(ctx, case, log=logger.warning)
    level = logger.info if outcome.passed else logger.error
    level("%s: %s%s after %s attempt(s), exec %.1f s, queue %s s on %s", case.case_id, outcome.status,
          f" ({outcome.error_class}: {outcome.error})" if outcome.error_class else "",
          outcome.attempts, outcome.exec_s or 0.0,
          f"{outcome.queue_wait_s:.1f}" if outcome.queue_wait_s is not None else "n/a", outcome.node)
    if not outcome.passed:
        tail = _log_tail(ctx, case.case_id)
        if tail:
            logger.error("%s: the workload's log, last %d lines:\n%s", case.case_id, len(tail), "\n".join(tail))
    if progress_artifact_id:
        p = ctx.progress
        try:
            update_progress_artifact(progress_artifact_id, 100.0 * p.done / max(1, p.total),
                                     description=f"{p.done}/{p.total} cases done, {p.failed} failed")
        except Exception as exc:  # noqa: BLE001 - the dashboard is best effort, results are in the DB
            logger.warning("progress artifact not updated: %s", exc)
    return outcome


def _log_tail(ctx: pipeline.RunContext, case_id: str, lines: int = 40) -> list[str]:
    """The last lines of the workload's log as recorded with the result (the database keeps 8000 characters)."""
    from sqlalchemy import select

    from qualify.store.models import CaseResult

    try:
        with ctx.sessions() as session:
            text = session.scalar(select(CaseResult.log_tail).where(CaseResult.run_id == ctx.run_id,
                                                                    CaseResult.case_id == case_id))
    except Exception:  # noqa: BLE001 - the log is a convenience; the result is already recorded
        return []
    return (text or "").rstrip().splitlines()[-lines:]

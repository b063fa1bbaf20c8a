"""One Prefect task run per case, named by its case id, so the UI shows the matrix."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import update_progress_artifact
from prefect.cache_policies import NO_CACHE
from prefect.states import Failed, State

from qualify import pipeline
from qualify.manifest.cases import Case
from qualify.outcomes import CaseOutcome
from qualify.report.case_lines import figure_lines, resources_text


# No Prefect retries or timeout here: the Ray task enforces the case timeout, and the
# pipeline retries infrastructure failures only (a failed test is never retried into a pass).
@task(name="run-case", cache_policy=NO_CACHE)
def run_case_task(ctx: pipeline.RunContext, case: Case, running: Future[CaseOutcome], started_on_ray: bool,
                  progress_artifact_id: str | None = None) -> CaseOutcome | State:
    """The case's task run: created when its Ray task starts (the flow's _run_cases), Running while the case runs
    on Ray (attempts.run_case in the flow's case thread), ended with the case's outcome, figures and log tail.
    A case that ended without a Ray task running it (infeasible, lost before it ran) gets its task run then.
    A case that did not pass ends its task run Failed (red in the UI, its status and error as the state's message),
    carrying the outcome all the same: the flow reads it with raise_on_failure=False."""
    logger = get_run_logger()
    resources = resources_text(case.resources.model_dump(exclude_defaults=True))
    if started_on_ray:
        logger.info("%s: its Ray task started (%s)", case.case_id, resources)
    else:
        logger.info("%s: ended before any Ray task ran it (%s)", case.case_id, resources)
    outcome = running.result()
    level = logger.info if outcome.passed else logger.error
    level("%s: %s%s after %s attempt(s), exec %.1f s, queue %s s on %s", case.case_id, outcome.status,
          f" ({outcome.error_class}: {outcome.error})" if outcome.error_class else "",
          outcome.attempts, outcome.exec_s or 0.0,
          f"{outcome.queue_wait_s:.1f}" if outcome.queue_wait_s is not None else "n/a", outcome.node)
    row = _result_row(ctx, case.case_id)
    if row is not None:
        for line in figure_lines(case.case_id, row.kind, row.metrics, row.samples):
            logger.info("%s", line)
    if not outcome.passed:
        tail = (row.log_tail or "").rstrip().splitlines()[-40:] if row is not None else []
        if tail:
            logger.error("%s: the workload's log, last %d lines:\n%s", case.case_id, len(tail), "\n".join(tail))
    if progress_artifact_id:
        p = ctx.progress
        try:
            update_progress_artifact(progress_artifact_id, 100.0 * p.done / max(1, p.total),
                                     description=f"{p.done}/{p.total} cases done, {p.failed} failed, "
                                                 f"{p.running} running, {len(p.queued_cases)} queued in Ray")
        except Exception as exc:  # noqa: BLE001 - the dashboard is best effort, results are in the DB
            logger.warning("progress artifact not updated: %s", exc)
    if not outcome.passed:
        why = f" ({outcome.error_class}: {outcome.error})" if outcome.error_class else ""
        return Failed(message=f"{case.case_id}: {outcome.status}{why}"[:500], data=outcome)
    return outcome


def _result_row(ctx: pipeline.RunContext, case_id: str) -> Any:
    """The case's recorded result (figures, samples, the workload's log tail; the database keeps 8000 characters
    of the log), or None."""
    from sqlalchemy import select

    from qualify.store.models import CaseResult

    try:
        with ctx.sessions() as session:
            row = session.scalar(select(CaseResult).where(CaseResult.run_id == ctx.run_id,
                                                          CaseResult.case_id == case_id))
            if row is not None:
                session.expunge(row)
            return row
    except Exception:  # noqa: BLE001 - the log is a convenience; the result is already recorded
        return None

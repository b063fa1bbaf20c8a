"""The qualification flow: manifest -> candidate -> components -> cases on Ray -> gate -> report -> promote.

Prefect runs on the driver only; every case is a driver-side Prefect task that submits
one Ray task with the case's resources and awaits it (docs/ARCHITECTURE.md says why).
"""

from __future__ import annotations

import time
from typing import Any, Callable

from prefect import flow, get_run_logger
from prefect.task_runners import ThreadPoolTaskRunner
from prefect.runtime import flow_run
from prefect.states import Failed, State

from qualify import pipeline
from qualify.config import database_url
from qualify.fanout import start_ray
from qualify.store.engine import open_database
from qualify.store.models import Run
from tasks.cases import run_case_task
from tasks.gate import gate_task
from tasks.promote import promote_task
from tasks.report import progress_artifact_task, publish_report_task
from tasks.setup import obtain_candidate_task, open_run_task, verify_components_task

# The CLI sets this to show live progress; a deployment run leaves it None.
PROGRESS_LISTENER: Callable[[pipeline.Progress], None] | None = None


def _unwrap(value: Any) -> Any:
    """A task that ended Failed on an expected error returns its state: raise that error here."""
    if isinstance(value, State):
        return value.result()
    return value


@flow(name="qualify-release", flow_run_name="qualify {manifest}", log_prints=True)
def qualify_release(manifest: str, db_url: str | None = None, ray_address: str | None = None,
                    resume_run: int | None = None, wait: bool = False, promote: bool | None = None,
                    triggered_by: str | None = None) -> dict[str, Any]:
    """Qualify the release a manifest describes; returns the run id, verdict and reasons."""
    logger = get_run_logger()
    t0 = time.monotonic()
    _engine, sessions = open_database(database_url(db_url))
    try:
        ctx = _unwrap(open_run_task(sessions, manifest, resume_run, ray_address, triggered_by))
    except pipeline.UserInputError as exc:
        return Failed(message=str(exc), data=exc)  # type: ignore[return-value]
    with sessions() as session:
        run = session.get(Run, ctx.run_id)
        assert run is not None
        run.flow_run_id = str(flow_run.id) if flow_run.id else None
        session.commit()
    ctx.start_heartbeat()
    if PROGRESS_LISTENER is not None:
        ctx.progress.listeners.append(PROGRESS_LISTENER)
    ray_handle = None
    try:
        ctx.stage("setup", time.monotonic() - t0)
        logger.info("run %s of %s %s: %d cases", ctx.run_id, ctx.release.release.name, ctx.release.release.tag,
                    len(ctx.cases))

        t = time.monotonic()
        ctx.stage("build")
        build = _unwrap(obtain_candidate_task(ctx, wait))
        ctx.stage("build", time.monotonic() - t)
        logger.info("candidate %s (%s)", build.digest, build.builder)

        t = time.monotonic()
        ray_handle = start_ray(ctx.ray_address)
        ctx.stage("ray", time.monotonic() - t)

        t = time.monotonic()
        ctx.stage("verify")
        checks = verify_components_task(ctx)
        bad = [c for c in checks if not c["ok"]]
        logger.info("components: %d/%d as expected", len(checks) - len(bad), len(checks))
        ctx.stage("verify", time.monotonic() - t)

        t = time.monotonic()
        ctx.stage("cases")
        pending = pipeline.pending_cases(ctx)
        ctx.progress.total = len(ctx.cases)
        ctx.progress.done = len(ctx.cases) - len(pending)
        if ctx.resumed:
            logger.info("resuming: %d of %d cases still need a result", len(pending), len(ctx.cases))
        progress_id = progress_artifact_task(ctx, ctx.progress.done, ctx.progress.total)
        futures = [run_case_task.with_options(task_run_name=case.case_id).submit(ctx, case, progress_id)
                   for case in pending]
        outcomes = [f.result() for f in futures]
        ctx.stage("cases", time.monotonic() - t)

        t = time.monotonic()
        ctx.stage("gate")
        decision = gate_task(ctx)
        ctx.stage("gate", time.monotonic() - t)

        status = pipeline.finish_run(ctx, decision["verdict"])
        t = time.monotonic()
        ctx.stage("report")
        report = publish_report_task(ctx)
        ctx.stage("report", time.monotonic() - t)

        promotions: list[dict[str, Any]] = []
        do_promote = ctx.release.promotion.on_pass if promote is None else promote
        if decision["verdict"] == "PASS" and do_promote and ctx.release.promotion.targets:
            t = time.monotonic()
            ctx.stage("promote")
            promotions = promote_task(ctx)
            ctx.stage("promote", time.monotonic() - t)
        with sessions() as session:
            stage_seconds = dict(session.get(Run, ctx.run_id).stage_seconds or {})  # type: ignore[union-attr]
        return {"run_id": ctx.run_id, "verdict": decision["verdict"], "status": status,
                "reasons": decision["reasons"], "digest": build.digest, "report": report["report"],
                "cases": outcomes, "promotions": promotions, "stage_seconds": stage_seconds}
    except (pipeline.CandidateFailed, pipeline.UserInputError) as exc:
        # Expected outcomes, not crashes: a Failed state with the message, no traceback in the logs.
        pipeline.fail_run(ctx, "failed" if isinstance(exc, pipeline.CandidateFailed) else "aborted", str(exc))
        return Failed(message=str(exc), data=exc)  # type: ignore[return-value]
    except BaseException as exc:
        pipeline.fail_run(ctx, "error", f"{type(exc).__name__}: {exc}")
        raise
    finally:
        ctx.stop_heartbeat()
        if ray_handle is not None:
            ray_handle.shutdown()


def run_sized(manifest: str, n_cases: int, **parameters: Any) -> State:
    """Run the flow in this process with a driver thread pool sized to the matrix (every case's
    Prefect task waits on its Ray task; a smaller pool would queue cases behind Prefect, not Ray)."""
    sized = qualify_release.with_options(task_runner=ThreadPoolTaskRunner(max_workers=max(4, n_cases + 2)))
    return sized(manifest=manifest, return_state=True, **parameters)

"""The qualification flow: manifest -> candidate -> components -> cases on Ray -> gate -> report -> promote.

Prefect runs on the driver only; every case is a driver-side Prefect task that submits
one Ray task with the case's resources and awaits it (docs/ARCHITECTURE.md says why).
The flow only composes library calls (qualify.pipeline) wrapped as tasks (tasks/).
The database URL never travels as a parameter (the UI shows parameters): it comes from the
environment (QUALIFY_DATABASE_URL) of the process that runs the flow.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from prefect import flow, get_run_logger
from prefect.client.orchestration import get_client
from prefect.futures import wait as wait_for_all
from prefect.runtime import flow_run
from prefect.states import Failed, State

from qualify import pipeline
from qualify.execution import attempts
from qualify.progress import Progress
from qualify.errors import BadInput, Rejected
from qualify.outcomes import PromotionSummary, RunOutcome, RunStatus
from qualify.execution.ray import start_ray
from qualify.settings import Settings
from qualify.store.engine import open_database
from qualify_prefect.tasks.candidate import obtain_candidate_task, open_run_task, verify_components_task
from qualify_prefect.tasks.cases import run_case_task
from qualify_prefect.tasks.gate import gate_task
from qualify_prefect.tasks.promote import promote_task
from qualify_prefect.tasks.report import progress_artifact_task, publish_report_task


def _unwrap(value: Any) -> Any:
    """A task that ended Failed on an expected error returns its state: raise that error here."""
    if isinstance(value, State):
        return value.result()
    return value


def _initial_name() -> str:
    """`<release>:<tag> run …` while the run opens (renamed with its id right after: _name_flow_run)."""
    manifest = str((flow_run.parameters or {}).get("manifest") or "")
    try:
        from qualify.manifest.load import load_manifest

        rel = load_manifest(manifest).release.release
        return f"{rel.name}:{rel.tag} run …"
    except Exception:  # noqa: BLE001 - a bad manifest is reported by open-run; the name is only a label
        return f"qualify {manifest}"


def _name_flow_run(ctx: pipeline.RunContext, logger: Any) -> None:
    """Name the flow run as people look for it in the UI: `<release>:<tag> run <id>` (the run id is known only
    now that the run is open)."""
    if not flow_run.id:
        return
    name = f"{ctx.manifest.release.name}:{ctx.manifest.release.tag} run {ctx.run_id}"
    try:
        with get_client(sync_client=True) as client:
            client.update_flow_run(flow_run.id, name=name)
    except Exception as exc:  # noqa: BLE001 - a label; the run goes on
        logger.warning("the flow run keeps its first name (rename to %r failed: %s)", name, exc)


@flow(name="qualify-release", flow_run_name=_initial_name, log_prints=True)
def qualify_release(manifest: str, ray_address: str | None = None, resume_run: int | None = None,
                    wait: bool = False, promote: bool | None = None, triggered_by: str | None = None,
                    on_progress: Callable[[Progress], None] | None = None) -> RunOutcome:
    """Qualify the release a manifest describes; returns the run's outcome (verdict, reasons, report)."""
    logger = get_run_logger()
    started = time.monotonic()
    _engine, sessions = open_database(Settings.load().database_url)
    try:
        ctx = _unwrap(open_run_task(sessions, manifest, resume_run, ray_address, triggered_by))
    except BadInput as exc:
        return Failed(message=str(exc), data=exc)  # type: ignore[return-value]
    ray_handle = None
    try:  # from here on, whatever fails marks the run (never left "running")
        ctx.bind_flow_run(str(flow_run.id) if flow_run.id else None)
        _name_flow_run(ctx, logger)
        ctx.stage("setup", time.monotonic() - started)
        ctx.start_heartbeat()
        if on_progress is not None:
            ctx.progress.listeners.append(on_progress)
        logger.info("run %s of %s %s: %d cases", ctx.run_id, ctx.manifest.release.name, ctx.manifest.release.tag,
                    len(ctx.cases))
        with ctx.timed_stage("build"):
            build = _unwrap(obtain_candidate_task(ctx, wait))
        logger.info("candidate %s (%s)", build.digest, build.builder)
        with ctx.timed_stage("ray"):
            ray_handle = start_ray(ctx.ray_address)
        with ctx.timed_stage("verify"):
            checks = verify_components_task(ctx)
        logger.info("components: %d/%d as expected", sum(c["ok"] for c in checks), len(checks))

        with ctx.timed_stage("cases"):
            pending = attempts.pending_cases(ctx, log=logger.info)
            ctx.progress.total = len(ctx.cases)
            ctx.progress.done = len(ctx.cases) - len(pending)
            if ctx.resumed:
                logger.info("resuming: %d of %d cases still need a result", len(pending), len(ctx.cases))
            progress_id = progress_artifact_task(ctx, ctx.progress.done, ctx.progress.total)
            futures = [run_case_task.with_options(task_run_name=case.case_id).submit(ctx, case, progress_id)
                       for case in pending]
            wait_for_all(futures)  # every case finishes (and is spooled) before a failed one stops the flow
            outcomes = [f.result() for f in futures]

        with ctx.timed_stage("gate"):
            evaluation = gate_task(ctx)
        verdict = evaluation.judgement.verdict
        status = pipeline.finish_run(ctx, verdict)
        with ctx.timed_stage("report"):
            report = publish_report_task(ctx)

        promotions = []
        if pipeline.wants_promotion(ctx, verdict, promote):
            with ctx.timed_stage("promote"):
                promotions = [PromotionSummary(o.target, o.target_ref, o.outcome, o.detail)
                              for o in promote_task(ctx)]
        return RunOutcome(run_id=ctx.run_id, verdict=verdict, status=status, digest=build.digest,
                          reasons=evaluation.judgement.reason_dicts(), report=report, cases=outcomes,
                          promotions=promotions, stage_seconds=ctx.stage_seconds())
    except (BadInput, Rejected) as exc:
        # Expected outcomes, not crashes: a Failed state with the message, no traceback in the logs.
        pipeline.fail_run(ctx, RunStatus.FAILED if isinstance(exc, Rejected) else RunStatus.ABORTED, str(exc))
        return Failed(message=str(exc), data=exc)  # type: ignore[return-value]
    except BaseException as exc:
        pipeline.fail_run(ctx, RunStatus.ERROR, f"{type(exc).__name__}: {exc}")
        raise
    finally:
        ctx.stop_heartbeat()
        if ray_handle is not None:
            ray_handle.shutdown()

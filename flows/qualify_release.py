"""The qualification flow: manifest -> candidate -> components -> cases on Ray -> gate -> report -> promote.

Prefect runs on the driver only; every case is a driver-side Prefect task that submits
one Ray task with the case's resources and awaits it (docs/ARCHITECTURE.md says why).
The flow only composes library calls (qualify.pipeline) wrapped as tasks (tasks/).
The database URL never travels as a parameter (the UI shows parameters): it comes from the
environment (QUALIFY_DATABASE_URL) of the process that runs the flow.
"""

from __future__ import annotations

import functools
import queue
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from prefect import flow, get_run_logger
from prefect.client.orchestration import get_client
from prefect.context import FlowRunContext
from prefect.futures import wait as wait_for_all
from prefect.runtime import flow_run
from prefect.settings import PREFECT_UI_URL
from prefect.states import Failed, State
# Every task gets the run's context (and a case, its future) quoted: Prefect otherwise walks into a task's arguments
# to find futures and states, while the case threads and the heartbeat change the context (its progress counters,
# dicts and lists): the walk failed at random ("Failed to resolve inputs in parameter 'ctx'"), and cost a walk of
# the whole manifest on every task call.
from prefect.utilities.annotations import quote

from qualify import pipeline
from qualify.errors import BadInput, QualifyError, Rejected
from qualify.execution import attempts, spool
from qualify.progress import process_listeners
from qualify.manifest.cases import Case
from qualify.outcomes import CaseOutcome, PromotionSummary, RunOutcome, RunStatus
from qualify.execution.ray import cluster_nodes, start_ray
from qualify.report.links import flow_run_url, report_url
from qualify.settings import Settings
from qualify.store import same_database as database_identity
from qualify.store.engine import open_database
from qualify_prefect.tasks.candidate import obtain_candidate_task, open_run_task, verify_components_task
from qualify_prefect.tasks.cases import run_case_task
from qualify_prefect.tasks.gate import gate_task
from qualify_prefect.tasks.promote import promote_task
from qualify_prefect.flows import worker_logs
from qualify_prefect.flows.verdict import final_state, log_verdict
from qualify_prefect.tasks.report import progress_artifact_task, publish_artifacts, publish_report_task


worker_logs.install()  # a worker's process imports this module to run the flow


def _unwrap(value: Any) -> Any:
    """A task that ended Failed on an expected error returns its state: raise that error here."""
    if isinstance(value, State):
        return value.result()
    return value


def _fail_run_quietly(ctx: pipeline.RunContext, status: RunStatus, message: str) -> None:
    """Mark the run; when the database itself is what failed, the error already says so."""
    try:
        pipeline.fail_run(ctx, status, message)
    except Exception:  # noqa: BLE001 - the run row cannot be written: the error being raised explains why
        pass


def _initial_name() -> str:
    """`<release>:<tag> run …` while the run opens (renamed with its id right after: _name_flow_run)."""
    manifest = str((flow_run.parameters or {}).get("manifest") or "")
    try:
        from qualify.manifest.load import load_manifest

        rel = load_manifest(manifest).release.release
        return f"{rel.name}:{rel.tag} run …"
    except Exception:  # noqa: BLE001 - a bad manifest is reported by open-run; the name is only a label
        return f"qualify {manifest}"


def _name_flow_run(ctx: pipeline.RunContext, logger: Any) -> Any:
    """Name the flow run as people look for it in the UI: `<release>:<tag> run <id>` (the run id is known only
    now that the run is open). Returns the logger to use from here on: Prefect's loggers carry the flow run's
    name from the run context, so the context's copy is renamed too, and the flow's and later task runs' log
    lines (a worker's log, the console) say the new name instead of the interim one."""
    if not flow_run.id:
        return logger
    name = f"{ctx.manifest.release.name}:{ctx.manifest.release.tag} run {ctx.run_id}"
    try:
        with get_client(sync_client=True) as client:
            client.update_flow_run(flow_run.id, name=name)
    except Exception as exc:  # noqa: BLE001 - a label; the run goes on
        logger.warning("the flow run keeps its first name (rename to %r failed: %s)", name, exc)
        return logger
    context = FlowRunContext.get()
    if context is not None and context.flow_run is not None:
        context.flow_run.name = name
    worker_logs.rename(str(flow_run.id), name)  # the engine's own lines too
    return get_run_logger()


def _start_ray_stage(ctx: pipeline.RunContext) -> Any:
    """The stage `ray`: join or start Ray, and record the cluster's nodes (the report's makespan bound)."""
    with ctx.timed_stage("ray"):
        handle = start_ray(ctx.ray_address)
        ctx.record_cluster(cluster_nodes())
    return handle


def _run_cases(ctx: pipeline.RunContext, pending: list[Case], progress_id: str | None,
               logger: Any) -> list[CaseOutcome]:
    """Every case runs on Ray from a thread of its own (attempts.run_case); its Prefect task run is created when
    its Ray task starts, or when it ended without starting (infeasible, lost first), so that a task run's Running
    time is the case's time on Ray, never its wait in Ray's queue (the progress artifact counts the queued).
    Every case finishes (and is spooled) before a failed one stops the flow."""
    if not pending:
        return []
    ready: queue.Queue[tuple[str, bool]] = queue.Queue()  # (case, its Ray task started) or (case, it ended)
    by_id = {case.case_id: case for case in pending}
    tasks: dict[str, Any] = {}
    pool = ThreadPoolExecutor(max_workers=len(pending), thread_name_prefix="qualify-case")
    try:
        running: dict[str, Future[CaseOutcome]] = {}
        for case in pending:
            # One case handed to Ray at a time, in the planner's order (longest first): threads that all called
            # Ray at once reached its queue in any order, and a short case could wait behind every long one.
            handed = threading.Event()
            future = pool.submit(attempts.run_case, ctx, case, logger.warning,
                                 on_started=functools.partial(ready.put, (case.case_id, True)),
                                 on_submitted=handed.set)
            future.add_done_callback(lambda _f, case_id=case.case_id: ready.put((case_id, False)))
            future.add_done_callback(lambda _f, event=handed: event.set())
            running[case.case_id] = future
            while not handed.wait(timeout=1.0):  # a timeout keeps the flow's thread answering signals
                pass
        while len(tasks) < len(pending):
            try:
                case_id, started = ready.get(timeout=1.0)  # a timeout keeps the flow's thread answering signals
            except queue.Empty:
                continue
            if case_id not in tasks:
                tasks[case_id] = run_case_task.with_options(task_run_name=case_id).submit(
                    quote(ctx), quote(by_id[case_id]), quote(running[case_id]), started, progress_id)
        wait_for_all(list(tasks.values()))
    finally:
        # Never wait here for cases still on Ray (an interrupt): the flow's own cleanup stops Ray, which ends them.
        pool.shutdown(wait=False, cancel_futures=True)
    # A case that did not pass ended its task run Failed (tasks/cases.py), its outcome the state's data.
    return [tasks[case.case_id].result(raise_on_failure=False) for case in pending]


@flow(name="qualify-release", flow_run_name=_initial_name, log_prints=True)
def qualify_release(manifest: str, ray_address: str | None = None, resume_run: int | None = None,
                    wait: bool = False, promote: bool | None = None, triggered_by: str | None = None) -> RunOutcome:
    """Qualify the release a manifest describes; the run ends PASS (Completed), FAIL or INCOMPLETE (Failed).

    Args:
        manifest: Path of the release manifest (YAML) on the worker, e.g. releases/cpu-smoke.yaml.
        ray_address: Join this Ray cluster (auto, host:port or ray://...) instead of starting a local one.
        resume_run: Id of an earlier run to finish: only its cases without a final result run again, then the gate.
        wait: When another run of the same candidate digest is running, wait for it instead of refusing.
        promote: Promote the tag on PASS; empty means as the manifest's promotion.on_pass says.
        triggered_by: Who or what started the run, recorded with it (e.g. ci:pipeline/1234); empty means the user.
    """
    logger = get_run_logger()
    started = time.monotonic()
    try:
        settings = Settings.load()
        _engine, sessions = open_database(settings.database_url)
        ctx = _unwrap(open_run_task(sessions, manifest, resume_run, ray_address, triggered_by))
    except QualifyError as exc:  # bad input, or the database could not be reached or open the run
        return Failed(message=str(exc), data=exc)  # type: ignore[return-value]
    ray_handle = None
    try:  # from here on, whatever fails marks the run (never left "running")
        identity = database_identity.capture(sessions, ctx.run_id)  # confirmed before the verdict
        ctx.bind_flow_run(str(flow_run.id) if flow_run.id else None)
        logger = _name_flow_run(ctx, logger)
        ctx.stage("setup", time.monotonic() - started)
        ctx.start_heartbeat()
        ctx.progress.listeners.extend(process_listeners())  # the CLI's progress line, when it drives this run
        logger.info("run %s of %s %s: %d cases", ctx.run_id, ctx.manifest.release.name, ctx.manifest.release.tag,
                    len(ctx.cases))
        if ctx.manifest.build.on == "cluster":  # the build is a Ray task on a builder node: Ray first
            ray_handle = _start_ray_stage(ctx)
        with ctx.timed_stage("build"):
            build = _unwrap(obtain_candidate_task(quote(ctx), wait))
        logger.info("candidate %s (%s)", build.digest, build.builder)
        for name, side in ctx.further.items():  # the release's further images (manifest `images:`)
            logger.info("image %s: %s (%s)", name, side.build.digest, side.build.builder)
        if ray_handle is None:
            ray_handle = _start_ray_stage(ctx)
        ctx.pull_images()  # stage `pull`: the images on every node that will run cases, once, before them
        with ctx.timed_stage("verify"):
            checks = verify_components_task(quote(ctx))
        logger.info("components: %d/%d as expected", sum(c["ok"] for c in checks), len(checks))

        with ctx.timed_stage("cases"):
            pending = attempts.pending_cases(ctx, log=logger.info)
            ctx.progress.total = len(ctx.cases)
            ctx.progress.done = len(ctx.cases) - len(pending)
            if ctx.resumed:
                logger.info("resuming: %d of %d cases still need a result", len(pending), len(ctx.cases))
            progress_id = progress_artifact_task(quote(ctx), ctx.progress.done, ctx.progress.total)
            outcomes = _run_cases(ctx, pending, progress_id, logger)
        # Nothing after the cases uses Ray: its shutdown (1-1.5 s here; early Ray's in its owner thread) overlaps
        # the gate, the report and the flow run's end instead of following them.
        ray_handle.shutdown()

        database_identity.confirm(sessions, identity)  # a vanished or replaced database never gets a verdict
        with ctx.timed_stage("gate"):
            evaluation = gate_task(quote(ctx))
        spool.clear(ctx.data_dir, ctx.run_id)  # every result is in the database the run opened
        verdict = evaluation.judgement.verdict
        status = pipeline.finish_run(ctx, verdict)
        with ctx.timed_stage("report"):
            written = publish_report_task(quote(ctx), flow_run_url(PREFECT_UI_URL.value(), flow_run.id))
            report_link = report_url(settings.public_url, ctx.run_id, written)
            publish_artifacts(ctx, report_link)  # in the flow's body: the artifacts belong to the flow run

        promotions = []
        if pipeline.wants_promotion(ctx, verdict, promote):
            with ctx.timed_stage("promote"):
                promotions = [PromotionSummary(o.target, o.target_ref, o.outcome, o.detail)
                              for o in promote_task(quote(ctx))]
        outcome = RunOutcome(run_id=ctx.run_id, verdict=verdict, status=status, digest=build.digest,
                             reasons=evaluation.judgement.reason_dicts(), report=str(written), cases=outcomes,
                             promotions=promotions, stage_seconds=ctx.stage_seconds(),
                             launch_time=ctx.launch_time_line())
        log_verdict(logger, outcome, report_link)
        return final_state(outcome)  # type: ignore[return-value] - a state Prefect ends the run in, carrying it
    except QualifyError as exc:
        # Expected outcomes and named infrastructure failures (Ray unreachable, the registry or the database
        # down), not crashes: a Failed state with the message, no traceback in the logs; the CLI prints it once.
        status = (RunStatus.FAILED if isinstance(exc, Rejected) else RunStatus.ABORTED if isinstance(exc, BadInput)
                  else RunStatus.ERROR)
        if not isinstance(exc, database_identity.DatabaseReplaced):  # never write into another database
            _fail_run_quietly(ctx, status, str(exc))
        return Failed(message=str(exc), data=exc)  # type: ignore[return-value]
    except BaseException as exc:
        pipeline.fail_run(ctx, RunStatus.ERROR, f"{type(exc).__name__}: {exc}")
        raise
    finally:
        ctx.stop_heartbeat()
        if ray_handle is not None:
            ray_handle.shutdown()

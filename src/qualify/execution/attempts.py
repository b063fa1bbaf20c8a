"""A case's attempts, from the Ray task to its stored result: infrastructure failures retried, the result
spooled to disk before the database is tried, and spooled results of an earlier driver recorded on resume."""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any, Callable

from sqlalchemy.exc import OperationalError

from qualify.errors import InfraError
from qualify.execution import spool
from qualify.execution.duet import DuetPolicy, duet_choice, fell_back
from qualify.execution.launches import unpaired
from qualify.execution.paired import baseline_document, is_paired_case
from qualify.execution.ray import infeasible_reason, run_case_on_ray
from qualify.execution.sequential_inputs import sequential_block
from qualify.gate.sequential import KEY as SEQUENTIAL
from qualify.execution.result import CaseRunResult
from qualify.manifest import fingerprint, is_reference_case, train_case_id
from qualify.manifest.cases import Case
from qualify.outcomes import CaseOutcome, CaseStatus, ErrorClass
from qualify.plan import submission_order
from qualify.pipeline import RunContext
from qualify.store import repo
from qualify.workloads import protocol


def pending_cases(ctx: RunContext, log: Callable[[str], None] = lambda _m: None) -> list[Case]:
    """Cases without a final result (all of them for a new run), longest first, after recording what a
    previous driver of this run spooled to disk but could not write to the database."""
    for path, result in spool.pending(ctx.data_dir, ctx.run_id):
        if commit_result(ctx, result, log):
            log(f"{result.case_id}: recorded the result spooled by an earlier driver ({path})")
        path.unlink(missing_ok=True)
    with ctx.sessions() as session:
        done = repo.final_case_ids(session, ctx.run_id)
        pending = [c for c in ctx.cases if c.case_id not in done]
        history = repo.recent_exec_seconds(session, ctx.manifest.release.repository, [c.case_id for c in pending])
    # The estimate of the end comes from earlier results only: a guess from parameters would be shown as a figure.
    ctx.progress.expected_s = dict(history)
    # Longest first (earlier results, else the estimate): a long case never starts last behind short ones.
    return submission_order(pending, history, ctx.manifest)


def commit_result(ctx: RunContext, result: spool.SpooledResult, log: Callable[[str], None]) -> bool:
    """Insert one final result (retried while the database is busy); False when one was already there."""
    case = next(c for c in ctx.cases if c.case_id == result.case_id)

    def write_once() -> bool:
        with ctx.sessions() as session:
            try:
                repo.record_case_result(session, ctx.run_id, case_id=case.case_id, kind=case.kind,
                                        model=case.model, variant=case.variant, doc=result.doc,
                                        attempts=result.attempts, queue_wait_s=result.queue_wait_s,
                                        exec_s=result.exec_s, node=result.node, fingerprint=result.fingerprint)
                session.commit()
                return True
            except repo.DuplicateResult:
                session.rollback()
                return False

    return spool.with_retries(write_once, attempts=ctx.db_write_attempts, on_retry=lambda n, exc: log(
        f"{case.case_id}: database write {n} failed ({type(exc).__name__}); retrying"))


CaseRunner = Callable[..., CaseRunResult]


def run_case(ctx: RunContext, case: Case, log: Callable[[str], None] = lambda _m: None, *,
             runner: CaseRunner | None = None,
             infeasible: Callable[[Any], str | None] | None = None,
             on_started: Callable[[], None] | None = None,
             on_submitted: Callable[[], None] | None = None) -> CaseOutcome:
    """Run one case on Ray, retrying infrastructure failures only, and record the final result at once.

    `runner` and `infeasible` default to the Ray backend; tests pass fakes to exercise the retry loop.
    `on_started` is called once, when the case's first Ray task runs (the progress says running, no longer queued).
    `on_submitted` is called once, when its first Ray task is handed to Ray, or when the case ends without one
    (infeasible, or an error): the flow hands cases to Ray one after the other, in submission order.
    """
    runner = runner or run_case_on_ray
    infeasible = infeasible or infeasible_reason
    assert ctx.executor_for(case) is not None, "obtain_candidate() sets the executors"
    ctx.progress.start_case(case.case_id)
    told = threading.Event()

    def started() -> None:
        if told.is_set():
            return  # a retried attempt runs again; the case started once
        told.set()
        ctx.progress.case_started(case.case_id)
        if on_started is not None:
            on_started()

    handed = threading.Event()

    def submitted() -> None:
        if not handed.is_set():
            handed.set()
            if on_submitted is not None:
                on_submitted()

    # Only the Ray backend is told (tests' fake runners take the arguments they know).
    signal = {"on_started": started, "on_submitted": submitted} if runner is run_case_on_ray else {}
    try:
        return _attempts(ctx, case, log, runner, infeasible, signal)
    finally:
        submitted()  # a case that never reached Ray releases the next one too


def _other_side_case(ctx: RunContext, case: Case) -> Case:
    """The case the other side runs: the same one, except that gate.reference.variant makes a training reference
    case's reference side run that variant of the same model (the standard image as it comes), under this id."""
    ref = ctx.manifest.gate.reference
    if ref is None or not ref.variant or not is_reference_case(case) or case.kind != "train":
        return case
    wanted = train_case_id(str(case.model), ref.variant)
    sibling = next((c for c in ctx.cases if c.case_id == wanted), None)
    return replace(sibling, case_id=case.case_id, tags=case.tags) if sibling is not None else case


def _name_other_side(doc: dict[str, Any], label: str | None) -> None:
    """The image the other side ran (the previous release's or gate.reference's, by digest), beside the executor's
    own description of it, in the paired and duet records the gate and the report read."""
    env = doc.get("environment")
    for key in ("paired", "duet"):
        record = env.get(key) if isinstance(env, dict) else None
        if isinstance(record, dict) and label:
            record["baseline_image"] = label


def _attempts(ctx: RunContext, case: Case, log: Callable[[str], None], runner: CaseRunner,
              infeasible: Callable[[Any], str | None], signal: dict[str, Any]) -> CaseOutcome:
    # The other side: gate.reference's image for a reference case, else the previous release (paired, duet).
    other = ctx.reference if is_reference_case(case) else ctx.paired_for(case)
    executor = ctx.executor_for(case)
    paired_case = is_paired_case(other, ctx.manifest, case)
    case_doc = case.document()
    block = sequential_block(ctx.sessions, ctx.manifest, case, paired=paired_case and other is not None
                             and other.executor is not None)
    if block is not None:
        case_doc[SEQUENTIAL] = block  # more launches while the gate's decision is undecided (gate.sequential)
    attempts = 0
    retries = ctx.manifest.execution.infra_retries
    reason = infeasible(case.resources)
    if reason:
        out = CaseRunResult.failed(
            protocol.make_result(case.document(), "error", error_class="infra", error=reason), retryable=False)
        attempts = 1
    else:
        while True:
            attempts += 1
            if paired_case and other is not None and other.executor is not None and case.resources.nodes == 1:
                choice = duet_choice(ctx.manifest, case, infeasible)  # None unless the case's rule says duet
                extra = {"duet": choice} if isinstance(choice, DuetPolicy) else {}
                out = runner(executor, case_doc, case.resources, case.timeout_s,
                             baseline=other.executor, baseline_doc=baseline_document(_other_side_case(ctx, case)),
                             **extra, **signal)
                if isinstance(choice, str):
                    fell_back(out.doc, other.label, choice)
                _name_other_side(out.doc, other.label)
            else:
                out = runner(executor, case_doc, case.resources, case.timeout_s, **signal)
            timed_out = out.doc.get("error_class") == ErrorClass.TIMEOUT
            retryable = out.retryable or (timed_out and ctx.manifest.execution.retry_timeouts)
            if not retryable or attempts > retries:
                break
            log(f"{case.case_id}: attempt {attempts} ended with {out.doc.get('error_class')} "
                f"({out.doc.get('error')}); retrying ({attempts}/{retries})")
    doc = out.doc
    if paired_case and other is not None and "paired" not in (doc.get("environment") or {}):
        why = other.reason or ("a multi-node case is not re-measured in pairs" if case.resources.nodes > 1
                               else "the case ran without its baseline")
        doc = unpaired(doc, other.label, why)
    # Which image of the release the case ran in, and how (a release may have several: manifest `images:`).
    if isinstance(doc.get("environment"), dict) and executor is not None:
        doc["environment"]["release_image"] = {"name": case.image or ctx.manifest.release.name,
                                               "executor": executor.describe()}
    result = spool.SpooledResult(case_id=case.case_id, doc=doc, attempts=attempts, queue_wait_s=out.queue_wait_s,
                                 exec_s=out.exec_s, node=out.node,
                                 fingerprint=fingerprint.of_case(case, doc.get("environment") or {}))
    spooled = spool.write(ctx.data_dir, ctx.run_id, result)  # on disk before the database is tried
    try:
        if not commit_result(ctx, result, log):
            log(f"{case.case_id}: a result was already recorded; keeping the first")
    except OperationalError as exc:
        raise InfraError(f"{case.case_id}: the database refused the result ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0][:200]}); it is kept in {spooled}: "
                         f"`qualify run --resume {ctx.run_id}` records it without running the case again") from exc
    # The spooled file stays until the verdict: the database's identity is confirmed then (store/same_database),
    # and a database that vanished meanwhile leaves every result here for --resume.
    outcome = CaseOutcome(case_id=case.case_id, status=CaseStatus(doc.get("status")),
                          error_class=ErrorClass(doc["error_class"]) if doc.get("error_class") else None,
                          error=doc.get("error"), attempts=attempts, exec_s=out.exec_s,
                          queue_wait_s=out.queue_wait_s, node=out.node, gpu_ids=tuple(out.gpu_ids))
    ctx.progress.finish_case(outcome.passed, case.case_id)
    return outcome

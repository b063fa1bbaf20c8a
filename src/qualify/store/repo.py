"""Queries and writes of the results database. Every function takes a Session; callers commit."""

from __future__ import annotations

import datetime as dt
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from sqlalchemy import func, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, joinedload

from qualify.errors import BadInput
from qualify.outcomes import Verdict
from qualify.store.models import (
    Calibration,
    CaseResult,
    ComponentCheck,
    GateDecision,
    Image,
    Promotion,
    Release,
    Run,
    RunImage,
    utcnow,
)

if TYPE_CHECKING:
    from qualify.manifest.load import LoadedManifest


class RunConflict(BadInput):
    """Another run of the same candidate digest is in progress."""


class DuplicateResult(Exception):
    """A final result for this (run, case) is already recorded."""


# --------------------------------------------------------------------------- releases, images


def _insert_or_select(session: Session, row: Any, find: Callable[[], Any]) -> Any:
    """Insert row, or -- when a concurrent writer inserted the same unique key first -- the row it wrote.
    Atomic without a table lock: the insert runs in a savepoint that a conflict rolls back alone."""
    existing = find()
    if existing is not None:
        return existing
    try:
        with session.begin_nested():
            session.add(row)
            session.flush()
        return row
    except IntegrityError:
        found = find()
        if found is None:
            raise
        return found


def get_or_create_release(session: Session, name: str, repository: str, tag: str,
                          previous_tag: str | None) -> Release:
    release = _insert_or_select(
        session, Release(name=name, repository=repository, tag=tag, previous_tag=previous_tag),
        lambda: session.scalar(select(Release).where(Release.repository == repository, Release.tag == tag)))
    if previous_tag and release.previous_tag != previous_tag:
        release.previous_tag = previous_tag
    return release


def get_or_create_image(session: Session, repository: str, tag: str | None, digest: str, *,
                        builder: str | None = None, build_log_path: str | None = None,
                        build_log_tail: str | None = None) -> Image:
    row = Image(repository=repository, tag=tag, digest=digest, builder=builder, build_log_path=build_log_path,
                build_log_tail=build_log_tail)
    return _insert_or_select(session, row, lambda: session.scalar(
        select(Image).where(Image.repository == repository, Image.tag == tag, Image.digest == digest)))


# --------------------------------------------------------------------------- runs


def create_run(session: Session, release: Release, *, manifest_path: str, manifest_sha256: str,
               manifest_text: str, triggered_by: str | None) -> Run:
    run = Run(release_id=release.id, status="running", stage="created", manifest_path=manifest_path,
              manifest_sha256=manifest_sha256, manifest_text=manifest_text, triggered_by=triggered_by,
              stage_seconds={}, heartbeat_at=utcnow())
    session.add(run)
    session.flush()
    return run


def attach_candidate(session: Session, run: Run, image: Image,
                     stale: Callable[[Run], str | None] = lambda _run: None) -> None:
    """Bind the run to its candidate digest; refuses while another run of that digest is running.

    A running run whose driver is gone (`stale` returns why) is marked aborted first, so a killed driver
    never blocks its digest forever."""
    _refuse_while_running(session, run, image.digest, stale, f"of digest {image.digest}")
    try:
        with session.begin_nested():  # a savepoint: a conflict undoes only this binding
            run.image_id = image.id
            run.candidate_digest = image.digest
            session.flush()
    except IntegrityError as exc:  # the partial unique index caught a concurrent start
        raise RunConflict(f"another run of digest {image.digest} is running") from exc


def _refuse_while_running(session: Session, run: Run, digest: str, stale: Callable[[Run], str | None],
                          what: str) -> None:
    """RunConflict while another run qualifies the digest; a running run whose driver is gone (`stale` says why)
    is marked aborted first, so a killed driver never blocks its digest forever."""
    active = _running_with(session, digest, run.id)
    why = stale(active) if active is not None else None
    if active is not None and why:
        finish_run(session, active, "aborted", f"aborted by run {run.id}: {why}")
        session.flush()
        active = None
    if active is not None:
        raise RunConflict(f"run {active.id} {what} is still running "
                          f"(started {active.started_at:%Y-%m-%d %H:%M:%S}); resume or wait for it")


def _running_with(session: Session, digest: str, run_id: int) -> Run | None:
    """Another running run that qualifies this digest, as its candidate or as one of its further images."""
    further = select(RunImage.run_id).where(RunImage.digest == digest).scalar_subquery()
    return session.scalar(select(Run).where(or_(Run.candidate_digest == digest, Run.id.in_(further)),
                                            Run.status == "running", Run.id != run_id).limit(1))


def attach_image(session: Session, run: Run, name: str, image: Image,
                 stale: Callable[[Run], str | None] = lambda _run: None) -> RunImage:
    """Bind one of the release's further images to the run (as attach_candidate binds its own): refused while
    another run qualifies that digest. A resumed run finds its row again; a different digest is refused."""
    _refuse_while_running(session, run, image.digest, stale, f"qualifying image {name}'s digest {image.digest}")
    row = session.scalar(select(RunImage).where(RunImage.run_id == run.id, RunImage.name == name))
    if row is not None and row.digest != image.digest:
        raise BadInput(f"run {run.id} qualified image {name} as {row.digest}; it is now {image.digest}: "
                       "start a new run")
    if row is None:
        row = RunImage(run_id=run.id, name=name, image_id=image.id, digest=image.digest)
        session.add(row)
        session.flush()
    return row


def run_images(session: Session, run_id: int) -> Sequence[RunImage]:
    """The run's further images, in the manifest's order of building (by id), their Image rows loaded."""
    return session.scalars(select(RunImage).options(joinedload(RunImage.image))
                           .where(RunImage.run_id == run_id).order_by(RunImage.id)).all()


def set_stage(session: Session, run: Run, stage: str, seconds: float | None = None) -> None:
    run.stage = stage
    run.heartbeat_at = utcnow()
    if seconds is not None:
        timings = dict(run.stage_seconds or {})
        timings[stage] = round(timings.get(stage, 0.0) + seconds, 3)
        run.stage_seconds = timings


def finish_run(session: Session, run: Run, status: str, error: str | None = None) -> None:
    run.status = status
    run.finished_at = utcnow()
    run.error = error


# Ids are INTEGER columns: PostgreSQL's are 32-bit, and a larger number is no run rather than an
# OverflowError or a database error (issue 24.10).
MAX_ID = 2**31 - 1


def get_run(session: Session, run_id: int) -> Run | None:
    if not 0 < run_id <= MAX_ID:
        return None
    return session.get(Run, run_id)


def list_runs(session: Session, limit: int = 50) -> Sequence[Run]:
    return session.scalars(select(Run).order_by(Run.id.desc()).limit(limit)).all()


def find_runs(session: Session, *, release: str | None = None, tag: str | None = None, digest: str | None = None,
              verdict: str | None = None, limit: int = 50, offset: int = 0) -> Sequence[Run]:
    """Runs newest first, filtered by release name (and tag), candidate digest and the verdict of their latest
    decision (runs without a decision have none); `offset` pages."""
    query = select(Run).order_by(Run.id.desc())
    if release is not None or tag is not None:
        query = query.join(Release, Run.release_id == Release.id)
        if release is not None:
            query = query.where(Release.name == release)
        if tag is not None:
            query = query.where(Release.tag == tag)
    if digest is not None:
        further = select(RunImage.run_id).where(RunImage.digest == digest).scalar_subquery()
        query = query.where(or_(Run.candidate_digest == digest, Run.id.in_(further)))
    if verdict is not None:
        latest = (select(GateDecision.verdict).where(GateDecision.run_id == Run.id)
                  .order_by(GateDecision.id.desc()).limit(1).scalar_subquery())
        query = query.where(latest == verdict)
    return session.scalars(query.limit(limit).offset(offset)).all()


# --------------------------------------------------------------------------- component checks


def record_component_checks(session: Session, run: Run, checks: list[dict[str, Any]], image: str = "") -> None:
    """One image's checks (image "": the release's own), replacing that image's earlier ones."""
    session.query(ComponentCheck).filter(ComponentCheck.run_id == run.id, ComponentCheck.image == image).delete()
    for check in checks:
        session.add(ComponentCheck(run_id=run.id, image=image, name=check["name"], rule=check["rule"],
                                   expected=check["expected"], actual=check.get("actual"),
                                   ok=bool(check["ok"]), optional=bool(check.get("optional", False)),
                                   detail=check.get("detail", "")))
    session.flush()


def component_checks(session: Session, run_id: int) -> Sequence[ComponentCheck]:
    return session.scalars(select(ComponentCheck).where(ComponentCheck.run_id == run_id)
                           .order_by(ComponentCheck.id)).all()


# --------------------------------------------------------------------------- case results


def record_case_result(session: Session, run_id: int, *, case_id: str, kind: str, model: str | None,
                       variant: str | None, doc: dict[str, Any], attempts: int = 1,
                       queue_wait_s: float | None = None, exec_s: float | None = None,
                       node: str | None = None, fingerprint: dict[str, Any] | None = None) -> CaseResult:
    """Insert the final result of one case; a second result for the same (run, case) is refused."""
    row = CaseResult(run_id=run_id, case_id=case_id, kind=kind, model=model, variant=variant,
                     status=doc["status"], error_class=doc.get("error_class"), error=doc.get("error"),
                     metrics=doc.get("metrics") or {}, samples=doc.get("samples") or {},
                     probes=doc.get("probes") or {}, environment=doc.get("environment") or {},
                     log_tail=(doc.get("log_tail") or "")[-8000:], attempts=attempts,
                     queue_wait_s=queue_wait_s, exec_s=exec_s, node=node, fingerprint=fingerprint)
    try:
        with session.begin_nested():  # a savepoint: a duplicate undoes only this insert
            session.add(row)
            session.flush()
    except IntegrityError as exc:
        if doc.get("status") not in ("passed", "failed", "error"):
            raise
        raise DuplicateResult(f"run {run_id} already has a result for {case_id}") from exc
    return row


def case_results(session: Session, run_id: int) -> Sequence[CaseResult]:
    return session.scalars(select(CaseResult).where(CaseResult.run_id == run_id).order_by(CaseResult.id)).all()


def final_case_ids(session: Session, run_id: int) -> set[str]:
    return set(session.scalars(select(CaseResult.case_id).where(CaseResult.run_id == run_id)))


def results_for_release_case(session: Session, repository: str, tag: str, case_id: str) -> Sequence[CaseResult]:
    """The results of release X for case Y, newest first (one indexed join)."""
    stmt = (select(CaseResult).join(Run, Run.id == CaseResult.run_id).join(Release, Release.id == Run.release_id)
            .where(Release.repository == repository, Release.tag == tag, CaseResult.case_id == case_id)
            .order_by(CaseResult.run_id.desc()))
    return session.scalars(stmt).all()


def recent_exec_seconds(session: Session, repository: str, case_ids: Sequence[str], per_case: int = 5
                        ) -> dict[str, float]:
    """The median execution seconds of each case's newest passed results in this repository's runs (the
    planner's durations); a case without any is absent."""
    stmt = (select(CaseResult.case_id, CaseResult.exec_s).join(Run, Run.id == CaseResult.run_id)
            .join(Release, Release.id == Run.release_id)
            .where(Release.repository == repository, CaseResult.case_id.in_(list(case_ids)),
                   CaseResult.status == "passed", CaseResult.exec_s.is_not(None))
            .order_by(CaseResult.id.desc()))
    seen: dict[str, list[float]] = {}
    for case_id, exec_s in session.execute(stmt):
        if len(seen.setdefault(case_id, [])) < per_case:
            seen[case_id].append(float(exec_s))
    return {case_id: statistics.median(values) for case_id, values in seen.items() if values}


def baseline_run(session: Session, repository: str, previous_tag: str | None) -> Run | None:
    """The previous release's reference run: its newest run (by id) whose LATEST decision (by id) is PASS.

    Nothing else counts: not an older PASS of a run judged FAIL since, not a finished run without a
    PASS, and never an order taken from a client's clock.
    """
    if not previous_tag:
        return None
    release = session.scalar(select(Release).where(Release.repository == repository, Release.tag == previous_tag))
    if release is None:
        return None
    latest = (select(GateDecision.run_id, func.max(GateDecision.id).label("decision_id"))
              .join(Run, Run.id == GateDecision.run_id).where(Run.release_id == release.id)
              .group_by(GateDecision.run_id).subquery())
    return session.scalar(
        select(Run).join(latest, latest.c.run_id == Run.id)
        .join(GateDecision, GateDecision.id == latest.c.decision_id)
        .where(GateDecision.verdict == Verdict.PASS).order_by(Run.id.desc()).limit(1))


# --------------------------------------------------------------------------- gate decisions


def record_decision(session: Session, run: Run, verdict: str, reasons: list[dict[str, Any]],
                    policy_sha256: str, baseline_run_id: int | None) -> GateDecision:
    decision = GateDecision(run_id=run.id, digest=run.candidate_digest, verdict=verdict, reasons=reasons,
                            policy_sha256=policy_sha256, baseline_run_id=baseline_run_id,
                            decided_at=utcnow())
    session.add(decision)
    session.flush()
    return decision


def latest_decision(session: Session, run_id: int) -> GateDecision | None:
    return session.scalar(select(GateDecision).where(GateDecision.run_id == run_id)
                          .order_by(GateDecision.id.desc()).limit(1))


def decisions(session: Session, run_id: int) -> Sequence[GateDecision]:
    return session.scalars(select(GateDecision).where(GateDecision.run_id == run_id)
                           .order_by(GateDecision.id)).all()


def latest_decision_for_digest(session: Session, digest: str) -> GateDecision | None:
    """The newest decision about a digest (one indexed query on (digest, verdict, decided_at))."""
    return session.scalar(select(GateDecision).where(GateDecision.digest == digest)
                          .order_by(GateDecision.id.desc()).limit(1))


def latest_pass_for_digest(session: Session, digest: str) -> GateDecision | None:
    """The latest passing decision for digest D (single indexed query)."""
    return session.scalar(select(GateDecision).where(GateDecision.digest == digest, GateDecision.verdict == Verdict.PASS)
                          .order_by(GateDecision.id.desc()).limit(1))


# --------------------------------------------------------------------------- promotions


def record_promotion(session: Session, decision: GateDecision, *, target_name: str, source_ref: str,
                     source_digest: str, target_ref: str, outcome: str, forced: bool = False,
                     reason: str | None = None, detail: str | None = None,
                     promoted_by: str | None = None) -> Promotion:
    row = Promotion(decision_id=decision.id, run_id=decision.run_id, target_name=target_name,
                    source_ref=source_ref, source_digest=source_digest, target_ref=target_ref,
                    outcome=outcome, forced=forced, reason=reason, detail=detail, promoted_by=promoted_by,
                    created_at=utcnow())
    session.add(row)
    session.flush()
    return row


def promotions(session: Session, run_id: int) -> Sequence[Promotion]:
    return session.scalars(select(Promotion).where(Promotion.run_id == run_id).order_by(Promotion.id)).all()


def heartbeat(session: Session, run: Run, when: dt.datetime | None = None) -> None:
    run.heartbeat_at = when or utcnow()


def run_manifest(run: Run, path: Path | None = None) -> "LoadedManifest":
    """The manifest a run qualified, from the copy stored with it. Waivers are not refused for having
    expired since: the gate judges expiry itself. Raises ManifestError if the stored text is unreadable."""
    from qualify.manifest.load import load_manifest_text  # the manifest model loads when a run is read

    return load_manifest_text(run.manifest_text, str(path) if path else f"run {run.id} manifest", path=path,
                              check_expiry=False)


# --------------------------------------------------------------------------- calibrations


def record_calibration(session: Session, **fields: Any) -> Calibration:
    row = Calibration(**fields)
    session.add(row)
    session.flush()
    return row


def latest_calibrations(session: Session, keys: Sequence[str] | None = None) -> list[Calibration]:
    """The newest calibration of each (fingerprint_key, metric), of the given fingerprint keys (all: None)."""
    stmt = select(Calibration).order_by(Calibration.id.desc())
    if keys is not None:
        stmt = stmt.where(Calibration.fingerprint_key.in_(list(keys)))
    seen: set[tuple[str, str]] = set()
    out: list[Calibration] = []
    for row in session.scalars(stmt):
        if (row.fingerprint_key, row.metric) not in seen:
            seen.add((row.fingerprint_key, row.metric))
            out.append(row)
    return out


def calibrations_for(session: Session, fingerprints: Sequence[Any]) -> dict[str, Any]:
    """The gate's calibrations mapping (qualify.gate.calibration.lookup -> RunVariation) for these fingerprints."""
    from qualify.gate.calibration import key, variation_of

    keys = sorted({key(fp) for fp in fingerprints if fp})
    if not keys:
        return {}
    return {f"{row.fingerprint_key}/{row.metric}": variation_of(row) for row in latest_calibrations(session, keys)}

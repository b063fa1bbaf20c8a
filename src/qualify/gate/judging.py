"""Glue between the database and the pure gate: load a run, evaluate, record the decision.

Decisions are append-only: evaluating a run again adds a decision (repo.record_decision) and
never rewrites an earlier one. The policy is the one stored with the run (its manifest text),
re-read without the expiry check so that a waiver that has expired since the run started is
seen by the gate as expired (and does not cover), instead of making the manifest unreadable.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Callable

from sqlalchemy.orm import Session

from qualify.manifest.cases import expand
from qualify.errors import BadInput
from qualify.gate.checks import ComponentData, ResultData
from qualify.gate.evaluate import Judgement, evaluate
from qualify.manifest import ReleaseManifest
from qualify.manifest.load import ManifestError, policy_sha256
from qualify.store import repo
from qualify.store.models import GateDecision, Run
from qualify.timestamps import iso


class GateError(BadInput):
    """The run cannot be judged (unknown run, unreadable stored manifest)."""


@dataclass
class Evaluation:
    run_id: int
    decision: GateDecision | None  # None for a dry evaluation
    judgement: Judgement
    baseline_run_id: int | None
    manifest: ReleaseManifest


def stored_release(run: Run) -> ReleaseManifest:
    try:
        loaded = repo.run_manifest(run)
    except ManifestError as exc:
        raise GateError("; ".join(str(p) for p in exc.problems)) from None
    return loaded.release


def evaluate_run(session: Session, run_id: int, *, today: dt.date | None = None, record: bool = True) -> Evaluation:
    """Evaluate run_id against its stored policy and the previous release; record the decision
    (flushed, not committed: the caller commits). A decision is recorded only when judged as of today:
    a dry evaluation (record=False) may use another date and is never stored, so it can never be
    the PASS that `gate check` or `promote` trusts."""
    if record and today is not None and today != dt.date.today():
        raise GateError(f"a decision judged as of {today} instead of today cannot be recorded: "
                        "evaluate it dry (--dry-run) to see what that date would give")
    run = repo.get_run(session, run_id)
    if run is None:
        raise GateError(f"no run {run_id}")
    manifest = stored_release(run)
    cases = expand(manifest)
    results = {r.case_id: ResultData.from_row(r) for r in repo.case_results(session, run.id)}
    components = [ComponentData.from_row(c) for c in repo.component_checks(session, run.id)]
    previous = manifest.release.previous_tag
    base_run = repo.baseline_run(session, manifest.release.repository, previous)
    if base_run is not None and base_run.id == run.id:
        base_run = None
    baseline: dict[str, ResultData] | None = None
    label = ""
    if base_run is not None:
        baseline = {r.case_id: ResultData.from_row(r) for r in repo.case_results(session, base_run.id)}
        label = f"run {base_run.id} of {manifest.release.repository}:{previous}"
    elif previous:
        label = (f"{manifest.release.repository}:{previous} has no run whose latest decision is PASS "
                 "(check release.previous_tag and release.repository)")
    calibrations = repo.calibrations_for(session, [r.fingerprint for r in results.values()])
    judgement = evaluate(manifest.gate, cases, results, components, baseline,
                         today=today or dt.date.today(), expected_components=manifest.components,
                         baseline_label=label, previous_named=bool(previous), calibrations=calibrations,
                         image_components={i.name: i.components for i in manifest.images})
    decision = None
    if record:
        decision = repo.record_decision(session, run, judgement.verdict, judgement.reason_dicts(),
                                        policy_sha256(manifest), base_run.id if base_run else None)
    return Evaluation(run.id, decision, judgement, base_run.id if base_run else None, manifest)


def evaluate_and_commit(session_factory: Callable[[], Session], run_id: int, *,
                        today: dt.date | None = None, record: bool = True) -> Evaluation:
    """evaluate_run in its own session, committed (nothing to commit for a dry evaluation)."""
    with session_factory() as session:
        evaluation = evaluate_run(session, run_id, today=today, record=record)
        if record:
            session.commit()
    if record:  # the signed attestation follows every committed decision (never fails the caller)
        from qualify.attest.service import after_decision

        after_decision(session_factory, run_id)
    return evaluation


def decision_dict(decision: GateDecision) -> dict[str, Any]:
    return {"id": decision.id, "run": decision.run_id, "digest": decision.digest, "verdict": decision.verdict,
            "policy_sha256": decision.policy_sha256, "baseline_run_id": decision.baseline_run_id,
            "decided_at": iso(decision.decided_at),
            "reasons": decision.reasons}

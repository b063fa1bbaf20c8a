"""Promotion: copy a qualified candidate, by digest, to every target tag; record each target.

Rules (as kubernetes' image promoter does it):

* Only a run whose LATEST decision is PASS, for the run's candidate digest, is promoted.
* The source is the candidate tag (run.image.repository:run.image.tag) at run.candidate_digest;
  if that tag now resolves to another digest (it moved after qualification) nothing is promoted.
  A tag that no longer exists is refused the same way: the qualified digest cannot be confirmed.
  A run whose image was never pushed to a registry (builder "local") cannot be promoted.
* A destination tag already at the digest is skipped (recorded "skipped"): promotion is idempotent.
  A destination tag at another digest is never moved, unless force=True with a reason; the
  override is recorded (forced=True, reason, and the digest it replaced in detail).
* Targets are independent: one failing target does not undo or hide the others; every target's
  outcome is recorded, and running again completes only what is missing (the promoted ones
  resolve to the digest and are skipped).
* Dry run: resolves (read-only) and returns the plan, outcome "dry-run"; it writes nothing, not
  even to the database.
"""

from __future__ import annotations

import getpass
import os
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable

from sqlalchemy.orm import Session

from qualify.errors import BadInput, ExitCode, Rejected
from qualify.outcomes import Verdict
from qualify.imageref import ImageRef, InvalidReference, parse_reference
from qualify.manifest import ExpandedTarget, ReleaseManifest
from qualify.manifest.load import ManifestError
from qualify.registry import ImageNotFound, RegistryClient, RegistryError, RegistryUnreachable
from qualify.store import repo
from qualify.store.models import GateDecision, Run


class PromotionError(BadInput):
    """The promotion cannot be attempted at all (bad input)."""


class PromotionRefused(Rejected):
    """The run may not be promoted (no PASS decision, moved tag, local image)."""

    def __init__(self, message: str, outcomes: list["TargetOutcome"] | None = None) -> None:
        super().__init__(message)
        self.outcomes = outcomes or []


@dataclass
class TargetOutcome:
    target: str
    target_ref: str
    source_ref: str
    source_digest: str
    outcome: str  # promoted | skipped | failed | refused | dry-run
    detail: str = ""
    forced: bool = False
    previous_digest: str | None = None
    planned: str | None = None  # dry-run: copy | skip | refuse | force-move | unknown

    @property
    def ok(self) -> bool:
        return self.outcome in ("promoted", "skipped", "dry-run")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def default_actor() -> str:
    try:
        return os.environ.get("QUALIFY_ACTOR") or getpass.getuser()
    except Exception:  # noqa: BLE001 - no user name in some containers
        return "unknown"


def _stored_release(run: Run) -> ReleaseManifest:
    try:
        return repo.run_manifest(run).release
    except ManifestError as exc:
        raise PromotionError("; ".join(str(p) for p in exc.problems)) from None


def select_targets(release: ReleaseManifest, target: str | None) -> list[ExpandedTarget]:
    targets = release.expanded_targets()
    if not targets:
        raise PromotionError("the run's manifest has no promotion targets")
    if target is None:
        return targets
    # A name picks one expanded target ("vpc-cn-beijing") or every region of a template ("vpc").
    chosen = [t for t in targets if t.name == target] or [t for t in targets if t.name.startswith(f"{target}-")]
    if not chosen:
        raise PromotionError(f"no promotion target {target!r} (targets: {', '.join(t.name for t in targets)})")
    return chosen


def promote_run(session_factory: Callable[[], Session], run_id: int, *, dry_run: bool = False,
                target: str | None = None, force: bool = False, reason: str | None = None,
                insecure: Iterable[str] = (), actor: str | None = None,
                client: RegistryClient | None = None) -> list[TargetOutcome]:
    """Promote run_id's candidate to its targets; returns one outcome per target.

    Raises PromotionError for bad input (unknown run or target, --force without a reason) and
    PromotionRefused when the run may not be promoted (its outcomes, recorded as "refused" when
    the run has a decision, are attached). Registry failures of single targets are outcomes
    ("failed"), never exceptions.
    """
    if force and not (reason and reason.strip()):
        raise PromotionError("--force needs --reason: an override of a destination tag is recorded with why")
    actor = actor or default_actor()
    with session_factory() as session:
        run = repo.get_run(session, run_id)
        if run is None:
            raise PromotionError(f"no run {run_id}")
        release = _stored_release(run)
        targets = select_targets(release, target)
        image = run.image
        digest = run.candidate_digest
        # The digest's latest decision, whichever run made it: a later FAIL of the same digest wins.
        decision = repo.latest_decision_for_digest(session, digest) if digest else None
        source_ref = f"{image.repository}:{image.tag}" if image is not None and image.tag else (
            image.repository if image is not None else release.candidate_reference)
        insecure_set = set(release.promotion.insecure_registries) | set(insecure)

        def refuse(message: str) -> PromotionRefused:
            outcomes = [TargetOutcome(t.name, t.reference, source_ref, digest or "", "refused", message)
                        for t in targets]
            if decision is not None and not dry_run:
                for o in outcomes:
                    repo.record_promotion(session, decision, target_name=o.target, source_ref=o.source_ref,
                                          source_digest=o.source_digest, target_ref=o.target_ref,
                                          outcome="refused", detail=message, promoted_by=actor)
                session.commit()
            return PromotionRefused(message, outcomes)

        if decision is None:
            raise refuse(f"run {run.id}'s candidate {digest or '(no digest)'} has no gate decision: evaluate it "
                         f"first (qualify gate evaluate {run.id})")
        if decision.verdict != Verdict.PASS:
            raise refuse(f"the latest decision about {digest} (decision {decision.id} of run {decision.run_id}, "
                         f"{decision.decided_at:%Y-%m-%d %H:%M:%S}) is {decision.verdict}, not PASS")
        if not digest or decision.digest != digest:
            raise refuse(f"run {run.id}'s PASS decision is for {decision.digest or 'no digest'}, "
                         f"not the candidate digest {digest or '(none)'}")
        if image is None or image.builder == "local":
            raise refuse(f"run {run.id}'s image was not built into a registry (builder "
                         f"{image.builder if image else 'none'}): there is no registry image to promote; "
                         "build with buildah/podman/docker or use a prebuilt reference")
        if not image.tag:
            raise refuse(f"run {run.id}'s image has no candidate tag to check against the qualified digest")

        own_client = client is None
        client = client or RegistryClient(insecure_set)
        try:
            try:
                src = parse_reference(source_ref)
            except InvalidReference as exc:
                raise refuse(f"the candidate reference is invalid: {exc}") from None
            # The candidate tag must still point at the digest that was qualified.
            try:
                current = client.digest_if_exists(src)
            except RegistryError as exc:
                if dry_run:
                    return [TargetOutcome(t.name, t.reference, source_ref, digest, "dry-run",
                                          f"cannot check the candidate tag: {exc}", planned="unknown")
                            for t in targets]
                outcomes = [TargetOutcome(t.name, t.reference, source_ref, digest, "failed",
                                          f"cannot check the candidate tag: {exc}") for t in targets]
                _record(session, decision, outcomes, actor, reason=None)
                session.commit()
                return outcomes
            if current is None:
                raise refuse(f"candidate tag {source_ref} no longer exists; cannot confirm it is still {digest}")
            if current != digest:
                raise refuse(f"candidate tag {source_ref} moved: it now points to {current}, "
                             f"but {digest} was qualified")
            source = src.with_digest(digest)
            outcomes = []
            for t in targets:
                # Re-checked right before each copy: a FAIL recorded meanwhile stops the remaining targets.
                later = None if dry_run else _overriding_decision(session_factory, digest, decision.id)
                if later is not None:
                    outcomes.append(TargetOutcome(t.name, t.reference, source_ref, digest, "refused",
                                                  f"decision {later.id} (run {later.run_id}) about {digest} is "
                                                  f"{later.verdict}: promotion stopped before this target"))
                    continue
                outcomes.append(_promote_one(client, t, source, source_ref, digest, dry_run=dry_run, force=force))
            if not dry_run:
                _record(session, decision, outcomes, actor, reason=reason)
                session.commit()
            return outcomes
        finally:
            if own_client:
                client.close()


def _overriding_decision(session_factory: Callable[[], Session], digest: str,
                         trusted_id: int) -> GateDecision | None:
    """A decision about the digest newer than the trusted PASS that is not a PASS (read in its own
    transaction, so it sees what other processes committed since the promotion started)."""
    with session_factory() as session:
        latest = repo.latest_decision_for_digest(session, digest)
    if latest is not None and latest.id != trusted_id and latest.verdict != Verdict.PASS:
        return latest
    return None


def _promote_one(client: RegistryClient, target: ExpandedTarget, source: ImageRef, source_ref: str,
                 digest: str, *, dry_run: bool, force: bool) -> TargetOutcome:
    outcome = TargetOutcome(target.name, target.reference, source_ref, digest, "failed")
    try:
        dst = parse_reference(target.reference)
    except InvalidReference as exc:
        outcome.detail = str(exc)
        return outcome
    try:
        existing = client.digest_if_exists(dst)
    except RegistryError as exc:
        if dry_run:
            outcome.outcome, outcome.planned, outcome.detail = "dry-run", "unknown", f"cannot check: {exc}"
        else:
            outcome.detail = str(exc)
        return outcome
    outcome.previous_digest = existing
    if existing == digest:
        if dry_run:
            outcome.outcome, outcome.planned, outcome.detail = "dry-run", "skip", "already at the digest"
        else:
            outcome.outcome, outcome.detail = "skipped", "already at the digest"
        return outcome
    if existing is not None and not force:
        message = (f"{target.reference} points to {existing}, not {digest}: an existing tag is never moved "
                   "without --force --reason")
        if dry_run:
            outcome.outcome, outcome.planned, outcome.detail = "dry-run", "refuse", message
        else:
            outcome.outcome, outcome.detail = "refused", message
        return outcome
    moving = existing is not None
    if dry_run:
        outcome.outcome = "dry-run"
        outcome.planned = "force-move" if moving else "copy"
        outcome.detail = (f"would move from {existing}" if moving else "would copy") + f" {source} -> {target.reference}"
        return outcome
    try:
        result = client.copy(source, dst)
    except RegistryError as exc:
        outcome.detail = str(exc)
        return outcome
    outcome.outcome = "promoted"
    outcome.forced = moving
    outcome.detail = f"copied by {result.method}, target resolves to {result.digest}" + (
        f"; moved from {existing}" if moving else "")
    return outcome


def _record(session: Session, decision: GateDecision, outcomes: list[TargetOutcome], actor: str,
            reason: str | None) -> None:
    for o in outcomes:
        repo.record_promotion(session, decision, target_name=o.target, source_ref=o.source_ref,
                              source_digest=o.source_digest, target_ref=o.target_ref, outcome=o.outcome,
                              forced=o.forced, reason=reason if o.forced else None, detail=o.detail or None,
                              promoted_by=actor)


def exit_code(outcomes: list[TargetOutcome]) -> int:
    """0 when every target is promoted/skipped; 3 when a registry failed; 1 when refused.
    A dry run answers what the real run would: 3 when a registry could not be checked, 1 when a
    target would be refused."""
    if any(o.outcome == "failed" or o.planned == "unknown" for o in outcomes):
        return ExitCode.INFRA
    if any(o.outcome == "refused" or o.planned == "refuse" for o in outcomes):
        return ExitCode.FAIL
    return ExitCode.OK


__all__ = ["TargetOutcome", "promote_run", "PromotionError", "PromotionRefused", "exit_code",
           "select_targets", "RegistryUnreachable", "ImageNotFound"]

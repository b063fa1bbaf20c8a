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
* A release with further images (manifest `images:`) promotes each image to its own targets, all or
  none: every target of every image is checked before anything is copied, and a copy that fails undoes the
  ones this promotion wrote (`_all_or_none`). Their outcomes are named `<image>/<target>`.
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
from qualify.gate.standing import standing_of_run
from qualify.outcomes import Verdict
from qualify.imageref import ImageRef, InvalidReference, parse_reference
from qualify.manifest import ExpandedTarget, ReleaseManifest
from qualify.manifest.load import ManifestError
from qualify.registry import ImageNotFound, RegistryClient, RegistryError, RegistryUnreachable
from qualify.store import repo
from qualify.store.digest_decisions import DecisionRow
from qualify.store.models import GateDecision, Image, Run


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
    chosen = _chosen(targets, target)
    if not chosen:
        raise PromotionError(f"no promotion target {target!r} (targets: {', '.join(t.name for t in targets)})")
    return chosen


def _chosen(targets: list[ExpandedTarget], target: str) -> list[ExpandedTarget]:
    # A name picks one expanded target ("vpc-cn-beijing") or every region of a template ("vpc").
    return [t for t in targets if t.name == target] or [t for t in targets if t.name.startswith(f"{target}-")]


@dataclass
class ImageToPromote:
    """One image of the run and its targets: the release's own (name None), or a further one (`images:`), whose
    outcomes are labelled `<image>/<target>`."""

    name: str | None
    image: Image | None
    digest: str | None
    targets: list[ExpandedTarget]

    def label(self, target: ExpandedTarget) -> str:
        return f"{self.name}/{target.name}" if self.name else target.name

    @property
    def source_ref(self) -> str:
        image = self.image
        if image is None:
            return ""
        return f"{image.repository}:{image.tag}" if image.tag else image.repository


def images_to_promote(session: Session, run: Run, release: ReleaseManifest,
                      target: str | None) -> list[ImageToPromote]:
    """The run's images with their (chosen) targets; an image without targets is not promoted. PromotionError
    when nothing is left to promote."""
    further = {row.name: row for row in repo.run_images(session, run.id)}
    images = [ImageToPromote(None, run.image, run.candidate_digest, release.expanded_targets())]
    for spec in release.images:
        row = further.get(spec.name)
        images.append(ImageToPromote(spec.name, row.image if row else None, row.digest if row else None,
                                     release.for_image(spec.name).expanded_targets()))
    every = [i.label(t) for i in images for t in i.targets]
    if target is not None:
        for item in images:
            item.targets = _chosen(item.targets, target)
    images = [i for i in images if i.targets]
    if not images:
        raise PromotionError(f"no promotion target {target!r} (targets: {', '.join(every)})" if every
                             else "the run's manifest has no promotion targets")
    return images


def promote_run(session_factory: Callable[[], Session], run_id: int, *, dry_run: bool = False,
                target: str | None = None, force: bool = False, reason: str | None = None,
                insecure: Iterable[str] = (), actor: str | None = None,
                client: RegistryClient | None = None) -> list[TargetOutcome]:
    """Promote run_id's images to their targets; returns one outcome per target.

    Raises PromotionError for bad input (unknown run or target, --force without a reason) and
    PromotionRefused when the run may not be promoted (its outcomes, recorded as "refused" when
    the run has a decision, are attached). Registry failures of single targets are outcomes
    ("failed"), never exceptions. A release with further images is promoted all or none (_all_or_none).
    """
    if force and not (reason and reason.strip()):
        raise PromotionError("--force needs --reason: an override of a destination tag is recorded with why")
    actor = actor or default_actor()
    with session_factory() as session:
        run = repo.get_run(session, run_id)
        if run is None:
            raise PromotionError(f"no run {run_id}")
        release = _stored_release(run)
        images = images_to_promote(session, run, release, target)
        digest = run.candidate_digest
        # The run's own latest decision, and only while the run is its release's standing for each digest
        # (qualify.gate.standing): another release's PASS never qualifies it, and re-judging an older run
        # never overrides a newer run of the same release.
        decision = repo.latest_decision(session, run.id)
        insecure_set = set(release.promotion.insecure_registries) | set(insecure)

        def refuse(message: str) -> PromotionRefused:
            outcomes = [TargetOutcome(i.label(t), t.reference, i.source_ref or release.candidate_reference,
                                      i.digest or "", "refused", message) for i in images for t in i.targets]
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
            raise refuse(f"run {run.id}'s latest decision about {digest} (decision {decision.id}, "
                         f"{decision.decided_at:%Y-%m-%d %H:%M:%S}) is {decision.verdict}, not PASS")
        if not digest or decision.digest != digest:
            raise refuse(f"run {run.id}'s PASS decision is for {decision.digest or 'no digest'}, "
                         f"not the candidate digest {digest or '(none)'}")
        for item in images:
            problem = _image_problem(session, run, item)
            if problem:
                raise refuse(problem)

        own_client = client is None
        client = client or RegistryClient(insecure_set)
        try:
            sources: list[ImageRef] = []
            for item in images:
                try:
                    src = parse_reference(item.source_ref)
                except InvalidReference as exc:
                    raise refuse(f"the candidate reference is invalid: {exc}") from None
                # The candidate tag must still point at the digest that was qualified.
                try:
                    current = client.digest_if_exists(src)
                except RegistryError as exc:
                    outcome = "dry-run" if dry_run else "failed"
                    outcomes = [TargetOutcome(i.label(t), t.reference, i.source_ref, i.digest or "", outcome,
                                              f"cannot check the candidate tag {item.source_ref}: {exc}",
                                              planned="unknown" if dry_run else None)
                                for i in images for t in i.targets]
                    if not dry_run:
                        _record(session, decision, outcomes, actor, reason=None)
                        session.commit()
                    return outcomes
                if current is None:
                    raise refuse(f"candidate tag {item.source_ref} no longer exists; cannot confirm it is still "
                                 f"{item.digest}")
                if current != item.digest:
                    raise refuse(f"candidate tag {item.source_ref} moved: it now points to {current}, "
                                 f"but {item.digest} was qualified")
                sources.append(src)
            if len(images) > 1 or release.images:
                outcomes = _all_or_none(session_factory, client, run.id, decision.id, images, sources,
                                        dry_run=dry_run, force=force)
            else:
                outcomes = _each_target(session_factory, client, run.id, decision.id, images[0], sources[0],
                                        dry_run=dry_run, force=force)
            if not dry_run:  # the signed attestations travel with the image (a problem is logged, never fatal)
                from qualify.attest.service import copy_to_targets

                for item, src in zip(images, sources):
                    labels = {item.label(t) for t in item.targets}
                    copy_to_targets(client, src, str(item.digest),
                                    [o.target_ref for o in outcomes if o.ok and o.target in labels])
                _record(session, decision, outcomes, actor, reason=reason)
                session.commit()
            return outcomes
        finally:
            if own_client:
                client.close()


def _image_problem(session: Session, run: Run, item: ImageToPromote) -> str | None:
    """Why this image of the run may not be promoted (None: it may)."""
    what = f"run {run.id}'s image {item.name}" if item.name else f"run {run.id}'s image"
    if item.image is None or not item.digest:
        return f"{what} was never built (the run ended before its images were recorded)"
    standing = standing_of_run(session, run, item.digest)
    if standing is not None and standing.run.id != run.id:
        return (f"run {standing.run.id} of release {standing.release} is newer than run {run.id} and "
                f"judged {item.digest} {standing.decision.verdict} (decision {standing.decision.id}): "
                f"a release's newest run decides; promote run {standing.run.id} if it passed")
    if item.image.builder == "local":
        return (f"{what} was not built into a registry (builder local): there is no registry image to promote; "
                "build with buildah/podman/docker or use a prebuilt reference")
    if not item.image.tag:
        return f"{what} has no candidate tag to check against the qualified digest"
    return None


def _each_target(session_factory: Callable[[], Session], client: RegistryClient, run_id: int, trusted_id: int,
                 item: ImageToPromote, src: ImageRef, *, dry_run: bool, force: bool) -> list[TargetOutcome]:
    """A release of one image: its targets are independent (one failing does not undo the others; running again
    completes what is missing)."""
    digest = str(item.digest)
    source = src.with_digest(digest)
    outcomes = []
    for t in item.targets:
        # Re-checked right before each copy: a FAIL recorded meanwhile stops the remaining targets.
        later = None if dry_run else _overriding_decision(session_factory, run_id, trusted_id)
        if later is not None:
            outcomes.append(TargetOutcome(item.label(t), t.reference, item.source_ref, digest, "refused",
                                          f"decision {later.id} (run {later.run_id}) about {digest} is "
                                          f"{later.verdict}: promotion stopped before this target"))
            continue
        outcome = _promote_one(client, t, source, item.source_ref, digest, dry_run=dry_run, force=force)
        outcome.target = item.label(t)
        outcomes.append(outcome)
    return outcomes


def _all_or_none(session_factory: Callable[[], Session], client: RegistryClient, run_id: int, trusted_id: int,
                 images: list[ImageToPromote], sources: list[ImageRef], *, dry_run: bool,
                 force: bool) -> list[TargetOutcome]:
    """A release of several images is published together or not at all: every target of every image is checked
    first (nothing is copied while one would be refused or cannot be checked), then copied; when a copy fails,
    what this promotion already wrote is undone (a moved tag back to its previous digest, a new tag deleted when
    its digest was not in that repository before) and each outcome says so."""
    planned: list[tuple[ImageToPromote, ExpandedTarget, ImageRef, TargetOutcome]] = []
    for item, src in zip(images, sources):
        source = src.with_digest(str(item.digest))
        for t in item.targets:
            plan = _promote_one(client, t, source, item.source_ref, str(item.digest), dry_run=True, force=force)
            plan.target = item.label(t)
            planned.append((item, t, source, plan))
    plans = [p[3] for p in planned]
    if dry_run:
        return plans
    # Would be refused, or cannot be checked (a registry that does not answer, a target that is no reference).
    blocked = [p for p in plans if p.planned in ("refuse", "unknown") or p.outcome == "failed"]
    if blocked:
        held = f"held back (all or none): {blocked[0].target}: {blocked[0].detail}"
        return [_held(p, p.detail, failed=p.planned != "refuse") if p in blocked else _held(p, held, failed=False)
                for p in plans]
    outcomes: list[TargetOutcome] = []
    written: list[tuple[TargetOutcome, ExpandedTarget, bool]] = []
    for k, (item, t, source, plan) in enumerate(planned):
        later = _overriding_decision(session_factory, run_id, trusted_id)
        if later is not None:
            why = (f"decision {later.id} (run {later.run_id}) about the run's images is {later.verdict}: "
                   "promotion stopped")
            outcome = TargetOutcome(plan.target, t.reference, item.source_ref, str(item.digest), "refused", why)
        else:
            # A new tag is undone by deleting its manifest only when the digest was not in that repository before.
            was_there = plan.previous_digest is not None or _digest_already_there(client, t, str(item.digest))
            outcome = _promote_one(client, t, source, item.source_ref, str(item.digest), dry_run=False,
                                   force=force)
            outcome.target = plan.target
            if outcome.outcome == "promoted":
                written.append((outcome, t, was_there))
        if outcome.ok:
            outcomes.append(outcome)
            continue
        why = f"{outcome.target} did not promote (all or none)"
        for done, target, there in written:
            undone = _undo(client, done, target, there)
            done.outcome, done.detail = "failed", f"{done.detail}; undone ({why}): {undone}"
        return outcomes + [outcome] + [_held(p, f"not attempted: {why}", failed=True) for p in plans[k + 1:]]
    return outcomes


def _held(plan: TargetOutcome, detail: str, *, failed: bool) -> TargetOutcome:
    """A target this promotion did not copy, as an outcome: failed (a registry could not be checked or another
    copy failed) or refused."""
    return TargetOutcome(plan.target, plan.target_ref, plan.source_ref, plan.source_digest,
                         "failed" if failed else "refused", detail, previous_digest=plan.previous_digest)


def _digest_already_there(client: RegistryClient, target: ExpandedTarget, digest: str) -> bool:
    """Whether the target's repository holds the digest before the promotion (then a new tag is never undone by
    deleting the manifest, which would take the repository's other tags of it too). Unknown counts as there."""
    try:
        return client.digest_if_exists(parse_reference(target.reference).with_digest(digest)) is not None
    except (RegistryError, InvalidReference):
        return True


def _undo(client: RegistryClient, outcome: TargetOutcome, target: ExpandedTarget, digest_was_there: bool) -> str:
    """Put a target back as it was before this promotion wrote it; says what was done."""
    dst = parse_reference(target.reference)
    try:
        if outcome.previous_digest:
            client.copy(dst.with_digest(outcome.previous_digest), dst)
            return f"the tag points to {outcome.previous_digest} again"
        if digest_was_there:
            return "the tag is left: its digest was in the repository before, deleting it would take other tags"
        if client.delete_manifest(dst, outcome.source_digest):
            return "the new tag is deleted"
        return "the registry does not allow deleting it: the new tag is left"
    except RegistryError as exc:
        return f"could not be undone: {exc}"


def _overriding_decision(session_factory: Callable[[], Session], run_id: int,
                         trusted_id: int) -> DecisionRow | None:
    """The release's standing for the run's digest when it is no longer the trusted PASS and not a PASS: the
    run re-judged, or a newer run of its release judged (read in its own transaction, so it sees what other
    processes committed since the promotion started)."""
    with session_factory() as session:
        run = repo.get_run(session, run_id)
        standing = standing_of_run(session, run) if run is not None else None
    if standing is not None and standing.decision.id != trusted_id and not standing.passed:
        return standing.decision
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

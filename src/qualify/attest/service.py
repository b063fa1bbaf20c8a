"""Writing attestations: after a decision is committed, and with every promotion.

The attestation of a digest always tells its LATEST decision (as `gate check` answers): it is written when a
decision is recorded (PASS, FAIL or INCOMPLETE; a VSA knows only PASSED and FAILED, so INCOMPLETE is FAILED
there and INCOMPLETE in qualify's predicate), to the candidate's repository and to every repository the digest
was already promoted to, replacing qualify's earlier attestations there. A promotion copies the stored
envelopes (the same signed bytes) to each target.

No key configured: nothing is written, said once per process, never a failure of the run. A registry that
cannot take the attestation is logged as an error; the decision stands (`qualify attest RUN` writes it again).
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Callable, Iterable

from sqlalchemy.orm import Session

from qualify.attest import oci, predicate, statement
from qualify.attest.signing import SigningKey, envelope_bytes, load_signing_key, sign
from qualify.errors import BadInput, QualifyError, Rejected
from qualify.imageref import ImageRef, InvalidReference, parse_reference
from qualify.registry import RegistryClient, RegistryError
from qualify.settings import Settings
from qualify.store import repo
from qualify.store.models import GateDecision, Run, RunImage

LOG = logging.getLogger(__name__)
_SAID: set[str] = set()


def say_once(key: str, message: str) -> None:
    if key not in _SAID:
        _SAID.add(key)
        LOG.warning(message)


class AttestStatus(StrEnum):
    WRITTEN = "written"
    NO_KEY = "no-key"
    NO_REGISTRY_IMAGE = "no-registry-image"
    FAILED = "failed"


@dataclass
class AttestOutcome:
    status: AttestStatus
    detail: str = ""
    written: list[oci.Written] = field(default_factory=list)


def signing_key(settings: Settings) -> SigningKey | None:
    """The key from the settings, or None when none is configured; BadInput when it is configured but unusable."""
    if settings.attest_key:
        return load_signing_key(settings.attest_key.encode(), "QUALIFY_ATTEST_KEY", settings.attest_key_password)
    if settings.attest_key_file:
        try:
            pem = settings.attest_key_file.read_bytes()
        except OSError as exc:
            raise BadInput(f"QUALIFY_ATTEST_KEY_FILE {settings.attest_key_file}: {exc.strerror or exc}") from None
        return load_signing_key(pem, f"QUALIFY_ATTEST_KEY_FILE {settings.attest_key_file}",
                                settings.attest_key_password)
    return None


def _repository(reference: str) -> ImageRef | None:
    try:
        ref = parse_reference(reference)
    except InvalidReference:
        return None
    return ImageRef(ref.registry, ref.repository)


def facts(session: Session, run: Run, decision: GateDecision,
          further: RunImage | None = None) -> predicate.DecisionFacts:
    """What the signed predicate says about the run's candidate, or (`further`) one of its further images: the
    same decision, that image's digest, candidate reference and repositories."""
    from qualify.gate.push_check import qualified_repositories

    loaded = repo.run_manifest(run)
    release = loaded.release
    baseline = repo.get_run(session, decision.baseline_run_id) if decision.baseline_run_id else None
    image = further.image if further is not None else run.image
    candidate = f"{image.repository}:{image.tag}" if image is not None and image.tag else (
        image.repository if image is not None else release.candidate_reference)
    digest = further.digest if further is not None else decision.digest or ""
    baseline_digest = baseline.candidate_digest if baseline is not None else None
    if further is not None:
        baseline_digest = next((r.digest for r in (baseline.further_images if baseline else [])
                                if r.name == further.name), None)
    return predicate.DecisionFacts(
        verdict=decision.verdict, decision_id=decision.id,
        decided_at=decision.decided_at if decision.decided_at.tzinfo else decision.decided_at.replace(
            tzinfo=dt.timezone.utc),
        run_id=run.id, release=f"{run.release.name}:{run.release.tag}", candidate=candidate,
        digest=digest, qualified_repositories=sorted(qualified_repositories(run, digest)),
        manifest_sha256=run.manifest_sha256, policy_sha256=decision.policy_sha256, reasons=decision.reasons or [],
        waivers=[w.model_dump(mode="python") for w in release.gate.waivers],
        fingerprints=[r.fingerprint for r in repo.case_results(session, run.id) if r.fingerprint],
        baseline_digest=baseline_digest)


def envelopes(subject: statement.Subject, facts_: predicate.DecisionFacts,
              key: SigningKey) -> list[tuple[str, bytes]]:
    """The two signed statements about the subject: [(predicate type, DSSE envelope bytes)]."""
    pred = predicate.build(facts_)
    out = []
    for stmt in statement.statements(subject, pred, verified_at=facts_.decided_at):
        out.append((stmt["predicateType"], envelope_bytes(sign(statement.payload(stmt), key))))
    return out


def _destinations(session: Session, run: Run, digest: str, further: RunImage | None = None) -> list[ImageRef]:
    """The image's repository (the candidate's, or a further image's), then every repository this run promoted the
    digest to."""
    refs: list[ImageRef] = []
    image = further.image if further is not None else run.image
    if image is not None:
        found = _repository(image.repository)
        if found:
            refs.append(found)
    for p in repo.promotions(session, run.id):
        if p.source_digest == digest and p.outcome in ("promoted", "skipped"):
            found = _repository(p.target_ref)
            if found and found not in refs:
                refs.append(found)
    return refs


def _insecure(run: Run, settings: Settings) -> set[str]:
    try:
        listed = set(repo.run_manifest(run).release.promotion.insecure_registries)
    except QualifyError:
        listed = set()
    return listed | set(settings.insecure_registries)


def write_for_run(session_factory: Callable[[], Session], run_id: int, *, settings: Settings | None = None,
                  client: RegistryClient | None = None, key: SigningKey | None = None) -> AttestOutcome:
    """Sign and store the attestations of run_id's latest decision (which must be its digest's latest).

    Raises BadInput (unknown run, no decision, an unusable key) and Rejected (a newer decision about the digest
    belongs to another run: its attestation is the one to write); registry failures raise RegistryError."""
    settings = settings or Settings.load()
    key = key or signing_key(settings)
    if key is None:
        return AttestOutcome(AttestStatus.NO_KEY, "no signing key configured (QUALIFY_ATTEST_KEY_FILE or "
                                                  "QUALIFY_ATTEST_KEY): no attestation written")
    with session_factory() as session:
        run = repo.get_run(session, run_id)
        if run is None:
            raise BadInput(f"no run {run_id}")
        decision = repo.latest_decision(session, run.id)
        if decision is None:
            raise BadInput(f"run {run_id} has no gate decision: qualify gate evaluate {run_id}")
        digest = decision.digest or ""
        latest = repo.latest_decision_for_digest(session, digest) if digest else None
        if latest is not None and latest.id != decision.id:
            raise Rejected(f"the latest decision about {digest} is decision {latest.id} of run {latest.run_id}, "
                           f"not run {run_id}'s: attest run {latest.run_id}")
        if not digest or run.image is None or run.image.builder == "local":
            return AttestOutcome(AttestStatus.NO_REGISTRY_IMAGE,
                                 f"run {run_id}'s candidate is not a registry image: nothing to attach an "
                                 "attestation to")
        # The candidate, then each further image of the release (manifest `images:`): one decision, each image
        # attested as itself (its digest, its repositories), where its own tags live.
        todo = [(digest, _destinations(session, run, digest), facts(session, run, decision))]
        todo += [(r.digest, _destinations(session, run, r.digest, r), facts(session, run, decision, r))
                 for r in run.further_images if r.image.builder != "local"]
        facts_ = todo[0][2]
        insecure = _insecure(run, settings)
    own = client is None
    client = client or RegistryClient(insecure)
    written = []
    try:
        for about, destinations, image_facts in todo:
            signed = envelopes(statement.Subject(destinations[0].name, about), image_facts, key)
            written += [oci.write(client, dest, about, signed, replace=statement.PREDICATE_TYPES)
                        for dest in destinations]
    finally:
        if own:
            client.close()
    return AttestOutcome(AttestStatus.WRITTEN, f"decision {facts_.decision_id} ({facts_.verdict}) attested",
                         written)


def after_decision(session_factory: Callable[[], Session], run_id: int) -> AttestOutcome:
    """The hook after a decision is committed: attest it, never failing the caller."""
    try:
        outcome = write_for_run(session_factory, run_id)
    except (RegistryError, QualifyError) as exc:
        LOG.error("run %s: the attestation was not written: %s (qualify attest %s writes it again)",
                  run_id, exc, run_id)
        return AttestOutcome(AttestStatus.FAILED, str(exc))
    if outcome.status == AttestStatus.NO_KEY:
        say_once("no-key", outcome.detail)
    elif outcome.status == AttestStatus.NO_REGISTRY_IMAGE:
        LOG.info(outcome.detail)
    else:
        LOG.info("run %s: %s: %s", run_id, outcome.detail, ", ".join(w.reference for w in outcome.written))
    return outcome


def copy_to_targets(client: RegistryClient, source: ImageRef, digest: str, targets: Iterable[str]) -> list[str]:
    """With a promotion: qualify's stored envelopes about `digest` (the same signed bytes) to every target
    repository. Returns problems (one line per target that could not take them); nothing when there is none."""
    repo_ref = ImageRef(source.registry, source.repository)
    try:
        layers = [layer for layer in oci.read(client, repo_ref, digest)
                  if layer.predicate_type in statement.PREDICATE_TYPES]
    except RegistryError as exc:
        return [f"attestations of {digest} could not be read from {repo_ref.name}: {exc}"]
    if not layers:
        say_once("no-attestation-to-copy", f"{repo_ref.name} holds no qualify attestation about {digest}: "
                                           "promotions carry none (is a signing key configured?)")
        return []
    problems = []
    for target in targets:
        dest = _repository(target)
        if dest is None or dest == repo_ref:
            continue
        try:
            oci.write(client, dest, digest, [(layer.predicate_type, layer.envelope) for layer in layers],
                      replace=statement.PREDICATE_TYPES)
        except RegistryError as exc:
            problems.append(f"attestation not copied to {dest.name}: {exc}")
    for problem in problems:
        LOG.error(problem)
    return problems

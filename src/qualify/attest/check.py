"""Reading an image's attestation back: `qualify verify` and `gate check --attestation`, without the database.

An attestation counts only when its DSSE signature verifies with the given public key, its statement names the
digest being checked as subject, and it was written by qualify (the verifier id). Of the VSAs that count, the
one of the newest decision answers (with replace-on-write there is one). Then the same rules as `gate check`:
PASSED, the reference's repository among those the digest was qualified for (qualify's predicate), and the
release and policy digest when asked; `qualify verify` adds freshness (--max-age).
"""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from securesystemslib.signer import SSlibKey

from qualify.attest import oci, statement
from qualify.attest.predicate import PREDICATE_TYPE, QualificationPredicate
from qualify.attest.signing import EnvelopeInvalid, verify
from qualify.errors import BadInput
from qualify.imageref import ImageRef
from qualify.registry import RegistryClient

VERIFIER_PREFIX = statement.VERIFIER_ID.rsplit("/", 1)[0] + "/"


class Standing(StrEnum):
    QUALIFIED = "QUALIFIED"  # a verified PASSED attestation that meets every requirement
    NOT_QUALIFIED = "NOT_QUALIFIED"  # verified, but FAILED or a requirement is not met
    NO_ATTESTATION = "NO_ATTESTATION"  # nothing qualify signed with this key about this digest


@dataclass
class Attested:
    vsa: dict[str, Any]
    predicate: QualificationPredicate | None
    where: str


@dataclass
class VerifyResult:
    reference: str
    digest: str
    standing: Standing
    result: str | None = None  # PASSED / FAILED
    verdict: str | None = None  # qualify's verdict (PASS / FAIL / INCOMPLETE)
    time_verified: str | None = None
    policy_digest: str | None = None
    release: str | None = None
    run: int | None = None
    decision: int | None = None
    where: str | None = None
    rejected: list[str] = field(default_factory=list)  # layers that did not count, and why
    problems: list[str] = field(default_factory=list)  # requirements a verified attestation does not meet
    reasons: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.standing == Standing.QUALIFIED

    def to_dict(self) -> dict[str, Any]:
        return {"reference": self.reference, "digest": self.digest, "ok": self.ok, "standing": self.standing,
                "verificationResult": self.result, "verdict": self.verdict, "timeVerified": self.time_verified,
                "policyDigest": self.policy_digest, "release": self.release, "run": self.run,
                "decision": self.decision, "attestation": self.where, "problems": self.problems,
                "rejected": self.rejected, "reasons": self.reasons}


_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_age(text: str) -> dt.timedelta:
    match = _AGE.match(text or "")
    if not match:
        raise BadInput(f"--max-age {text!r}: a number and a unit, s m h d or w (e.g. 7d, 12h)")
    return dt.timedelta(seconds=float(match.group(1)) * _UNIT_S[match.group(2)])


def _statement_of(layer: oci.Layer, digest: str, key: SSlibKey) -> dict[str, Any]:
    """The verified statement of one layer; ValueError/EnvelopeInvalid when it does not count."""
    payload = verify(layer.envelope, key)
    stmt = statement.parse(payload)
    if stmt.pb.predicate_type != layer.predicate_type:
        raise ValueError(f"the layer says {layer.predicate_type!r} but the statement {stmt.pb.predicate_type!r}")
    hex_ = digest.split(":", 1)[1]
    if not any(s.digest.get("sha256") == hex_ for s in stmt.pb.subject):
        raise ValueError(f"the statement is about another digest, not {digest}")
    return json.loads(payload)


def collect(layers: list[oci.Layer], digest: str, key: SSlibKey) -> tuple[list[Attested], list[str]]:
    """The verified (VSA, qualify predicate) pairs in the stored order, and why the other layers did not count."""
    vsas: list[tuple[dict[str, Any], str]] = []
    preds: list[QualificationPredicate] = []
    rejected: list[str] = []
    for layer in layers:
        if layer.predicate_type not in statement.PREDICATE_TYPES:
            continue
        try:
            stmt = _statement_of(layer, digest, key)
            if layer.predicate_type == statement.VSA_PREDICATE_TYPE:
                statement.parse_vsa(stmt["predicate"])
                if not str(stmt["predicate"].get("verifier", {}).get("id", "")).startswith(VERIFIER_PREFIX):
                    raise ValueError("the VSA's verifier is not qualify")
                vsas.append((stmt["predicate"], layer.where))
            else:
                preds.append(QualificationPredicate.model_validate(stmt["predicate"]))
        except (EnvelopeInvalid, ValueError) as exc:
            rejected.append(f"{layer.predicate_type} in {layer.where}: {exc}")
    out = []
    for vsa, where in vsas:
        # The pair: qualify's predicate of the same decision (same policy digest and time).
        match = [p for p in preds if p.policy_digest.sha256 == vsa.get("policy", {}).get("digest", {}).get("sha256")
                 and _same_time(p.decided_at, vsa.get("timeVerified"))]
        out.append(Attested(vsa, match[-1] if match else None, where))
    return out, rejected


def _same_time(decided: dt.datetime, verified: Any) -> bool:
    try:
        when = dt.datetime.fromisoformat(str(verified).replace("Z", "+00:00"))
    except ValueError:
        return False
    return abs((decided - when).total_seconds()) < 1.0


def _time(vsa: dict[str, Any]) -> dt.datetime:
    return dt.datetime.fromisoformat(str(vsa.get("timeVerified")).replace("Z", "+00:00"))


def check_reference(client: RegistryClient, ref: ImageRef, digest: str, key: SSlibKey, *,
                    policy_digest: str | None = None, max_age: dt.timedelta | None = None,
                    release_name: str | None = None, now: dt.datetime | None = None) -> VerifyResult:
    out = VerifyResult(reference=str(ref), digest=digest, standing=Standing.NO_ATTESTATION)
    layers = oci.read(client, ImageRef(ref.registry, ref.repository), digest)
    found, out.rejected = collect(layers, digest, key)
    if not found:
        return out
    newest = max(found, key=lambda a: (a.predicate.decision_id if a.predicate else -1, _time(a.vsa)))
    vsa, pred = newest.vsa, newest.predicate
    out.where = newest.where
    out.result = vsa.get("verificationResult")
    out.time_verified = vsa.get("timeVerified")
    out.policy_digest = vsa.get("policy", {}).get("digest", {}).get("sha256")
    if pred is not None:
        out.verdict, out.release, out.run, out.decision = pred.verdict, pred.release, pred.run_id, pred.decision_id
        out.reasons = [c.model_dump(by_alias=True) for c in pred.checks if c.status in ("FAIL", "INCOMPLETE")]
    out.standing = Standing.NOT_QUALIFIED
    if out.result != "PASSED":
        out.problems.append(f"the attestation says {out.result}")
    if pred is None:
        out.problems.append(f"no verified {PREDICATE_TYPE} statement beside the VSA: the repositories the digest "
                            "was qualified for are unknown")
    elif ref.name not in pred.qualified_repositories:
        out.problems.append(f"repository {ref.name} is not where {digest} was qualified "
                            f"(qualified for: {', '.join(pred.qualified_repositories)})")
    if release_name is not None and (out.release or "").split(":")[0] != release_name:
        out.problems.append(f"the attestation is about release {out.release!r}, not {release_name!r}")
    if policy_digest is not None and not (out.policy_digest or "").startswith(policy_digest.removeprefix("sha256:")):
        out.problems.append(f"the attestation names policy {str(out.policy_digest)[:12]}, not {policy_digest}")
    if max_age is not None:
        age = (now or dt.datetime.now(dt.timezone.utc)) - _time(vsa)
        if age > max_age:
            out.problems.append(f"the attestation is {age.total_seconds() / 86400:.1f} days old, more than "
                                f"--max-age {max_age.total_seconds() / 86400:g} days")
    if not out.problems:
        out.standing = Standing.QUALIFIED
    return out

"""The two in-toto Statements about a judged digest, built with the in-toto-attestation library's models.

1. A SLSA Verification Summary (VSA v1): the small thing admission policies check (`verificationResult`,
   `policy.digest`). Built as the library's `VerificationSummary` protobuf, so a field the model does not
   know cannot be written.
2. qualify's predicate (qualify.attest.predicate) with the evidence.

Both are validated by the library (`Statement.validate`) before they are signed.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from typing import Any

import google.protobuf.json_format as pb_json
from in_toto_attestation.predicates.vsa.v1 import vsa_pb2
from in_toto_attestation.v1.resource_descriptor import ResourceDescriptor
from in_toto_attestation.v1.statement import STATEMENT_TYPE_URI, Statement

import qualify
from qualify.attest.predicate import PREDICATE_TYPE, QualificationPredicate

VSA_PREDICATE_TYPE = "https://slsa.dev/verification_summary/v1"
VERIFIER_ID = f"https://qualify.dev/verifier/qualify/{qualify.__version__}"
# SLSA lets a verifier name its own levels (never with the SLSA_ prefix); FAILED is the spec's own value.
PASSED_LEVEL = "RELEASE_QUALIFIED"
PREDICATE_TYPES = (VSA_PREDICATE_TYPE, PREDICATE_TYPE)


@dataclass(frozen=True)
class Subject:
    name: str  # repository the image was qualified in (host/path)
    digest: str  # sha256:<hex>

    @property
    def hex(self) -> str:
        return self.digest.split(":", 1)[1]

    @property
    def reference(self) -> str:
        return f"{self.name}@{self.digest}"


def policy_uri(release: str) -> str:
    """Where the policy lives: the gate section of the release's manifest (its digest pins which one)."""
    return f"https://qualify.dev/policy/gate?release={release}"


def vsa(subject: Subject, predicate: QualificationPredicate, *, verified_at: dt.datetime) -> dict[str, Any]:
    passed = predicate.verdict == "PASS"
    summary = vsa_pb2.VerificationSummary()
    summary.verifier.id = VERIFIER_ID
    summary.time_verified.FromDatetime(verified_at.astimezone(dt.timezone.utc).replace(microsecond=0))
    summary.resource_uri = subject.reference
    summary.policy.uri = policy_uri(predicate.release)
    summary.policy.digest["sha256"] = predicate.policy_digest.sha256
    summary.verification_result = "PASSED" if passed else "FAILED"
    summary.slsa_version = "1.0"
    out = pb_json.MessageToDict(summary)
    # The SLSA spec's verifiedLevels is an array; in-toto-attestation 0.9.3's model declares a single string.
    # The spec text is the canonical definition (SLSA v1.1), so the array is written and parse_vsa checks it.
    out["verifiedLevels"] = [PASSED_LEVEL if passed else "FAILED"]
    return out


def statement(subject: Subject, predicate_type: str, predicate: dict[str, Any]) -> dict[str, Any]:
    """An in-toto v1 Statement, validated by the library, as a plain dict."""
    rd = ResourceDescriptor(name=subject.name, digest={"sha256": subject.hex})
    Statement([rd.pb], predicate_type, predicate).validate()
    # Written as built, not as the protobuf re-serialises it (a Struct turns every integer into a float).
    return {"_type": STATEMENT_TYPE_URI, "subject": [{"name": subject.name, "digest": {"sha256": subject.hex}}],
            "predicateType": predicate_type, "predicate": predicate}


def statements(subject: Subject, predicate: QualificationPredicate, *,
               verified_at: dt.datetime) -> list[dict[str, Any]]:
    return [statement(subject, VSA_PREDICATE_TYPE, vsa(subject, predicate, verified_at=verified_at)),
            statement(subject, PREDICATE_TYPE, predicate.to_json_dict())]


def payload(stmt: dict[str, Any]) -> bytes:
    """The bytes that get signed (compact, key order as built)."""
    return json.dumps(stmt, separators=(",", ":")).encode()


def parse(payload_bytes: bytes) -> Statement:
    """A signed payload back into the library's Statement (unknown fields refused), validated."""
    from in_toto_attestation.v1 import statement_pb2

    proto = pb_json.Parse(payload_bytes, statement_pb2.Statement())
    stmt = Statement.copy_from_pb(proto)
    stmt.validate()
    if stmt.pb.type != STATEMENT_TYPE_URI:
        raise ValueError(f"statement type {stmt.pb.type!r}")
    return stmt


def parse_vsa(predicate: dict[str, Any]) -> vsa_pb2.VerificationSummary:
    """A VSA predicate read with the library's model (unknown fields refused); verifiedLevels, which the model
    gets wrong (see vsa()), must be a list of strings."""
    rest = dict(predicate)
    levels = rest.pop("verifiedLevels", None)
    if not isinstance(levels, list) or not all(isinstance(x, str) for x in levels):
        raise ValueError(f"verifiedLevels must be a list of strings, not {levels!r}")
    return pb_json.ParseDict(rest, vsa_pb2.VerificationSummary())

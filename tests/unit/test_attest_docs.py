"""The admission examples in docs/attestations/ are tied to what qualify writes: their predicate types are ours
and every field path their conditions read exists in the statements qualify signs."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from typing import Any

import yaml

from qualify.attest import predicate, statement

DOCS = Path(__file__).resolve().parents[2] / "docs"
NOW = dt.datetime(2026, 11, 30, tzinfo=dt.timezone.utc)


def written() -> dict[str, dict[str, Any]]:
    """The statements qualify writes for a PASS decision, by predicate type."""
    facts = predicate.DecisionFacts(
        verdict="PASS", decision_id=1, decided_at=NOW, run_id=1, release="demo:1.1", candidate="r/demo:1",
        digest="sha256:" + "a" * 64, qualified_repositories=["r/demo"], manifest_sha256="1" * 64,
        policy_sha256="2" * 64, reasons=[], waivers=[], fingerprints=[])
    subject = statement.Subject("r/demo", "sha256:" + "a" * 64)
    return {s["predicateType"]: s for s in statement.statements(subject, predicate.build(facts), verified_at=NOW)}


def lookup(doc: dict[str, Any], path: list[str]) -> Any:
    for part in path:
        assert isinstance(doc, dict) and part in doc, f"{'.'.join(path)}: no {part!r} in what qualify writes"
        doc = doc[part]
    return doc


def test_the_kyverno_policy_checks_fields_qualify_writes() -> None:
    policy = yaml.safe_load((DOCS / "attestations" / "kyverno-clusterpolicy.yaml").read_text())
    assert policy["kind"] == "ClusterPolicy" and policy["apiVersion"] == "kyverno.io/v1"
    attestations = [a for rule in policy["spec"]["rules"] for v in rule["verifyImages"] for a in v["attestations"]]
    stmts = written()
    assert [a["type"] for a in attestations] == [statement.VSA_PREDICATE_TYPE, predicate.PREDICATE_TYPE]
    keys_read = []
    for attestation in attestations:
        body = stmts[attestation["type"]]["predicate"]
        for condition in (c for block in attestation["conditions"] for c in block["all"]):
            path = re.fullmatch(r"\{\{\s*([\w.]+)\s*\}\}", condition["key"]).group(1).split(".")
            keys_read.append(".".join(path))
            value = lookup(body, path)
            expected = str(condition["value"])
            if not expected.startswith("REPLACE"):  # placeholders stand for the user's own policy digest
                assert re.fullmatch(expected.replace("*", ".*"), str(value)), (path, value, expected)
    assert {"verificationResult", "policy.digest.sha256"} <= set(keys_read)


def test_the_policy_controller_policy_checks_fields_qualify_writes() -> None:
    cip = yaml.safe_load((DOCS / "attestations" / "policy-controller-clusterimagepolicy.yaml").read_text())
    assert cip["kind"] == "ClusterImagePolicy" and cip["apiVersion"] == "policy.sigstore.dev/v1beta1"
    (attestation,) = [a for authority in cip["spec"]["authorities"] for a in authority["attestations"]]
    assert attestation["predicateType"] == statement.VSA_PREDICATE_TYPE
    stmt = written()[statement.VSA_PREDICATE_TYPE]
    cue = attestation["policy"]["data"]
    checked = []
    for line in cue.strip().splitlines():  # `a: b: c: "value"` lines: a path into the statement and its value
        match = re.fullmatch(r"(.*?):\s*\"(.*)\"", line.strip())
        assert match, line
        path = [p.strip() for p in match.group(1).split(":")]
        checked.append(".".join(path))
        found = lookup(stmt, path)
        if not match.group(2).startswith("REPLACE"):
            assert found == match.group(2), (path, found)
    assert {"predicateType", "predicate.verificationResult", "predicate.policy.digest.sha256"} <= set(checked)


def test_the_docs_name_the_predicate_types() -> None:
    text = (DOCS / "ATTESTATIONS.md").read_text()
    assert predicate.PREDICATE_TYPE in text and statement.VSA_PREDICATE_TYPE in text
    for field in predicate.QualificationPredicate.model_json_schema(by_alias=True)["properties"]:
        assert f"`{field}" in text, f"docs/ATTESTATIONS.md does not explain {field}"

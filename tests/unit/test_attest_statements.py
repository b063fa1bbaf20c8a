"""qualify.attest without a registry: the statements, both predicates and the envelope validate against the
in-toto-attestation and securesystemslib models; signatures fail with another key or a changed byte; the
stored layout is cosign's; keys and ages are refused with one clear line."""

from __future__ import annotations

import base64
import datetime as dt
import json

import google.protobuf.json_format as pb_json
import pytest
from in_toto_attestation.v1 import statement_pb2
from in_toto_attestation.v1.statement import Statement
from securesystemslib.dsse import Envelope
from securesystemslib.signer import SSlibKey
from support.attest import private_key, private_pem

from qualify.attest import oci, predicate, signing, statement
from qualify.attest.check import collect, parse_age
from qualify.errors import BadInput

DIGEST = "sha256:" + "ab" * 32
NOW = dt.datetime(2026, 11, 30, 12, 0, 0, 123456, tzinfo=dt.timezone.utc)

REGRESSION_HISTORY = {"check": "regression", "case_id": "train/tiny/base", "status": "PASS",
                      "message": "train/tiny/base: tokens_per_s ...",
                      "figures": {"metric": "tokens_per_s", "ratio": 0.97, "tolerance": 0.05, "n_candidate": 3,
                                  "n_baseline": 3, "method": "welch-log"}}
REGRESSION_PAIRED = {"check": "regression", "case_id": "train/tiny/compile", "status": "FAIL", "message": "m",
                     "figures": {"metric": "tokens_per_s", "ratio": 0.8, "tolerance": 0.05, "n_candidate": 4,
                                 "n_baseline": 4, "method": "paired-t-log", "baseline": "sha256:" + "cd" * 32,
                                 "baseline_samples": [1.0, 1.0, 1.0, 1.0]}}
# the duet interval as gate/duet_stats stores it: the throughput's relative change, positive = the candidate better
# (the record names the image as the runner describes it: the digest is read out of it)
REGRESSION_DUET = {"check": "regression", "case_id": "train/tiny/duet", "status": "PASS", "message": "m",
                   "figures": {"metric": "tokens_per_s", "design": "duet", "estimate": -0.01, "lower": -0.04,
                               "upper": 0.02, "n": 6, "max_regression": 0.05,
                               "baseline": "127.0.0.1:5000/q/demo:1.0@sha256:" + "12" * 32}}
# the non-inferiority rule's figures: change and its worst/best ends, positive = better
REGRESSION_NONINF = {"check": "regression", "case_id": "infer/tq/none", "status": "INCOMPLETE", "message": "m",
                     "figures": {"metric": "latency_s_p90", "direction": "lower", "design": "history-runs",
                                 "change": 0.01, "change_worst": -0.08, "change_best": 0.1, "max_regression": 0.05,
                                 "n_candidate": 3, "n_baseline": 3}}
THRESHOLD = {"check": "threshold:latency_s_p90", "case_id": "infer/tq/w8a8", "status": "PASS", "message": "m",
             "figures": {"metric": "latency_s_p90", "min": None, "max": 2.0, "value": 0.5}}


def facts(verdict: str = "PASS", reasons=None) -> predicate.DecisionFacts:
    return predicate.DecisionFacts(
        verdict=verdict, decision_id=7, decided_at=NOW, run_id=3, release="demo:1.1",
        candidate="127.0.0.1:5000/q/demo:1.1-rc1", digest=DIGEST,
        qualified_repositories=["127.0.0.1:5000/q/demo", "127.0.0.1:5000/pub/demo"], manifest_sha256="1" * 64,
        policy_sha256="2" * 64,
        reasons=reasons if reasons is not None else [REGRESSION_HISTORY, REGRESSION_PAIRED, REGRESSION_DUET,
                                                      REGRESSION_NONINF, THRESHOLD],
        waivers=[{"id": "KI-1", "cases": "infer/*", "check": "probe:prefix_cache", "reason": "known issue",
                  "expires": dt.date(2026, 12, 31)}],
        fingerprints=[{"device": "cpu", "world_size": 1, "resources.cpus": 2}, {"device": "cpu", "world_size": 1}],
        baseline_digest="sha256:" + "ef" * 32)


SUBJECT = statement.Subject("127.0.0.1:5000/q/demo", DIGEST)


def statements(verdict: str = "PASS") -> list[dict]:
    return statement.statements(SUBJECT, predicate.build(facts(verdict)), verified_at=NOW)


def signer(kind: str = "ecdsa") -> tuple[signing.SigningKey, SSlibKey]:
    key = private_key(kind)
    return signing.load_signing_key(private_pem(key), "test"), SSlibKey.from_crypto(key.public_key())


def test_statements_validate_against_the_in_toto_models() -> None:
    for stmt in statements():
        proto = pb_json.ParseDict(stmt, statement_pb2.Statement())  # unknown fields refused
        Statement.copy_from_pb(proto).validate()
        assert proto.subject[0].digest["sha256"] == "ab" * 32 and proto.subject[0].name == SUBJECT.name
        assert statement.parse(statement.payload(stmt)).pb.predicate_type == stmt["predicateType"]
    vsa_stmt, ours = statements()
    assert vsa_stmt["predicateType"] == "https://slsa.dev/verification_summary/v1"
    assert ours["predicateType"] == predicate.PREDICATE_TYPE == "https://qualify.dev/attestation/qualification/v1"


def test_the_vsa_validates_against_the_library_model_and_says_the_verdict() -> None:
    passed = statement.parse_vsa(statements("PASS")[0]["predicate"])
    assert passed.verification_result == "PASSED" and passed.policy.digest["sha256"] == "2" * 64
    assert passed.verifier.id.startswith("https://qualify.dev/verifier/qualify/")
    assert passed.resource_uri == f"{SUBJECT.name}@{DIGEST}"
    assert passed.time_verified.ToDatetime(tzinfo=dt.timezone.utc) == NOW.replace(microsecond=0)
    for verdict in ("FAIL", "INCOMPLETE"):
        vsa = statements(verdict)[0]["predicate"]
        assert statement.parse_vsa(vsa).verification_result == "FAILED" and vsa["verifiedLevels"] == ["FAILED"]
    assert statements("PASS")[0]["predicate"]["verifiedLevels"] == ["RELEASE_QUALIFIED"]
    with pytest.raises(pb_json.ParseError):
        statement.parse_vsa({**statements()[0]["predicate"], "verdict": "PASS"})
    with pytest.raises(ValueError, match="verifiedLevels"):
        statement.parse_vsa({**statements()[0]["predicate"], "verifiedLevels": "FAILED"})


def test_our_predicate_round_trips_through_its_model_and_carries_the_evidence() -> None:
    body = statements()[1]["predicate"]
    model = predicate.QualificationPredicate.model_validate(body)
    assert model.to_json_dict() == body
    assert body["verdict"] == "PASS" and body["decisionId"] == 7 and body["runId"] == 3
    assert body["manifestDigest"] == {"sha256": "1" * 64} and body["policyDigest"] == {"sha256": "2" * 64}
    assert body["waivers"] == [{"id": "KI-1", "cases": "infer/*", "check": "probe:prefix_cache",
                                "reason": "known issue", "expires": "2026-12-31"}]
    assert [c["caseId"] for c in body["checks"]] == ["train/tiny/base", "train/tiny/compile", "train/tiny/duet",
                                                      "infer/tq/none", "infer/tq/w8a8"]
    by_case = {c["caseId"]: c for c in body["comparisons"]}
    history, paired, duet, noninf, threshold = (by_case[k] for k in (
        "train/tiny/base", "train/tiny/compile", "train/tiny/duet", "infer/tq/none", "infer/tq/w8a8"))
    assert history["design"] == "history" and history["baselineDigest"] == "sha256:" + "ef" * 32
    assert history["change"] == pytest.approx(-0.03) and history["margin"] == 0.05 and history["interval"] is None
    assert paired["design"] == "paired" and paired["baselineDigest"] == "sha256:" + "cd" * 32
    assert paired["nCandidate"] == 4 and paired["status"] == "FAIL"
    # A duet 1% slower is attested 1% slower (the sign is the gate's: it was once flipped here), its worst end -4%.
    assert duet["design"] == "duet" and duet["change"] == pytest.approx(-0.01) and duet["margin"] == 0.05
    assert duet["interval"] == pytest.approx([-0.04, 0.02]) and duet["baselineDigest"] == "sha256:" + "12" * 32
    assert noninf["design"] == "history" and noninf["change"] == 0.01 and noninf["interval"] == [-0.08, 0.1]
    assert noninf["margin"] == 0.05 and noninf["status"] == "INCOMPLETE"
    assert threshold["design"] == "threshold" and threshold["value"] == 0.5 and threshold["bound"] == 2.0
    # the hardware fingerprint: the distinct hardware, hashed; the same set in another order hashes the same
    assert len(body["hardware"]) == 2
    again = predicate.hardware(list(reversed(facts().fingerprints)))[1]
    assert body["hardwareFingerprint"]["sha256"] == again
    with pytest.raises(Exception):
        predicate.QualificationPredicate.model_validate({**body, "surprise": 1})


@pytest.mark.parametrize("kind", ["ecdsa", "ed25519"])
def test_the_envelope_is_dsse_and_verifies_only_with_its_key_and_bytes(kind: str) -> None:
    key, public = signer(kind)
    payload = statement.payload(statements()[0])
    envelope = signing.sign(payload, key)
    # securesystemslib's own model reads it and verifies it with the public key
    parsed = Envelope.from_dict(json.loads(json.dumps(envelope)))
    assert parsed.payload_type == "application/vnd.in-toto+json" and parsed.payload == payload
    assert parsed.verify([public], 1)
    assert signing.verify(signing.envelope_bytes(envelope), public) == payload
    _, other = signer(kind)
    with pytest.raises(signing.EnvelopeInvalid, match="no signature verifies"):
        signing.verify(signing.envelope_bytes(envelope), other)
    changed = payload.replace(b'"PASSED"', b'"PASSEE"')
    assert changed != payload
    tampered = {**envelope, "payload": base64.b64encode(changed).decode()}
    with pytest.raises(signing.EnvelopeInvalid):
        signing.verify(signing.envelope_bytes(tampered), public)
    with pytest.raises(signing.EnvelopeInvalid, match="not a DSSE envelope"):
        signing.verify(b"{}", public)


def test_collect_counts_only_verified_statements_about_the_digest() -> None:
    key, public = signer()
    layers = [oci.Layer(s["predicateType"], signing.envelope_bytes(signing.sign(statement.payload(s), key)), "t")
              for s in statements()]
    found, rejected = collect(layers, DIGEST, public)
    assert rejected == [] and len(found) == 1 and found[0].predicate is not None
    assert found[0].vsa["verificationResult"] == "PASSED" and found[0].predicate.decision_id == 7
    found, rejected = collect(layers, "sha256:" + "00" * 32, public)
    assert found == [] and all("another digest" in r for r in rejected)
    swapped = [oci.Layer(statement.VSA_PREDICATE_TYPE, layers[1].envelope, "t")]
    found, rejected = collect(swapped, DIGEST, public)
    assert found == [] and "the statement" in rejected[0]


def test_the_stored_layout_is_cosigns() -> None:
    layers = [oci.envelope_layer(t, f"envelope {t}".encode()) for t in statement.PREDICATE_TYPES]
    manifest, config = oci.build_manifest(layers)
    doc = manifest.json()
    assert doc["schemaVersion"] == 2 and doc["mediaType"] == manifest.media_type == (
        "application/vnd.oci.image.manifest.v1+json")
    assert doc["config"]["mediaType"] == "application/vnd.oci.image.config.v1+json"
    assert [layer["mediaType"] for layer in doc["layers"]] == ["application/vnd.dsse.envelope.v1+json"] * 2
    assert [layer["annotations"] for layer in doc["layers"]] == [
        {"dev.cosignproject.cosign/signature": "", "predicateType": t} for t in statement.PREDICATE_TYPES]
    assert json.loads(config)["rootfs"] == {"type": "layers", "diff_ids": [d["digest"] for d in doc["layers"]]}
    assert "subject" not in doc
    with_subject, _ = oci.build_manifest(layers, subject={"mediaType": "m", "size": 1, "digest": DIGEST})
    assert with_subject.json()["subject"]["digest"] == DIGEST
    assert oci.att_tag(DIGEST) == "sha256-" + "ab" * 32 + ".att"


def test_unusable_keys_and_ages_are_bad_input(tmp_path) -> None:
    from cryptography.hazmat.primitives.asymmetric import ec

    with pytest.raises(BadInput, match="P-256"):
        signing.load_signing_key(private_pem(ec.generate_private_key(ec.SECP384R1())), "QUALIFY_ATTEST_KEY")
    with pytest.raises(BadInput, match="QUALIFY_ATTEST_KEY_FILE x: not a usable PEM private key"):
        signing.load_signing_key(b"nonsense", "QUALIFY_ATTEST_KEY_FILE x")
    bad = tmp_path / "k.pub"
    bad.write_text("nonsense")
    with pytest.raises(BadInput, match="not a PEM public key"):
        signing.load_public_key(bad)
    assert parse_age("7d") == dt.timedelta(days=7) and parse_age("12h") == dt.timedelta(hours=12)
    for text in ("", "7", "d7", "-1d", "1y"):
        with pytest.raises(BadInput, match="--max-age"):
            parse_age(text)


def test_settings_hide_the_key() -> None:
    from qualify.settings import Settings

    pem = private_pem(private_key()).decode()
    settings = Settings.load(env={"QUALIFY_ATTEST_KEY": pem, "QUALIFY_ATTEST_KEY_PASSWORD": "hunter2",
                                  "QUALIFY_ATTEST_KEY_FILE": "~/k.pem"})
    assert "PRIVATE KEY" not in repr(settings) and "hunter2" not in repr(settings)
    assert settings.attest_key_file is not None and "~" not in str(settings.attest_key_file)
    from qualify.executors.environment import withheld

    assert all(withheld(v) for v in ("QUALIFY_ATTEST_KEY", "QUALIFY_ATTEST_KEY_FILE", "QUALIFY_ATTEST_KEY_PASSWORD"))


def test_a_reference_comparison_is_attested_with_the_reference_image_and_the_gain_required() -> None:
    """gate.reference's line: the image compared with is the reference (never the previous release's run), and the
    margin is the required gain, negative."""
    reference = {"check": "reference", "case_id": "reference/train/tiny/base", "status": "PASS", "message": "m",
                 "figures": {"metric": "tokens_per_s", "design": "paired-t", "change": 0.2, "change_worst": 0.17,
                             "change_best": 0.23, "max_regression": -0.15, "n": 4, "baseline": "local interpreter",
                             "required_change": 0.15,
                             "reference_image": "127.0.0.1:5000/std/p@sha256:" + "9a" * 32}}
    body = predicate.build(facts(reasons=[reference])).to_json_dict()
    [line] = body["comparisons"]
    assert line["check"] == "reference" and line["baselineDigest"] == "sha256:" + "9a" * 32
    assert line["change"] == pytest.approx(0.2) and line["interval"] == pytest.approx([0.17, 0.23])
    assert line["margin"] == pytest.approx(-0.15)

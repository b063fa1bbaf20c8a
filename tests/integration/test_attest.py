"""Signed attestations with the real Distribution registry (docker-registry: no referrers API, so the cosign
`sha256-<hex>.att` tag scheme) and the real database: written after a decision, copied with promotions,
verified by `qualify verify` and `gate check --attestation` through the real entry point."""

from __future__ import annotations

import base64
import json
import logging
import uuid

import pytest
from support.attest import key_pair
from support.cli import run_cli
from support.gate import good_doc, manifest_text, seed_run
from support.registry import RegistryProcess

from qualify.attest import oci, statement
from qualify.attest.check import collect
from qualify.attest.service import after_decision, write_for_run
from qualify.attest.signing import load_public_key
from qualify.manifest.cases import expand
from qualify.gate.judging import evaluate_and_commit
from qualify.imageref import ImageRef
from qualify.manifest.load import load_manifest_text
from qualify.promote import promote_run
from qualify.registry import RegistryClient
from qualify.store import repo

pytestmark = pytest.mark.registry


@pytest.fixture
def keys(tmp_path, monkeypatch):
    private, public = key_pair(tmp_path / "keys")
    monkeypatch.setenv("QUALIFY_ATTEST_KEY_FILE", str(private))
    monkeypatch.delenv("QUALIFY_ATTEST_KEY", raising=False)
    return private, public


def _broken_docs(text: str) -> dict:
    docs = {c.case_id: good_doc(c) for c in expand(load_manifest_text(text, check_expiry=False).release)}
    docs["train/tiny/base"] = {**docs["train/tiny/base"], "status": "error", "error_class": "crash",
                               "error": "segfault"}
    return docs


class Release:
    """A first release on `registry` (candidate pushed, run seeded and judged) with three promotion targets."""

    def __init__(self, sessions, registry: RegistryProcess, make_image, *, broken: bool = False,
                 evaluate: bool = True) -> None:
        self.ns = "a" + uuid.uuid4().hex[:8]
        self.registry = registry
        self.repository = registry.ref(f"{self.ns}/demo")
        self.text = manifest_text(
            release_extra={"repository": self.repository, "previous_tag": None},
            promotion={"targets": [
                {"name": "public", "reference": registry.ref(f"{self.ns}/public/demo", "1.1")},
                {"name": "vpc", "template": f"{registry.host}/{self.ns}/vpc-{{region-id}}/{{image:tag}}",
                 "regions": ["cn-beijing", "cn-shanghai"]}],
                "insecure_registries": [registry.host]})
        self.digest = make_image(registry, f"{self.ns}/demo", "1.1-rc1")
        with sessions() as s:
            self.run_id = seed_run(s, self.text, digest=self.digest,
                                   docs=_broken_docs(self.text) if broken else None).id
            s.commit()
        if evaluate:
            self.verdict = evaluate_and_commit(sessions, self.run_id).judgement.verdict

    @property
    def candidate(self) -> str:
        return self.registry.ref(f"{self.ns}/demo", "1.1-rc1")

    def targets(self) -> list[str]:
        return [self.registry.ref(f"{self.ns}/{path}/demo", "1.1")
                for path in ("public", "vpc-cn-beijing", "vpc-cn-shanghai")]


def _repo(reference: str) -> ImageRef:
    from qualify.imageref import parse_reference

    ref = parse_reference(reference)
    return ImageRef(ref.registry, ref.repository)


def _layers(registry: RegistryProcess, reference: str, digest: str) -> list[oci.Layer]:
    with RegistryClient([registry.host]) as client:
        return oci.read(client, _repo(reference), digest)


def _verify(reference: str, public, registry: RegistryProcess, *extra: str):
    return run_cli("verify", reference, "--key", str(public), "--insecure-registry", registry.host, *extra)


def test_pass_then_promotion_is_attested_everywhere_and_verifies(sessions, registry, make_image, keys):
    _, public = keys
    rel = Release(sessions, registry, make_image)
    assert rel.verdict == "PASS"
    layers = _layers(registry, rel.candidate, rel.digest)
    assert [layer.predicate_type for layer in layers] == list(statement.PREDICATE_TYPES)
    # cosign's layout: an OCI image manifest under sha256-<hex>.att, DSSE layers annotated with predicateType
    with RegistryClient([registry.host]) as client:
        manifest = client.get_manifest(_repo(rel.candidate).with_tag(oci.att_tag(rel.digest))).json()
    assert manifest["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert {layer["mediaType"] for layer in manifest["layers"]} == {"application/vnd.dsse.envelope.v1+json"}
    assert [layer["annotations"]["predicateType"] for layer in manifest["layers"]] == list(statement.PREDICATE_TYPES)

    outcomes = promote_run(sessions, rel.run_id, actor="tester")
    assert {o.outcome for o in outcomes} == {"promoted"}
    for target in rel.targets():
        copied = _layers(registry, target, rel.digest)
        assert [c.envelope for c in copied] == [layer.envelope for layer in layers], target  # the same signed bytes
    for reference in [rel.candidate, *rel.targets()]:
        proc = _verify(reference, public, registry)
        assert proc.returncode == 0, (reference, proc.stdout, proc.stderr)
        assert proc.stdout.startswith("PASS:") and rel.digest in proc.stdout
    policy = load_manifest_text(rel.text, check_expiry=False).policy_sha256
    assert _verify(rel.candidate, public, registry, "--policy-digest", policy[:16], "--max-age", "7d").returncode == 0
    wrong_policy = _verify(rel.candidate, public, registry, "--policy-digest", "0" * 16)
    assert wrong_policy.returncode == 1 and "policy" in wrong_policy.stdout


def test_another_key_a_changed_byte_or_another_digest_does_not_verify(sessions, registry, make_image, keys, tmp_path):
    _, public = keys
    rel = Release(sessions, registry, make_image)
    _, other_public = key_pair(tmp_path / "other", "other")
    proc = _verify(rel.candidate, other_public, registry)
    assert proc.returncode == 1 and proc.stdout.startswith("NO ATTESTATION"), proc.stdout + proc.stderr
    assert "no signature verifies" in proc.stdout

    # another digest: the same attestation manifest put under a second image's .att tag
    other_digest = make_image(registry, f"{rel.ns}/demo", "other")
    with RegistryClient([registry.host]) as client:
        att = client.get_manifest(_repo(rel.candidate).with_tag(oci.att_tag(rel.digest)))
        client.put_manifest(_repo(rel.candidate).with_tag(oci.att_tag(other_digest)), att)
    proc = _verify(registry.ref(f"{rel.ns}/demo", "other"), public, registry)
    assert proc.returncode == 1 and "about another digest" in proc.stdout, proc.stdout

    # one changed byte of the verdict inside the signed payload
    layers = _layers(registry, rel.candidate, rel.digest)
    envelopes = []
    for layer in layers:
        env = json.loads(layer.envelope)
        payload = base64.b64decode(env["payload"])
        if layer.predicate_type == statement.VSA_PREDICATE_TYPE:
            assert b'"verificationResult":"PASSED"' in payload
            payload = payload.replace(b'"verificationResult":"PASSED"', b'"verificationResult":"PASSEE"')
            env["payload"] = base64.b64encode(payload).decode()
        envelopes.append((layer.predicate_type, json.dumps(env).encode()))
    with RegistryClient([registry.host]) as client:
        oci.write(client, _repo(rel.candidate), rel.digest, envelopes, replace=statement.PREDICATE_TYPES)
    proc = _verify(rel.candidate, public, registry)
    assert proc.returncode == 1 and "no signature verifies" in proc.stdout, proc.stdout


def test_a_fail_run_is_attested_failed(sessions, registry, make_image, keys):
    _, public = keys
    rel = Release(sessions, registry, make_image, broken=True)
    assert rel.verdict == "FAIL"
    found, rejected = collect(_layers(registry, rel.candidate, rel.digest), rel.digest, load_public_key(public))
    assert rejected == [] and len(found) == 1
    assert found[0].vsa["verificationResult"] == "FAILED" and found[0].vsa["verifiedLevels"] == ["FAILED"]
    assert found[0].predicate is not None and found[0].predicate.verdict == "FAIL"
    assert any(c.status == "FAIL" and c.case_id == "train/tiny/base" for c in found[0].predicate.checks)
    proc = _verify(rel.candidate, public, registry)
    assert proc.returncode == 1 and "REFUSED (FAILED)" in proc.stdout


def test_a_newer_decision_replaces_the_attestation_in_every_repository(sessions, registry, make_image, keys):
    """An admission controller accepts any layer that verifies: a stale PASS must not stay beside a FAIL."""
    _, public = keys
    rel = Release(sessions, registry, make_image)
    promote_run(sessions, rel.run_id, actor="tester")
    with sessions() as s:
        run = repo.get_run(s, rel.run_id)
        repo.record_decision(s, run, "FAIL", [], "0" * 64, None)
        s.commit()
    assert after_decision(sessions, rel.run_id).status == "written"
    for reference in [rel.candidate, *rel.targets()]:
        layers = _layers(registry, reference, rel.digest)
        assert len(layers) == 2, reference
        found, _ = collect(layers, rel.digest, load_public_key(public))
        assert [f.vsa["verificationResult"] for f in found] == ["FAILED"], reference
        assert _verify(reference, public, registry).returncode == 1


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_gate_check_from_the_attestation_answers_as_from_the_database(sessions, db_url, registry, make_image,
                                                                      keys):
    _, public = keys
    passed = Release(sessions, registry, make_image)
    failed = Release(sessions, registry, make_image, broken=True)
    never = Release(sessions, registry, make_image, evaluate=False)
    cases = [(passed.candidate, 0), (registry.ref(f"{passed.ns}/demo", digest=passed.digest), 0),
             (failed.candidate, 1), (never.candidate, 1)]
    for reference, expected in cases:
        by_db = run_cli("gate", "check", reference, "--db", db_url, "--insecure-registry", registry.host)
        by_att = run_cli("gate", "check", reference, "--attestation", "--key", str(public),
                         "--insecure-registry", registry.host)
        assert by_db.returncode == by_att.returncode == expected, (reference, by_db.stdout, by_att.stdout,
                                                                  by_att.stderr)
    # a repository the digest was not qualified for is refused by both
    elsewhere = registry.ref(f"{passed.ns}/elsewhere", "x")
    with RegistryClient([registry.host]) as client:
        client.copy(_repo(passed.candidate).with_digest(passed.digest), elsewhere)
        layers = oci.read(client, _repo(passed.candidate), passed.digest)
        oci.write(client, _repo(elsewhere), passed.digest, [(x.predicate_type, x.envelope) for x in layers], [])
    by_db = run_cli("gate", "check", elsewhere, "--db", db_url, "--insecure-registry", registry.host)
    by_att = run_cli("gate", "check", elsewhere, "--attestation", "--key", str(public),
                     "--insecure-registry", registry.host)
    assert by_db.returncode == by_att.returncode == 1 and "not where" in by_att.stdout


def test_no_key_means_no_attestation_said_once_and_the_run_is_judged(sessions, registry, make_image, monkeypatch,
                                                                     caplog):
    monkeypatch.delenv("QUALIFY_ATTEST_KEY_FILE", raising=False)
    monkeypatch.delenv("QUALIFY_ATTEST_KEY", raising=False)
    from qualify.attest import service

    monkeypatch.setattr(service, "_SAID", set())
    with caplog.at_level(logging.WARNING, logger="qualify.attest.service"):
        first = Release(sessions, registry, make_image)
        second = Release(sessions, registry, make_image)
    assert first.verdict == second.verdict == "PASS"
    said = [r for r in caplog.records if "no signing key" in r.getMessage()]
    assert len(said) == 1
    assert _layers(registry, first.candidate, first.digest) == []
    assert write_for_run(sessions, first.run_id).status == "no-key"

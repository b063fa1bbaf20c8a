"""End to end with the real Distribution registry (docker-registry) whose `notifications.endpoints` point at a
real `qualify serve` on loopback: a push of an unqualified digest to a protected tag is reverted to the
previous qualified digest (or deleted when there is none); a qualified push stays; all of it in the
database and the service's log, never the token."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest
from support.gate import agreement_parts, good_doc, manifest_text, seed_run
from support.net import free_port
from support.paths import REPO
from support.cli import run_cli
from support.registry import skopeo, skopeo_digest
from support.service import wait_for

from qualify.manifest.cases import expand
from qualify.gate.judging import evaluate_and_commit
from qualify.manifest.load import load_manifest_text
from qualify.store.engine import open_database

pytestmark = [pytest.mark.registry, pytest.mark.slow]


def _copy(host: str, src: str, dst: str) -> None:
    proc = skopeo("copy", "--quiet", "--preserve-digests", "--src-tls-verify=false", "--dest-tls-verify=false",
                  f"docker://{host}/{src}", f"docker://{host}/{dst}")
    assert proc.returncode == 0, proc.stderr


def test_registry_pushes_to_protected_tags_are_gated(tmp_path: Path, registry_factory, make_image) -> None:
    token = "reg-" + uuid.uuid4().hex
    port = free_port()
    endpoint = {"name": "qualify", "url": f"http://127.0.0.1:{port}/v1/registry/events",
                "headers": {"Authorization": [f"Bearer {token}"]}, "timeout": "3s", "threshold": 3,
                "backoff": "1s", "ignoredmediatypes": ["application/octet-stream"]}
    registry = registry_factory(notifications=[endpoint])
    ns = "g" + uuid.uuid4().hex[:8]
    path = f"{ns}/demo"
    repository = registry.ref(path)
    good = make_image(registry, path, "rc-good")
    bad = make_image(registry, path, "rc-bad")
    unknown = make_image(registry, path, "rc-unknown")

    # the results: `good` qualified (PASS), `bad` judged FAIL, `unknown` never judged
    db = f"sqlite:///{tmp_path / 'q.db'}"
    engine, sessions = open_database(db)
    text = manifest_text(release_extra={"repository": repository, "previous_tag": None})
    docs = {c.case_id: good_doc(c) for c in expand(load_manifest_text(text, check_expiry=False).release)}
    # agreement 0.5, as a workload reports it (per-sequence counts and flags): the gate judges the counts
    quality, counts, record = agreement_parts(0.5)
    bad_doc = docs["infer/tq/w8a8"]
    bad_doc["metrics"].update(quality)
    bad_doc["samples"].update(counts)
    bad_doc["environment"].update(record)
    with sessions() as s:
        good_run = seed_run(s, text, digest=good).id
        bad_run = seed_run(s, text, digest=bad, docs=docs).id
        s.commit()
    assert evaluate_and_commit(sessions, good_run).judgement.verdict == "PASS"
    assert evaluate_and_commit(sessions, bad_run).judgement.verdict == "FAIL"

    log_path = tmp_path / "serve.log"
    env = {**os.environ, "QUALIFY_SERVICE_TOKEN": token, "QUALIFY_DATA_DIR": str(tmp_path / "data")}
    with open(log_path, "wb") as log:
        service = subprocess.Popen(
            [sys.executable, "-m", "qualify", "serve", "--db", db, "--port", str(port), "--registry", registry.host,
             "--insecure-registry", registry.host, "--protect", f"{path}:stable", "--protect", f"{registry.host}/{ns}/*:edge",
             "--enforce", "revert"], env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)
    api = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _healthy(api), "the service", 60)

        def events(tag: str) -> list[dict]:
            with engine.connect() as conn:
                from sqlalchemy import text as sql

                rows = conn.execute(sql("SELECT tag, digest, outcome, previous_digest, detail FROM registry_events "
                                        "WHERE tag = :t ORDER BY id"), {"t": tag})
                return [dict(r._mapping) for r in rows]

        # a qualified digest pushed to the protected tag stays
        _copy(registry.host, f"{path}@{good}", f"{path}:stable")
        wait_for(lambda: len(events("stable")) == 1, "the first event")
        assert events("stable")[0]["outcome"] == "allowed"
        time.sleep(1.0)
        assert skopeo_digest(registry.ref(path, "stable")) == good

        # a FAIL digest is reverted to the qualified one; so is a digest never judged
        for digest in (bad, unknown):
            _copy(registry.host, f"{path}@{digest}", f"{path}:stable")
            row = wait_for(lambda: [e for e in events("stable") if e["digest"] == digest
                                 and e["outcome"] not in ("enforcing",)], f"the event of {digest}")[0]
            assert (row["outcome"], row["previous_digest"]) == ("reverted", good), row
            assert skopeo_digest(registry.ref(path, "stable")) == good
        # (the service's own re-point is a push too: the registry reports it, the service allows it)
        wait_for(lambda: sum(e["outcome"] == "allowed" for e in events("stable")) == 3, "the re-points' events")

        # no qualified digest ever had this tag: the manifest is deleted
        _copy(registry.host, f"{path}@{bad}", f"{path}:edge")
        row = wait_for(lambda: [e for e in events("edge") if e["outcome"] != "enforcing"], "the edge event")[0]
        assert row["outcome"] == "deleted", row
        assert skopeo_digest(registry.ref(path, "edge")) is None
        assert skopeo_digest(registry.ref(path, "rc-bad")) is None  # Distribution deletes by digest: every tag on it

        # an unprotected tag is none of the service's business
        _copy(registry.host, f"{path}@{unknown}", f"{path}:scratch")
        time.sleep(1.5)
        assert events("scratch") == [] and skopeo_digest(registry.ref(path, "scratch")) == unknown

        # the webhook refuses requests without the token, and malformed envelopes
        assert httpx.post(f"{api}/v1/registry/events", json={"events": []}, trust_env=False).status_code == 401
        bad_body = httpx.post(f"{api}/v1/registry/events", content=b"{", trust_env=False,
                              headers={"Authorization": f"Bearer {token}"})
        assert bad_body.status_code == 400
        gate = httpx.get(f"{api}/v1/gate", params={"ref": registry.ref(path, "stable")}, trust_env=False)
        assert gate.status_code == 200 and gate.json()["ok"] and gate.json()["digest"] == good
        # the tag form says which digest it judged (the one the tag points to now); the digest form needs no note
        assert good in gate.json()["judged"] and "before a push" in gate.json()["judged"]
        by_digest = httpx.get(f"{api}/v1/gate", params={"ref": registry.ref(path, digest=good)}, trust_env=False)
        assert by_digest.json()["ok"] and "judged" not in by_digest.json()
        cli = run_cli("gate", "check", registry.ref(path, "stable"), "--db", db, "--insecure-registry", registry.host)
        assert cli.returncode == 0 and f"note: judged {good}" in cli.stdout, cli.stdout + cli.stderr
    finally:
        os.killpg(service.pid, 15)
        try:
            service.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(service.pid, 9)
        engine.dispose()
    log = log_path.read_text()
    assert token not in log
    assert f"{repository}:stable@{bad}" in log and "reverted" in log and "deleted" in log, log[-3000:]
    assert "tag re-pointed to the previous qualified digest" in log


def _healthy(api: str) -> bool:
    try:
        return httpx.get(f"{api}/healthz", timeout=2, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


def test_fixture_config_carries_the_notifications(registry_factory) -> None:
    endpoint = {"name": "x", "url": "http://127.0.0.1:9/none", "headers": {"Authorization": ["Bearer y"]}}
    registry = registry_factory(notifications=[endpoint])
    config = (registry.root / "config.yml").read_text()
    assert json.dumps({"endpoints": [endpoint]}) in config

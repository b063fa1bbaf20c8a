"""Attestations through the real `qualify run` (Prefect flow, Ray, a synthetic case, a prebuilt candidate in
the real loopback registry, promotion on PASS): the flow's judgement writes the attestation and its promotion
copies it; `qualify verify` answers from the registry alone."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import yaml
from support.attest import key_pair
from support.cli import run_cli
from support.flows import run_qualify

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.prefect, pytest.mark.workload, pytest.mark.registry]


def test_a_judged_and_promoted_run_carries_its_attestation(tmp_path: Path, registry, make_image) -> None:
    ns = "f" + uuid.uuid4().hex[:8]
    digest = make_image(registry, f"{ns}/demo", "1.0-rc1")
    target = registry.ref(f"{ns}/public/demo", "1.0")
    manifest = tmp_path / "release.yaml"
    manifest.write_text(yaml.safe_dump({
        "apiVersion": "qualify/v1",
        "release": {"name": "attested", "repository": registry.ref(f"{ns}/demo"), "tag": "1.0",
                    "candidate_tag": "1.0-rc1"},
        "build": {"builder": "prebuilt", "reference": registry.ref(f"{ns}/demo", "1.0-rc1")},
        "execution": {"executor": "local", "case_timeout_s": 60, "infra_retries": 1},
        "gate": {"regression": {"baseline": "optional"}},  # a first release: no previous tag to compare with
        "custom_cases": [{"name": "fast", "kind": "synthetic",
                          "params": {"samples": {"tokens_per_s": [100.0, 101.0, 99.0]}}}],
        "promotion": {"on_pass": True, "targets": [{"name": "public", "reference": target}],
                      "insecure_registries": [registry.host]},
    }, sort_keys=False))
    private, public = key_pair(tmp_path / "keys")
    db = f"sqlite:///{tmp_path / 'q.db'}"
    res = run_qualify(["run", str(manifest), "--db", db, "--json"], tmp_path,
                      QUALIFY_ATTEST_KEY_FILE=str(private))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert json.loads(res.stdout)["verdict"] == "PASS"
    for reference in (registry.ref(f"{ns}/demo", "1.0-rc1"), target):
        proc = run_cli("verify", reference, "--key", str(public), "--insecure-registry", registry.host, "--json")
        assert proc.returncode == 0, (reference, proc.stdout, proc.stderr)
        body = json.loads(proc.stdout)
        assert body["digest"] == digest and body["verificationResult"] == "PASSED" and body["verdict"] == "PASS"

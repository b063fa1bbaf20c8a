"""Duet through the container executor (the production path): both sides of each launch pair in their own podman
containers, the barrier's folder mounted into both, pinned to their own cores and trading them every step.

The image is the debootstrap base plus one file (the workload package is mounted by the executor), built by
qualify's buildah builder and pushed to a loopback registry. It is named as gate.reference by digest, so the
candidate is compared with itself, made really faster by the synthetic workload's `slowdown` (less work per step).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.containers import BASE_IMAGE, base_image, require_tools  # noqa: F401 - fixtures
from support.flows import results, run_qualify

from qualify.build import build_candidate
from qualify.manifest.load import load_manifest

# alone: under -n 2 this module has the machine to itself (duet ratios: tests/support/machine_share.py).
pytestmark = [pytest.mark.alone, pytest.mark.ray, pytest.mark.registry, pytest.mark.container, pytest.mark.prefect, pytest.mark.slow,
              pytest.mark.timeout(1200)]


def _release(repo: Path, registry_host: str, build: dict[str, Any], gate: dict[str, Any] | None = None) -> Path:
    data: dict[str, Any] = {
        "apiVersion": "qualify/v1",
        "release": {"name": "duetc", "repository": f"{registry_host}/q/duetc", "tag": "1.0", "candidate_tag": "1.0-rc1"},
        "build": build,
        "execution": {"executor": "container", "case_timeout_s": 120, "infra_retries": 0, "launches": 4,
                      "container": {"runtime": "podman", "network": "none", "gpu_mode": "none"}},
        "custom_cases": [{"name": "faster", "kind": "synthetic", "resources": {"cpus": 1},
                          "params": {"samples": {"tokens_per_s": [100.0]}, "steps": 8, "step_work": 100_000,
                                     "slowdown": -0.3}}],
        "gate": gate or {"regression": {"enabled": False}},
        "promotion": {"on_pass": False, "insecure_registries": [registry_host],
                      "targets": [{"name": "public", "reference": f"{registry_host}/q/duetc-pub:1.0"}]},
    }
    path = repo / f"{'run' if gate else 'build'}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_a_duet_runs_each_side_in_its_own_container_on_its_own_cores(tmp_path: Path, registry,
                                                                    base_image: str) -> None:
    require_tools("buildah", "podman")
    repo = tmp_path / "release"
    (repo / ".git").mkdir(parents=True)
    (repo / "Containerfile").write_text(f"FROM {BASE_IMAGE}\nCOPY hello.txt /hello.txt\n")
    (repo / "hello.txt").write_text("duet in containers\n")
    built = build_candidate(load_manifest(_release(repo, registry.host, {
        "builder": "buildah", "containerfile": "Containerfile"})).release, data_dir=tmp_path / "b", manifest_dir=repo)
    image = f"{registry.host}/q/duetc@{built.digest}"
    manifest = _release(repo, registry.host, {"builder": "prebuilt", "reference": f"{registry.host}/q/duetc:1.0-rc1"},
                        gate={"regression": {"baseline": "optional", "min_samples": 3, "max_launches": 8,
                                             "duet_steps": 8},
                              "reference": {"image": image, "label": "the same image", "mode": "duet",
                                            "min_gain": 0.10, "cases": "synthetic/*"}})
    db = f"sqlite:///{tmp_path / 'q.db'}"
    res = run_qualify(["run", str(manifest), "--db", db, "--json"], tmp_path)
    assert "Traceback" not in res.stderr, res.stderr
    outcome = json.loads(res.stdout)
    [line] = [r for r in outcome["reasons"] if r["check"] == "reference"]
    env = results(db, outcome["run_id"])["reference/synthetic/faster"]["environment"]
    record = env["duet"]
    # Run in duet, not fallen back to paired: each pair's two containers met at the barrier on their own cores.
    assert record["mode"] == "duet" and not record.get("reason"), record
    pairs = record["pairs"]
    assert len(pairs) >= 4 and [p["candidate_side"] for p in pairs][:4] == [0, 1, 0, 1], pairs
    assert all(p.get("traded_cores") for p in pairs), pairs
    assert built.digest in record["baseline_image"]
    # 30% less work per step measured through the containers: about +43%, the required +10% shown.
    assert line["status"] == "PASS", line
    assert 0.25 < line["figures"]["estimate"] < 0.65, line["figures"]
    assert (res.returncode, outcome["verdict"]) == (0, "PASS"), outcome["reasons"]

"""Builds on the cluster (issue 28), for real: a two-node Ray cluster on loopback, the `builder` resource on one node,
a Distribution registry on loopback. `qualify run` joins the cluster; the candidate's buildah build runs as a Ray task
on the builder node (its files shipped to it), which pushes it; the other node pulls it by digest; the cases run in
the image on both nodes through podman; each stage is recorded. A broken build is the candidate's failure, with its
log back on the driver; no builder node is infrastructure (exit 3), or a build on the driver when the manifest
allows it.

The image is the debootstrap base (Python 3.11; the workload package is mounted by the container executor) plus one
file: what is tested is where the build runs and what travels, not what the image holds (test_system_image.py
builds the real CPU image).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.containers import BASE_IMAGE, base_image, require_tools, skopeo_digest  # noqa: F401 - fixtures
from support.flows import db_rows, results, run_qualify
from support.ray_cluster import CLIENT_ENV, loopback_cluster

pytestmark = [pytest.mark.ray, pytest.mark.registry, pytest.mark.container, pytest.mark.prefect, pytest.mark.slow,
              pytest.mark.timeout(1800)]


def _release(tmp: Path, registry_host: str, name: str, *, copy: str = "hello.txt",
             build: dict[str, Any] | None = None) -> Path:
    repo = tmp / name
    (repo / ".git").mkdir(parents=True)  # the manifest's repository: build paths are confined to it
    (repo / "image").mkdir()
    (repo / "image" / "hello.txt").write_text(f"{name}: built on the cluster\n")
    (repo / "image" / "Containerfile").write_text(f"FROM {BASE_IMAGE}\nCOPY {copy} /hello.txt\n")
    data: dict[str, Any] = {
        "apiVersion": "qualify/v1",
        "release": {"name": name, "repository": f"{registry_host}/q/{name}", "tag": "1.0", "candidate_tag": "1.0-rc1"},
        "build": {"builder": "buildah", "containerfile": "image/Containerfile", "on": "cluster", "timeout_s": 600,
                  **(build or {})},
        "execution": {"executor": "container", "case_timeout_s": 120, "infra_retries": 0, "launches": 1,
                      "container": {"runtime": "podman", "network": "none", "gpu_mode": "none"}},
        "custom_cases": [{"kind": "sleep", "params": {"seconds": 0.5}, "name": f"on-{node}",
                          "resources": {"cpus": 1, "custom": {f"{node}_node": 1}}} for node in ("head", "second")],
        "gate": {"regression": {"enabled": False}},
        "promotion": {"on_pass": False, "insecure_registries": [registry_host],
                      "targets": [{"name": "public", "reference": f"{registry_host}/q/{name}-pub:1.0"}]},
    }
    path = repo / "release.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _run(tmp: Path, db: str, manifest: Path, address: str) -> tuple[int, dict[str, Any], str]:
    res = run_qualify(["run", str(manifest), "--db", db, "--json", "--ray-address", address], tmp, **CLIENT_ENV)
    assert "Traceback" not in res.stderr, res.stderr
    return res.returncode, (json.loads(res.stdout) if res.stdout.strip() else {}), res.stderr


def test_the_build_runs_on_the_builder_node_the_other_pulls_and_the_cases_run_on_both(
        tmp_path: Path, registry, base_image: str) -> None:
    require_tools("buildah", "podman", "skopeo")
    os.environ.update(CLIENT_ENV)  # a client of the single-machine cluster (the conftest restores os.environ)
    db = f"sqlite:///{tmp_path / 'q.db'}"
    with loopback_cluster(tmp_path / "cluster.log", head={"num_cpus": 1, "resources": {"head_node": 1}},
                          nodes=[{"num_cpus": 2, "resources": {"second_node": 1, "builder": 1}}]) as cluster:
        code, outcome, err = _run(tmp_path, db, _release(tmp_path, registry.host, "clustered"), cluster.address)
        assert (code, outcome.get("verdict")) == (0, "PASS"), (err, outcome.get("reasons"))
        [run] = db_rows(db, "SELECT cluster, stage_seconds FROM runs WHERE id = :r", r=outcome["run_id"])
        record = json.loads(run["cluster"]) if isinstance(run["cluster"], str) else run["cluster"]
        stages = json.loads(run["stage_seconds"]) if isinstance(run["stage_seconds"], str) else run["stage_seconds"]
        # Ray first (the build is a Ray task), then the build, the pulls, the cases: each stage timed.
        assert list(stages)[:6] == ["setup", "ray", "build", "pull", "verify", "cases"], stages
        print("stages:", {k: round(v, 1) for k, v in stages.items()})
        # The build ran on the builder node, which pushed the candidate: the registry holds its digest.
        build = record["build"]
        assert build["archive_bytes"] > 0 and build["seconds"] > 0, build
        digest = outcome["digest"]
        assert skopeo_digest(f"{registry.host}/q/clustered:1.0-rc1") == digest
        # Both nodes pulled the candidate by digest before the cases; each case ran on its node, in the image.
        pulls = record["pulls"]
        assert len(pulls) == 2 and all(p["ok"] and p["image"].endswith(f"@{digest}") for p in pulls), pulls
        assert len({p["node_id"] for p in pulls}) == 2
        import ray

        from qualify.execution.ray import bind_local_cluster_to_loopback

        bind_local_cluster_to_loopback()
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        try:
            [builder] = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("builder")]
        finally:
            ray.shutdown()
        assert build["node_id"] == builder  # the node that declares `builder`, not the head the driver joined
        stored = results(db, outcome["run_id"])
        assert {c: stored[c]["status"] for c in stored} == {"sleep/on-head": "passed", "sleep/on-second": "passed"}
        assert len({stored[c]["node"] for c in stored}) >= 1
        # The build's log came back to the run: `runs show` says where it ran.
        shown = run_qualify(["runs", "show", str(outcome["run_id"]), "--db", db], tmp_path)
        assert "build: on the cluster, node" in shown.stdout and "pulls:" in shown.stdout, shown.stdout
        logs = list((tmp_path).rglob("builds/*-clustered.log"))
        assert logs and any("# built on node" in p.read_text() for p in logs), logs

        # A broken build (a COPY of a file that is not there) is the candidate's failure, its log on the driver.
        code, broken, err = _run(tmp_path, db, _release(tmp_path, registry.host, "broken", copy="missing.txt"),
                                 cluster.address)
        assert code == 1 and "build failed" in err and "built on" in err, err
        assert "missing.txt" in err

    # A cluster without a builder node: infrastructure (exit 3), naming the resource; with driver_fallback, the
    # driver builds.
    with loopback_cluster(tmp_path / "cluster2.log", head={"num_cpus": 1, "resources": {"head_node": 1}},
                          nodes=[{"num_cpus": 1, "resources": {"second_node": 1}}]) as cluster:
        code, _, err = _run(tmp_path, db, _release(tmp_path, registry.host, "nobuilder"), cluster.address)
        assert code == 3 and "declares the 'builder' resource" in err, err
        code, fallback, err = _run(tmp_path, db, _release(tmp_path, registry.host, "fallback",
                                                          build={"driver_fallback": True}), cluster.address)
        assert (code, fallback.get("verdict")) == (0, "PASS"), err
        [run] = db_rows(db, "SELECT cluster FROM runs WHERE id = :r", r=fallback["run_id"])
        record = json.loads(run["cluster"]) if isinstance(run["cluster"], str) else run["cluster"]
        assert record["build"] == {"on": "driver (fallback)"}

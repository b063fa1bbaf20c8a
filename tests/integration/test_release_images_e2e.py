"""Several images per release (issue 28), end to end: a training image and a serving image, each built by buildah
at the same time and pushed to a loopback registry, each verified for its own components, each case run through
podman in the image it names, one verdict over both, and on PASS each image promoted to its own targets.

The images are the debootstrap base (Python 3.11; the workload package is mounted by the container executor) plus a
file saying which image it is: what is tested is that each image is built, checked, run and promoted as itself.
"""

from __future__ import annotations

import datetime as dt
import re
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.containers import BASE_IMAGE, base_image, require_tools, skopeo_digest  # noqa: F401 - fixtures
from support.flows import db_rows, results, run_json, run_qualify

pytestmark = [pytest.mark.ray, pytest.mark.registry, pytest.mark.container, pytest.mark.prefect, pytest.mark.slow,
              pytest.mark.timeout(1200)]


def _release(tmp: Path, registry_host: str, *, serving_python: str = "3.11") -> tuple[Path, str]:
    """The manifest, and the registry namespace of this test (`host/ns`)."""
    host = f"{registry_host}/n{uuid.uuid4().hex[:8]}"
    repo = tmp / "release"
    (repo / ".git").mkdir(parents=True)  # the manifest's repository: build paths are confined to it
    for name in ("training", "serving"):
        (repo / name).mkdir()
        (repo / name / "which.txt").write_text(f"{name} image\n")
        (repo / name / "Containerfile").write_text(f"FROM {BASE_IMAGE}\nCOPY which.txt /which.txt\n")
    data: dict[str, Any] = {
        "apiVersion": "qualify/v1",
        "release": {"name": "duo", "repository": f"{host}/q/duo", "tag": "1.0", "candidate_tag": "1.0-rc1"},
        "build": {"builder": "buildah", "containerfile": "training/Containerfile", "timeout_s": 600},
        "images": [{"name": "serving", "repository": f"{host}/q/duo-serving",
                    "build": {"builder": "buildah", "containerfile": "serving/Containerfile", "timeout_s": 600},
                    "components": [{"name": "python", "source": "python", "expected": serving_python,
                                    "match": "prefix"}],
                    "targets": [{"name": "public", "reference": f"{host}/pub/duo-serving:1.0"}]}],
        "components": [{"name": "python", "source": "python", "expected": "3.11", "match": "prefix"}],
        "execution": {"executor": "container", "case_timeout_s": 120, "infra_retries": 0, "launches": 1,
                      "container": {"runtime": "podman", "network": "none", "gpu_mode": "none"}},
        "custom_cases": [{"name": "train-step", "kind": "sleep", "params": {"seconds": 0.2}},
                         {"name": "serve-step", "kind": "sleep", "params": {"seconds": 0.2}, "image": "serving"}],
        "gate": {"regression": {"enabled": False}},
        "promotion": {"on_pass": True, "insecure_registries": [registry_host],
                      "targets": [{"name": "public", "reference": f"{host}/pub/duo:1.0"}]},
    }
    path = repo / "release.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path, host


def _build_window(log: Path) -> tuple[dt.datetime, dt.datetime]:
    """When a build started (its log's name) and ended (the log's last write)."""
    start = dt.datetime.strptime(re.match(r"(\d{8}T\d{6}\.\d{6})Z", log.name).group(1), "%Y%m%dT%H%M%S.%f")
    return start.replace(tzinfo=dt.timezone.utc), dt.datetime.fromtimestamp(log.stat().st_mtime, dt.timezone.utc)


def test_two_images_are_built_at_once_run_their_own_cases_and_are_promoted_together(
        tmp_path: Path, registry, base_image: str) -> None:
    require_tools("buildah", "podman", "skopeo")
    db = f"sqlite:///{tmp_path / 'q.db'}"
    manifest, host = _release(tmp_path, registry.host)
    code, outcome = run_json(tmp_path, db, manifest)
    assert (code, outcome["verdict"]) == (0, "PASS"), outcome["reasons"]
    training = outcome["digest"]
    [further] = db_rows(db, "SELECT name, digest FROM run_images WHERE run_id = :r", r=outcome["run_id"])
    serving = further["digest"]
    assert further["name"] == "serving" and serving != training
    assert skopeo_digest(f"{host}/q/duo:1.0-rc1") == training
    assert skopeo_digest(f"{host}/q/duo-serving:1.0-rc1") == serving

    # The two builds ran at the same time: each started before the other ended.
    logs = [Path(r["build_log_path"]) for r in db_rows(db, "SELECT build_log_path FROM images")]
    (a0, a1), (b0, b1) = (_build_window(p) for p in logs)
    assert a0 < b1 and b0 < a1, (a0, a1, b0, b1)

    # Each image's components were checked in it; each case ran in the image it names.
    checks = {(r["image"], r["name"]): r["ok"] for r in db_rows(
        db, "SELECT image, name, ok FROM component_checks WHERE run_id = :r", r=outcome["run_id"])}
    assert checks == {("", "python"): 1, ("serving", "python"): 1}
    stored = results(db, outcome["run_id"])
    ran_in = {case: row["environment"]["release_image"] for case, row in stored.items()}
    assert {case: image["name"] for case, image in ran_in.items()} == {"sleep/serve-step": "serving",
                                                                       "sleep/train-step": "duo"}
    ran_in = {case: image["executor"] for case, image in ran_in.items()}
    assert serving in ran_in["sleep/serve-step"] and training not in ran_in["sleep/serve-step"], ran_in
    assert training in ran_in["sleep/train-step"], ran_in

    # PASS promoted each image to its own target, by digest.
    assert {p["target"]: p["outcome"] for p in outcome["promotions"]} == {"public": "promoted",
                                                                          "serving/public": "promoted"}
    assert skopeo_digest(f"{host}/pub/duo:1.0") == training
    assert skopeo_digest(f"{host}/pub/duo-serving:1.0") == serving

    # What people read says which image each case used.
    shown = run_qualify(["runs", "show", str(outcome["run_id"]), "--db", db], tmp_path).stdout
    assert "serving" in shown and serving[:19] in shown, shown
    gate = run_qualify(["gate", "check", f"{host}/pub/duo-serving:1.0", "--db", db,
                        "--insecure-registry", registry.host], tmp_path)
    assert gate.returncode == 0, gate.stdout + gate.stderr


def test_a_wrong_component_in_one_image_fails_the_release_and_promotes_neither(
        tmp_path: Path, registry, base_image: str) -> None:
    require_tools("buildah", "podman", "skopeo")
    db = f"sqlite:///{tmp_path / 'q.db'}"
    manifest, host = _release(tmp_path, registry.host, serving_python="3.12")
    code, outcome = run_json(tmp_path, db, manifest)
    assert (code, outcome["verdict"]) == (1, "FAIL"), outcome["reasons"]
    failed = [r for r in outcome["reasons"] if r["status"] == "FAIL"]
    assert [r["check"] for r in failed] == ["component:serving/python"], failed
    assert outcome["promotions"] == []
    from support.registry import skopeo_digest as digest_or_none

    assert digest_or_none(f"{host}/pub/duo:1.0") is None and digest_or_none(f"{host}/pub/duo-serving:1.0") is None

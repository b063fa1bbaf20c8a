"""A reference image to beat (issue 28, the release note's "base vs. optimized"): `gate.reference` names an image by
digest that is not the previous release; each case it names runs again as `reference/<case id>`, the candidate
beside the reference, paired or in duet, and the gate decides the gain by the interval rule against `min_gain`.

The local executor's "image" is an interpreter's package set (the local builder's digest): the reference here is
this interpreter, named by that digest. The candidate is made really faster or slower than it with the synthetic
workload's `slowdown` (less or more real work per step in duet; its figures divided in paired), which the
reference side never gets. Both sides' figures are stored; the gain is reported with its interval against the
required one; a reference that is really faster, named as the one to beat, FAILs.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.flows import results, run_json, run_qualify

from qualify.build.local import environment_digest

# alone: under -n 2 this module has the machine to itself (the gain over a reference image: tests/support/machine_share.py).
pytestmark = [pytest.mark.alone, pytest.mark.slow, pytest.mark.ray, pytest.mark.prefect, pytest.mark.workload]


def _manifest(path: Path, *, mode: str, digest: str, params: dict[str, Any], launches: int) -> Path:
    cases = [{"name": "faster", "kind": "synthetic", "params": {**copy.deepcopy(params), "slowdown": -0.3}},
             {"name": "slower", "kind": "synthetic", "params": {**copy.deepcopy(params), "slowdown": 0.25}},
             {"name": "unnamed", "kind": "synthetic", "params": copy.deepcopy(params)}]
    data: dict[str, Any] = {
        "apiVersion": "qualify/v1",
        "release": {"name": "opt", "repository": "127.0.0.1:5000/q/opt", "tag": "1.0", "candidate_tag": "1.0-rc1"},
        "execution": {"executor": "local", "case_timeout_s": 120, "infra_retries": 0, "launches": launches},
        "custom_cases": cases,
        "gate": {"regression": {"baseline": "optional", "min_samples": 3, "max_launches": 6, "duet_steps": 8},
                 "reference": {"image": f"127.0.0.1:5000/std/pytorch@{digest}", "label": "standard image",
                               "python": sys.executable, "mode": mode, "min_gain": 0.10,
                               "cases": "synthetic/[fs]*"}},
        "promotion": {"on_pass": False, "targets": [{"name": "public", "reference": "127.0.0.1:5000/q/pub:1.0"}]},
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _reference_reasons(outcome: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["case_id"]: r for r in outcome["reasons"] if r["check"] == "reference"}


@pytest.mark.parametrize("mode", ["paired", "duet"])
def test_a_reference_image_is_beaten_by_a_faster_candidate_and_not_by_a_slower_one(tmp_path: Path, mode: str) -> None:
    db = f"sqlite:///{tmp_path / 'q.db'}"
    digest = environment_digest(sys.executable)[0]
    params: dict[str, Any] = ({"launch_samples": [{"tokens_per_s": [v]} for v in (100.0, 101.0, 99.0)]}
                              if mode == "paired" else {"samples": {"tokens_per_s": [100.0]}, "steps": 8,
                                                         "step_work": 100_000})
    manifest = _manifest(tmp_path / f"{mode}.yaml", mode=mode, digest=digest, params=params, launches=3)
    code, outcome = run_json(tmp_path, db, manifest)
    reasons = _reference_reasons(outcome)
    # Only the cases the glob names are compared with the reference; each has exactly one verdict line.
    assert set(reasons) == {"reference/synthetic/faster", "reference/synthetic/slower"}, outcome["reasons"]

    faster, slower = reasons["reference/synthetic/faster"], reasons["reference/synthetic/slower"]
    # 30% less work: a gain of about +43%, its worst end above the required +10%: superiority shown.
    assert faster["status"] == "PASS", faster
    assert "against standard image" in faster["message"] and "+10.0%" in faster["message"], faster["message"]
    # A reference that is really faster (the candidate does 25% more work), named as the one to beat: FAIL.
    assert slower["status"] == "FAIL", slower
    assert "no gain of +10.0%" in slower["message"], slower["message"]
    assert faster["figures"]["required_change"] == pytest.approx(0.10)
    assert (code, outcome["verdict"]) == (1, "FAIL")

    # Both sides are stored with the reference case; the case itself is still judged against its own rule.
    stored = results(db, outcome["run_id"])
    assert {"synthetic/faster", "reference/synthetic/faster", "synthetic/unnamed"} <= set(stored)
    env = stored["reference/synthetic/faster"]["environment"]
    side = env["duet"] if mode == "duet" else env["paired"]
    assert "standard image" in side["baseline_image"] and digest in side["baseline_image"], side
    if mode == "duet":
        assert env["duet"]["mode"] == "duet" and len(env["duet"]["pairs"]) >= 4
        # The gain in duet is measured from real work: about 1/0.7 - 1 = +43%, not a figure handed in.
        assert 0.25 < faster["figures"]["estimate"] < 0.65, faster["figures"]
    else:
        assert env["paired"]["pairs"] == 3

    # `runs show` and the report say the gain against the required one.
    shown = run_qualify(["runs", "show", str(outcome["run_id"]), "--db", db, "--verbose"], tmp_path)
    assert shown.returncode == 1 or shown.returncode == 0, shown.stderr
    assert "reference/synthetic/slower" in shown.stdout and "no gain of +10.0%" in shown.stdout, shown.stdout
    report = run_qualify(["report", str(outcome["run_id"]), "--db", db, "--out", str(tmp_path / "rep")], tmp_path)
    assert report.returncode == 0, report.stderr
    html = (tmp_path / "rep" / f"run-{outcome['run_id']}.html").read_text()
    assert "Against the reference image" in html and "standard image" in html and "+10.0%" in html

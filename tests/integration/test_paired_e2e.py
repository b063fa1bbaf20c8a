"""Paired baseline end to end through `qualify run` (issue 14): the previous release's environment re-measured
beside the candidate, in counterbalanced pairs A B B A B A in one Ray task, the gate comparing pair by pair.

The cases are synthetic (they report the figures they are given, `slowdown` divides them): what is tested
here is the pairing, the interleaving, the stored samples and the verdicts, in seconds. The real training
workload in both modes is measured by benchmarks/paired_vs_history.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.flows import case_regression, db_rows, results, run_json, run_qualify

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.prefect, pytest.mark.workload]

FIGURES = [100.0, 101.0, 99.0]


def _manifest(path: Path, tag: str, previous: str | None, *, slowdown: float = 0.0, baseline: str = "paired"
              ) -> Path:
    params: dict[str, Any] = {"launch_samples": [{"tokens_per_s": [v]} for v in FIGURES]}
    if slowdown:
        params["slowdown"] = slowdown
    data: dict[str, Any] = {
        "apiVersion": "qualify/v1",
        "release": {"name": "pair", "repository": "127.0.0.1:5000/q/pair", "tag": tag,
                    "candidate_tag": f"{tag}-rc1", **({"previous_tag": previous} if previous else {})},
        "execution": {"executor": "local", "case_timeout_s": 60, "infra_retries": 0, "launches": 3},
        "custom_cases": [{"name": "fast", "kind": "synthetic", "params": params}],
        "gate": {"regression": {"baseline": baseline, "max_regression": 0.05, "min_samples": 3}},
        "promotion": {"on_pass": False, "targets": [{"name": "public", "reference": f"127.0.0.1:5000/q/pub:{tag}"}]},
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_paired_runs_interleave_and_judge_pairs(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'q.db'}"
    code, first = run_json(tmp_path, db, _manifest(tmp_path / "base.yaml", "1.0", None, baseline="optional"))
    assert (code, first["verdict"]) == (0, "PASS"), first["reasons"]

    # The same environment against itself: PASS, the pairs stored, A B B A B A on one node.
    code, same = run_json(tmp_path, db, _manifest(tmp_path / "same.yaml", "1.1", "1.0"))
    assert (code, same["verdict"]) == (0, "PASS"), same["reasons"]
    reason = case_regression(same)
    assert reason["status"] == "PASS" and "paired" in reason["message"] and "3 pairs" in reason["message"]
    env = results(db, same["run_id"])["synthetic/fast"]["environment"]
    assert env["paired"]["order"] == ["A0", "B0", "B1", "A1", "B2", "A2"]
    assert env["paired"]["pairs"] == 3 and "local interpreter" in env["paired"]["baseline"]
    [row] = db_rows(db, "SELECT samples FROM case_results WHERE run_id = :r", r=same["run_id"])
    samples = json.loads(row["samples"]) if isinstance(row["samples"], str) else row["samples"]
    # Each launch reports the entry of its slot: A0 B0 B1 A1 B2 A2 are slots 0..5 (entries modulo 3).
    assert samples["per_launch.tokens_per_s"] == [FIGURES[0], FIGURES[0], FIGURES[2]]
    assert samples["paired_baseline.per_launch.tokens_per_s"] == [FIGURES[1], FIGURES[2], FIGURES[1]]

    # `runs show` and the report show the pairs.
    shown = run_qualify(["runs", "show", str(same["run_id"]), "--db", db, "--verbose"], tmp_path)
    assert shown.returncode == 0 and "non-inferiority shown" in shown.stdout, shown.stdout
    report = run_qualify(["report", str(same["run_id"]), "--db", db, "--out", str(tmp_path / "rep")], tmp_path)
    assert report.returncode == 0, report.stderr
    html = (tmp_path / "rep" / f"run-{same['run_id']}.html").read_text()
    assert "Comparison with the baseline (paired)" in html and "A0 B0 B1 A1 B2 A2" in html

    # A 10% slower candidate (the baseline side never gets the switch): FAIL.
    code, slow = run_json(tmp_path, db, _manifest(tmp_path / "slow.yaml", "1.2", "1.0", slowdown=0.10))
    assert (code, slow["verdict"]) == (1, "FAIL"), slow["reasons"]
    assert case_regression(slow)["status"] == "FAIL"

    # A previous release that was never qualified: no image to re-measure, INCOMPLETE with the reason.
    code, orphan = run_json(tmp_path, db, _manifest(tmp_path / "orphan.yaml", "2.1", "2.0"))
    assert (code, orphan["verdict"]) == (1, "INCOMPLETE"), orphan["reasons"]
    reason = case_regression(orphan)
    assert reason["status"] == "INCOMPLETE" and "has no run whose latest decision is PASS" in reason["message"]

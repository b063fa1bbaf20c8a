"""The verdict cannot be fooled, end to end through `qualify run` (synthetic cases, a real previous-release
run in the same database). Each scenario once fooled the gate (issue 11)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.flows import run_qualify

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.prefect, pytest.mark.workload]

BASE = [100.0, 101.0, 99.0, 100.5, 99.5, 100.2, 99.8]


def _manifest(path: Path, tag: str, previous: str | None, cases: list[dict[str, Any]],
              gate: dict[str, Any] | None = None) -> Path:
    data: dict[str, Any] = {
        "apiVersion": "qualify/v1",
        "release": {"name": "synth", "repository": "127.0.0.1:5000/q/synth", "tag": tag,
                    "candidate_tag": f"{tag}-rc1", **({"previous_tag": previous} if previous else {})},
        "execution": {"executor": "local", "case_timeout_s": 60, "infra_retries": 1},
        "custom_cases": cases,
        "gate": gate or {},
        "promotion": {"on_pass": False, "targets": [{"name": "public", "reference": f"127.0.0.1:5000/q/pub:{tag}"}]},
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _fast(scale: float = 1.0, **extra: Any) -> dict[str, Any]:
    return {"name": "fast", "kind": "synthetic", "params": {"samples": {"tokens_per_s": [v * scale for v in BASE]},
                                                             **extra}}


def _run(tmp: Path, db: str, manifest: Path) -> tuple[int, dict[str, Any]]:
    res = run_qualify(["run", str(manifest), "--db", db, "--json"], tmp)
    assert "Traceback" not in res.stderr, res.stderr
    return res.returncode, json.loads(res.stdout)


def _reason(outcome: dict[str, Any], check: str) -> dict[str, Any]:
    return next(r for r in outcome["reasons"] if r["check"] == check)


def test_the_verdict_cannot_be_fooled(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'q.db'}"
    code, base = _run(tmp_path, db, _manifest(tmp_path / "base.yaml", "1.0", None, [_fast()],
                                              gate={"regression": {"baseline": "optional"}}))
    assert (code, base["verdict"]) == (0, "PASS"), base["reasons"]
    # history mode counts runs: it needs the fingerprint's run-to-run variation (issue 22)
    cal = run_qualify(["calibrate", str(tmp_path / "base.yaml"), "--db", db, "--runs", "3", "--slowed-runs", "1"],
                      tmp_path)
    assert cal.returncode == 0, cal.stderr

    # a 15% drop against the previous release FAILs; a 1% change PASSes
    code, slower = _run(tmp_path, db, _manifest(tmp_path / "slow.yaml", "1.1", "1.0", [_fast(0.85)]))
    assert (code, slower["verdict"]) == (1, "FAIL")
    assert _reason(slower, "regression")["status"] == "FAIL"
    code, same = _run(tmp_path, db, _manifest(tmp_path / "same.yaml", "1.2", "1.0", [_fast(0.99)]))
    assert (code, same["verdict"]) == (0, "PASS"), same["reasons"]
    assert _reason(same, "regression")["status"] == "PASS"

    # a typo'd previous_tag is INCOMPLETE, not a silent pass; `baseline: optional` says so and passes
    code, typo = _run(tmp_path, db, _manifest(tmp_path / "typo.yaml", "1.3", "1.0x", [_fast()]))
    assert (code, typo["verdict"]) == (1, "INCOMPLETE")
    assert "1.0x" in _reason(typo, "regression")["message"]
    code, first = _run(tmp_path, db, _manifest(tmp_path / "first.yaml", "1.3", "1.0x", [_fast()],
                                               gate={"regression": {"baseline": "optional"}}))
    assert (code, first["verdict"]) == (0, "PASS")
    assert _reason(first, "regression")["status"] == "NO-BASELINE"

    # a workload that dies by SIGSEGV FAILs, without a retry
    code, segv = _run(tmp_path, db, _manifest(tmp_path / "segv.yaml", "1.4", "1.0",
                                              [_fast(), {"name": "boom", "kind": "synthetic",
                                                         "params": {"signal": "SEGV"}}]))
    assert (code, segv["verdict"]) == (1, "FAIL")
    [boom] = [c for c in segv["cases"] if c["case_id"] == "synthetic/boom"]
    assert (boom["error_class"], boom["attempts"]) == ("crash", 1) and "SIGSEGV" in boom["error"]

    # a waiver on one check leaves another failing check failing
    waived = {"thresholds": [{"cases": "synthetic/*", "metric": "tokens_per_s", "min": 95}],
              "waivers": [{"id": "W-1", "cases": "synthetic/fast", "check": "threshold:tokens_per_s",
                           "reason": "known slow runner", "expires": "2099-01-01"}]}
    code, partly = _run(tmp_path, db, _manifest(tmp_path / "waived.yaml", "1.5", "1.0", [_fast(0.85)], waived))
    assert (code, partly["verdict"]) == (1, "FAIL")
    assert _reason(partly, "threshold:tokens_per_s")["status"] == "WAIVED"
    assert _reason(partly, "regression")["status"] == "FAIL"

    # the digest's latest decision is now FAIL: gate check and promote refuse it, though it once passed
    digest = partly["digest"]
    assert base["digest"] == digest  # the local builder: one environment, one digest
    check = run_qualify(["gate", "check", f"127.0.0.1:5000/q/synth@{digest}", "--db", db], tmp_path)
    assert check.returncode == 1 and check.stdout.startswith("FAIL:") and "overridden" in check.stdout
    promote = run_qualify(["promote", str(partly["run_id"]), "--db", db], tmp_path)
    assert promote.returncode == 1 and "is FAIL, not PASS" in promote.stderr


def test_duplicate_case_names_are_refused(tmp_path: Path) -> None:
    manifest = _manifest(tmp_path / "dup.yaml", "1.0", None, [_fast(), _fast(1.1)])
    res = run_qualify(["validate", str(manifest)], tmp_path)
    assert res.returncode == 2 and "two cases named 'fast'" in res.stderr

"""The README's main job: `qualify run releases/cpu-smoke.yaml` qualifies the embedded default
end to end — every case really runs (DeepSpeed training steps for the four ablation variants,
torchao quantization for the reference and three schemes), results land in the database, the
verdict is PASS, the report is written, and `gate check` accepts the qualified digest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.flows import db_rows, results, run_qualify

# The README's main job, as a new user runs it: no Prefect server, the ephemeral API.
# alone: under -n 2 this module has the machine to itself (the smoke's ablation gains: tests/support/machine_share.py).
pytestmark = [pytest.mark.alone, pytest.mark.slow, pytest.mark.ray, pytest.mark.prefect, pytest.mark.workload, pytest.mark.ephemeral_prefect]
REPO = Path(__file__).resolve().parents[2]


def test_cpu_smoke_qualifies_end_to_end(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'q.db'}"
    res = run_qualify(["run", str(REPO / "releases" / "cpu-smoke.yaml"), "--db", db, "--json"], tmp_path,
                      timeout=1500)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    outcome = json.loads(res.stdout)
    assert outcome["verdict"] == "PASS"
    got = results(db, outcome["run_id"])
    assert sorted(got) == sorted([
        "train/tiny-llama/base", "train/tiny-llama/comm", "train/tiny-llama/compile", "train/tiny-llama/compile+ckpt",
        "infer/tiny-qwen3/none", "infer/tiny-qwen3/w8a16", "infer/tiny-qwen3/w8a8", "infer/tiny-qwen3/w4a16"])
    assert all(r["status"] == "passed" for r in got.values())
    metrics = {r["case_id"]: json.loads(r["metrics"]) if isinstance(r["metrics"], str) else r["metrics"]
               for r in db_rows(db, "SELECT case_id, metrics FROM case_results")}
    for case_id, m in metrics.items():
        if case_id.startswith("train/"):
            assert m["tokens_per_s"] > 0 and m["loss_last"] is not None
        else:
            assert 0.0 <= m["token_agreement"] <= 1.0
    assert metrics["infer/tiny-qwen3/none"]["token_agreement"] == 1.0
    components = db_rows(db, "SELECT name, ok FROM component_checks")
    assert len(components) == 5 and all(c["ok"] for c in components)
    page = Path(outcome["report"]).read_text()  # one chart per model: training (ablation) and inference
    assert "alt='training chart tiny-llama'" in page and "alt='inference chart tiny-qwen3'" in page
    # A CI job asks the same database before a push: the qualified digest passes, another does not.
    ok = run_qualify(["gate", "check", f"127.0.0.1:5000/qualify/cpu-smoke@{outcome['digest']}", "--db", db], tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    other = run_qualify(["gate", "check", "127.0.0.1:5000/qualify/cpu-smoke@sha256:" + "0" * 64, "--db", db], tmp_path)
    assert other.returncode == 1, other.stdout + other.stderr

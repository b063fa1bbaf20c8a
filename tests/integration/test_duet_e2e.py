"""Duet end to end (gate.regression.baseline: duet): real workload processes, two at a time, each pinned to its own
core, step k of both started together at a FIFO barrier, the sides swapped between launch pairs, through Ray and
through `qualify run`. The cases are synthetic with real timed steps (`params.steps`: pure-Python work; with
`slowdown` each step does that much more work, never a sleep)."""

from __future__ import annotations

import copy
import math
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.cli import run_qualify
from support.flows import results

# alone: under -n 2 this module has the machine to itself (duet ratios: tests/support/machine_share.py).
pytestmark = [pytest.mark.alone, pytest.mark.slow, pytest.mark.ray, pytest.mark.workload]

STEPS = {"samples": {}, "steps": 12, "step_work": 150_000}


def _doc(slowdown: float = 0.0) -> dict[str, Any]:
    return {"protocol": 1, "case_id": "synthetic/duet", "kind": "synthetic", "launches": 3, "timeout_s": 120,
            "params": {**STEPS, **({"slowdown": slowdown} if slowdown else {})}, "env": {}}


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="duet needs two cores")
def test_a_real_duet_through_ray_synchronizes_steps_and_swaps_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil
    import tempfile

    import ray

    from qualify.execution.duet import DuetPolicy
    from qualify.execution.ray import run_case_on_ray, start_ray
    from qualify.executors import LocalExecutor
    from qualify.manifest import Resources

    temp = tempfile.mkdtemp(prefix="qd-")  # short: Ray's socket paths must stay under 108 bytes
    monkeypatch.setenv("QUALIFY_RAY_TEMP", temp)
    handle = start_ray(num_cpus=2)
    try:
        out = run_case_on_ray(LocalExecutor(), _doc(0.5), Resources(cpus=1), 120, baseline=LocalExecutor(),
                              baseline_doc=_doc(), duet=DuetPolicy(max_regression=0.05, alpha=0.05, max_pairs=4))
    finally:
        handle.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
        assert not ray.is_initialized()
    doc = out.doc
    assert doc["status"] == "passed", doc.get("error")
    record = doc["environment"]["duet"]
    assert record["mode"] == "duet" and record["reason"] is None
    pairs = record["pairs"]
    assert [p["candidate_side"] for p in pairs] == [0, 1, 0, 1]  # swapped every launch pair
    cores = record["sides"]["cpus"]
    assert cores[0] != cores[1] and not set(cores[0]) & set(cores[1])
    for p in pairs:
        assert p["candidate_cpus"] == cores[p["candidate_side"]] and p["baseline_cpus"] == cores[1 - p["candidate_side"]]
        assert p["steps"] == 12
        # Step k started together on both sides: a generous bound on a shared 2-core machine (a step is ~20-60 ms).
        assert p["step_start_skew_s"] is not None and p["step_start_skew_s"] < 0.25, p
        # Each process really ran pinned to its side's cores (what the workload read back after pinning).
        assert p["candidate_affinity"] == p["candidate_cpus"] and p["baseline_affinity"] == p["baseline_cpus"]
    # 50% more work per step on the candidate's side (log 0.41): seen once the side bias is removed. Generous: a
    # neighbour busy on one of this shared machine's two cores moves single pairs by +-0.3.
    from qualify.execution.duet import blocks_from_samples
    from qualify.gate.duet_stats import duet_interval

    interval = duet_interval(blocks_from_samples(doc["samples"]))
    # The interval is on the gate's scale: the throughput change, negative = worse. 50% more work is -33% on a quiet
    # machine with independent cores. With an idle wait at the barrier it was measured between -13% and -22% most
    # times, and once +5% (4 pairs): the two vCPUs share their host's cores, and the slower side's extra work ran
    # beside a sleeping peer. The busy wait removed that pull towards 1 (benchmarks/duet_coupling.py), but each
    # vCPU's speed still changes with what the host runs beside it, so single pairs move by +-0.3. Asserted is
    # what holds whatever the coupling: the interval exists, admits the slowdown, and is never one a real slowdown
    # could not produce (a log time ratio beyond 0.9).
    assert interval is not None and interval.lower < 0 and interval.estimate > math.exp(-0.9) - 1, interval
    # With the trades the cores' neighbours cancel: measured -32% (pairs +0.34..+0.42 in log time; true +0.405)
    # where fixed cores gave -13%..+5%. Bounded loosely, for a loaded CI machine.
    assert -0.45 < interval.estimate < -0.20, interval
    # The sides traded cores every step: one ratio per two steps (each release once on each core).
    assert all(p["traded_cores"] and p["units"] == 6 for p in pairs)
    assert 12 <= len(doc["samples"]["duet.log_ratio"]) <= 24
    assert all(p["clean_units"] >= 3 or p["problem"] for p in pairs)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="duet needs two cores")
def test_an_inference_case_runs_in_duet_through_ray_its_requests_as_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 23 (coverage): an inference case on the transformers engine is measured in duet, not paired: real
    torchao W8A16 on the tiny preset, each timed request a step both sides start together, the cores traded every
    request, the sides swapped between launch pairs, at least the duet's steps per launch (more repeats of the same
    requests), and an interval on identical code."""
    import shutil
    import tempfile

    from qualify.execution.duet import DuetPolicy, blocks_from_samples
    from qualify.execution.ray import run_case_on_ray, start_ray
    from qualify.executors import LocalExecutor
    from qualify.gate.duet_stats import duet_interval
    from qualify.manifest import Resources

    doc = {"protocol": 1, "case_id": "infer/tiny-qwen3/w8a16", "kind": "infer", "launches": 3, "timeout_s": 300,
           "params": {"model": "tiny-qwen3", "scheme": "w8a16", "num_threads": 1, "num_prompts": 4, "repeats": 1,
                      "max_new_tokens": 8, "probes": []}, "env": {}}
    temp = tempfile.mkdtemp(prefix="qd-")  # short: Ray's socket paths must stay under 108 bytes
    monkeypatch.setenv("QUALIFY_RAY_TEMP", temp)
    handle = start_ray(num_cpus=2)
    try:
        out = run_case_on_ray(LocalExecutor(), copy.deepcopy(doc), Resources(cpus=1), 300, baseline=LocalExecutor(),
                              baseline_doc=copy.deepcopy(doc),
                              duet=DuetPolicy(max_regression=0.05, alpha=0.05, max_pairs=4, min_steps=8))
    finally:
        handle.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
    result = out.doc
    assert result["status"] == "passed", result.get("error")
    record = result["environment"]["duet"]
    assert record["mode"] == "duet" and record["reason"] is None, record.get("reason")
    assert record["timed_steps_per_launch"] == 8 and record["case_timed_steps"] == 4  # 4 requests x 2 repeats
    pairs = record["pairs"]
    assert [p["candidate_side"] for p in pairs] == [0, 1, 0, 1]
    for p in pairs:
        assert p["steps"] == 8 and p["traded_cores"] and p["units"] == 4, p
        assert p["step_start_skew_s"] is not None and p["step_start_skew_s"] < 0.25, p
        assert p["candidate_affinity"] == p["candidate_cpus"] and p["baseline_affinity"] == p["baseline_cpus"]
    interval = duet_interval(blocks_from_samples(result["samples"]))
    assert interval is not None and interval.n == 4
    # Identical code: the estimate is near zero (bounded loosely, for a loaded CI machine).
    assert abs(interval.estimate) < 0.25, interval
    assert result["metrics"]["output_tokens_per_s"] > 0


def _manifest(path: Path, tag: str, previous: str | None, *, slowdown: float = 0.0, baseline: str = "duet",
              wide_cpus: int = 0) -> Path:
    params: dict[str, Any] = copy.deepcopy({**STEPS, **({"slowdown": slowdown} if slowdown else {})})
    cases: list[dict[str, Any]] = [{"name": "steps", "kind": "synthetic", "params": params,
                                    "resources": {"cpus": 1}}]
    if wide_cpus:  # fits the node once, not twice: falls back to paired
        cases.append({"name": "wide", "kind": "synthetic", "params": copy.deepcopy(params),
                      "resources": {"cpus": wide_cpus}})
    data: dict[str, Any] = {
        "apiVersion": "qualify/v1",
        "release": {"name": "duet", "repository": "127.0.0.1:5000/q/duet", "tag": tag,
                    "candidate_tag": f"{tag}-rc1", **({"previous_tag": previous} if previous else {})},
        "execution": {"executor": "local", "case_timeout_s": 120, "infra_retries": 0, "launches": 3},
        "custom_cases": cases,
        # max_launches 4: the paired fallback's sequential looks stop at 4 pairs (this test is about structure)
        "gate": {"regression": {"baseline": baseline, "max_regression": 0.05, "min_samples": 3, "max_launches": 4}},
        "promotion": {"on_pass": False, "targets": [{"name": "public", "reference": f"127.0.0.1:5000/q/pub:{tag}"}]},
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _run(tmp: Path, db: str, manifest: Path) -> tuple[int, dict[str, Any]]:
    res = run_qualify(["run", str(manifest), "--db", db, "--json"], tmp)
    assert "Traceback" not in res.stderr, res.stderr
    return res.returncode, json.loads(res.stdout)


@pytest.mark.prefect
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="duet needs two cores")
@pytest.mark.timeout(2400)  # three runs of duet pairs and a paired fallback on two shared cores
def test_qualify_run_in_duet_mode_passes_identical_code_fails_a_slower_one_and_falls_back(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'q.db'}"
    code, first = _run(tmp_path, db, _manifest(tmp_path / "base.yaml", "1.0", None, baseline="optional",
                                               wide_cpus=os.cpu_count() or 2))
    assert (code, first["verdict"]) == (0, "PASS"), first["reasons"]

    code, same = _run(tmp_path, db, _manifest(tmp_path / "same.yaml", "1.1", "1.0", wide_cpus=os.cpu_count() or 2))
    reasons = {r["case_id"]: r for r in same["reasons"] if r["check"] == "regression"}
    steps = reasons["synthetic/steps"]
    # Judged in duet, the side bias reported. Identical code is never FAILed (with the sides trading cores every
    # step a neighbour's load on one core cancels; before, it moved single launch pairs by +-20%); PASS is not
    # asserted, as a loaded machine may leave it undecided (error rates: tests/unit/test_duet_stats.py and
    # benchmarks/paired_vs_history.py).
    assert steps["status"] in ("PASS", "INCOMPLETE") and "duet" in steps["message"], steps
    assert "side bias" in steps["message"] and steps["figures"]["design"] == "duet", steps
    env = results(db, same["run_id"])["synthetic/steps"]["environment"]
    assert [p["candidate_side"] for p in env["duet"]["pairs"]][:4] == [0, 1, 0, 1]
    # The node cannot hold two sides of the wide case: measured paired, the reason in the result and the verdict.
    wide = results(db, same["run_id"])["synthetic/wide"]["environment"]
    assert wide["duet"]["mode"] == "paired" and "no node can hold both sides" in wide["duet"]["reason"]
    assert 3 <= wide["paired"]["pairs"] <= 4  # 3 planned, more while undecided, never past max_launches (4)
    assert "no node can hold both sides" in reasons["synthetic/wide"]["message"]
    # The report shows what the gate judged: the duet's interval per case, the side bias, the fallback's reason;
    # never the history comparison with another run's stored results (its "-37%, calibrate" beside a duet's PASS).
    html = Path(same["report"]).read_text()
    assert "Comparison with the baseline (duet)" in html and "side bias (removed)" in html
    assert "two runs cannot be told apart" not in html and "history mode cannot decide" not in html
    assert "does not need one" in html

    # Twice the work per step: never a PASS, and the slowdown is seen. Run alone on this machine it was a FAIL; with
    # another duet benchmark pinned to the same two cores beside it, contention coupled
    # the sides (-23% [-38.9%, -3.0%]) and the last look's share of alpha (0.9%) left it undecided: INCOMPLETE,
    # whose best end still shows the candidate slower.
    code, slow = _run(tmp_path, db, _manifest(tmp_path / "slow.yaml", "1.2", "1.0", slowdown=1.0))
    reason = next(r for r in slow["reasons"] if r["check"] == "regression")
    assert code == 1 and slow["verdict"] in ("FAIL", "INCOMPLETE"), slow["reasons"]
    assert reason["status"] == slow["verdict"] and reason["figures"]["upper"] < 0, reason

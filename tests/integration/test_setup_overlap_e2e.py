"""Set-up together, measurement in turn, with real workload processes (issue 27): a case's launches started at once
through Ray and the local executor, each parked at its measurement gate after its set-up, measured one at a time.
The synthetic workload's set-up is real CPU work of known size (`params.setup_work`), as a real launch's imports
and model build are; what each launch did is read back from its own document (its gate record and phases)."""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.workload]

WORK = {"samples": {}, "steps": 8, "step_work": 100_000, "setup_work": 3_000_000}


def _case(**params: Any) -> dict[str, Any]:
    return {"protocol": 1, "case_id": "synthetic/overlap", "kind": "synthetic", "launches": 3, "timeout_s": 120,
            "setup_overlap": 3, "params": {**WORK, **params}, "env": {}}


def _intervals(doc: dict[str, Any]) -> tuple[tuple[float, float], tuple[float, float]]:
    """A launch's set-up and measurement on the wall clock: set-up ends when it parked and began the seconds of its
    earlier phases before; the measurement starts at its release and lasts its warm-up and measure phases."""
    env = doc["environment"]
    gate, phases = env["measure_gate"], env["phases"]
    before = sum(v for k, v in phases.items() if k in ("start", "imports", "model_build"))
    measured = phases.get("warmup", 0.0) + phases["measure"]
    return (gate["parked_at"] - before, gate["parked_at"]), (gate["released_at"], gate["released_at"] + measured)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="overlapping set-up needs two cores")
def test_launches_set_up_together_through_ray_and_each_measures_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    from qualify.execution.ray import run_case_on_ray, start_ray
    from qualify.executors import LocalExecutor
    from qualify.manifest import Resources

    temp = tempfile.mkdtemp(prefix="qo-")  # short: Ray's socket paths must stay under 108 bytes
    monkeypatch.setenv("QUALIFY_RAY_TEMP", temp)
    handle = start_ray(num_cpus=2)
    try:
        out = run_case_on_ray(LocalExecutor(), _case(), Resources(cpus=2), 120)
    finally:
        handle.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
    doc = out.doc
    assert doc["status"] == "passed", doc.get("error")
    assert doc["environment"]["setup_overlap"] == {"batch": 3, "batches": 1, "used": True, "fallback": None}
    launches = doc["environment"]["launches"]
    assert [launch["status"] for launch in launches] == ["passed"] * 3
    assert all("parked" in launch["phases"] for launch in launches)  # each waited at its gate, if only briefly
    assert doc["metrics"]["launches"] == 3 and len(doc["samples"]["per_launch.steps_per_s"]) == 3


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="overlapping set-up needs two cores")
def test_no_measurement_runs_beside_another_launchs_set_up() -> None:
    from qualify.execution import launches, setup_overlap
    from qualify.executors import LocalExecutor

    executor = LocalExecutor()
    docs: list[dict[str, Any]] = []

    def one(doc: dict[str, Any]) -> tuple[dict[str, Any], float]:
        outcome = executor.run(doc, timeout_s=setup_overlap.launch_timeout(doc, 120))
        docs.append(outcome.doc)
        return outcome.doc, outcome.exec_s

    merged, kept = launches.run_launches(_case(), one)
    assert merged["status"] == "passed", merged.get("error")
    assert len(kept) == 3 and len(docs) == 3
    spans = [_intervals(d) for d in kept]
    setups, measures = [s for s, _ in spans], [m for _, m in spans]
    # The set-ups ran together: each began before any of them ended.
    assert max(s0 for s0, _ in setups) < min(s1 for _, s1 in setups), setups
    # Each measurement began after every launch of the batch had parked, and ended before the next one began.
    assert min(m0 for m0, _ in measures) >= max(s1 for _, s1 in setups)
    for (_, end), (start, _) in zip(measures, measures[1:]):
        assert start >= end - 0.01, measures  # 10 ms: the wall clock read in two processes
    assert [d["environment"]["measure_gate"]["slot"] for d in kept] == [0, 1, 2]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="overlapping set-up needs two cores")
def test_a_failing_launch_stops_the_others_at_their_gate_and_leaves_no_folder() -> None:
    from qualify.execution import launches, setup_overlap
    from qualify.executors import LocalExecutor

    executor = LocalExecutor()
    ran: list[dict[str, Any]] = []
    folders: set[str] = set()

    def one(doc: dict[str, Any]) -> tuple[dict[str, Any], float]:
        folders.add(doc["measure_gate"]["dir"])
        if doc["launch"]["index"] == 0:  # the first launch fails after its measurement
            doc = {**doc, "params": {**doc["params"], "fail": "degenerate"}}
        outcome = executor.run(doc, timeout_s=setup_overlap.launch_timeout(doc, 120))
        ran.append(outcome.doc)
        return outcome.doc, outcome.exec_s

    merged, kept = launches.run_launches(_case(), one)
    assert merged["status"] == "failed" and merged["error_class"] == "degenerate"
    assert len(kept) == 1 and len(ran) == 3
    stopped = [d for d in ran if d is not kept[0]]
    # The two others were told STOP at their gate: they ended there, without a document and without measuring.
    assert all(d["status"] != "passed" for d in stopped), stopped
    assert len(folders) == 1 and not any(os.path.exists(f) for f in folders)  # the batch's FIFOs are gone

"""Paired baseline (issue 14): the previous release re-measured beside the candidate, A B A B on one node,
and the gate comparing pair by pair, so that machine drift between pairs cancels."""

from __future__ import annotations

import random
import statistics

import pytest

from qualify import result_document
from qualify.execution import launches
from qualify.manifest.cases import expand
from qualify.gate import stats
from qualify.gate.checks import ResultData, check_regression
from qualify.execution.paired import baseline_document
from support.gate import release as make_release

pytestmark = pytest.mark.unit

PAIRED = {"regression": {"baseline": "paired", "max_regression": 0.05, "alpha": 0.05, "min_samples": 3,
                         "noise_floor": 0.2}}


def _passed(tps: float) -> dict:
    return {"status": "passed", "metrics": {"tokens_per_s": tps}, "samples": {"tokens_per_s": [tps]},
            "environment": {"python": "3.11"}, "duration_s": 1.0}


def test_pairs_are_interleaved_and_both_sides_are_stored() -> None:
    calls: list[str] = []

    def side(name: str, tps: float):
        def launch(doc: dict) -> tuple[dict, float]:
            calls.append(f"{name}{doc['launch']['index']}")
            return _passed(tps + doc["launch"]["index"]), 1.0
        return launch

    merged = launches.run_paired({"case_id": "c", "kind": "train", "params": {}, "launches": 3},
                                 {"case_id": "c", "kind": "train", "params": {}, "launches": 3},
                                 side("A", 90.0), side("B", 100.0), "prev@sha256:x")
    assert calls == ["A0", "B0", "A1", "B1", "A2", "B2"]
    assert merged["environment"]["paired"]["order"] == calls
    assert merged["samples"]["per_launch.tokens_per_s"] == [90.0, 91.0, 92.0]
    assert result_document.paired_baseline_series(merged["samples"], "tokens_per_s") == [100.0, 101.0, 102.0]
    assert merged["environment"]["paired"]["pairs"] == 3 and merged["environment"]["paired"]["reason"] is None


def test_a_failing_baseline_launch_leaves_the_case_without_a_baseline_and_says_why() -> None:
    def candidate(doc: dict) -> tuple[dict, float]:
        return _passed(100.0), 1.0

    def baseline(doc: dict) -> tuple[dict, float]:
        return {"status": "error", "error_class": "infra", "error": "podman: pull refused"}, 0.5

    merged = launches.run_paired({"case_id": "c", "kind": "train", "params": {}, "launches": 3},
                                 {"case_id": "c", "kind": "train", "params": {}, "launches": 3},
                                 candidate, baseline, "prev")
    assert merged["status"] == "passed"  # the candidate's own result stands
    assert merged["environment"]["paired"]["order"] == ["A0", "B0", "A1", "A2"]
    assert "pull refused" in merged["environment"]["paired"]["reason"]
    assert result_document.paired_baseline_series(merged["samples"], "tokens_per_s") is None


def test_the_baseline_side_never_gets_the_slowdown_switch() -> None:
    rel = make_release(training={"models": [{"name": "tiny", "settings": {"slowdown": 0.1}}],
                                 "variants": [{"name": "base"}, {"name": "compile", "compile": True}]})
    case = next(c for c in expand(rel) if c.kind == "train")
    assert case.document()["params"]["slowdown"] == 0.1
    assert "slowdown" not in baseline_document(case)["params"]
    assert baseline_document(case)["launches"] == case.launches


def _paired_result(cand: list[float], base: list[float] | None, reason: str | None = None) -> ResultData:
    samples = {"per_launch.tokens_per_s": cand}
    if base is not None:
        samples["paired_baseline.per_launch.tokens_per_s"] = base
    return ResultData(case_id="train/tiny/base", kind="train", status="passed",
                      metrics={"tokens_per_s": statistics.median(cand)}, samples=samples,
                      environment={"paired": {"baseline": "prev", "order": ["A0", "B0"], "reason": reason}})


def test_the_gate_judges_pairs_and_a_missing_baseline_is_incomplete() -> None:
    rel = make_release(gate_extra=PAIRED)
    case = next(c for c in expand(rel) if c.case_id == "train/tiny/base")

    def judge(result: ResultData) -> list:
        return [r for r in check_regression(rel.gate, [case], {case.case_id: result}, None, "")
                if r.check == "regression"]

    # Drift between pairs (the machine got busier), the same code: PASS.
    [same] = judge(_paired_result([100.0, 70.0, 130.0], [101.0, 69.0, 131.0]))
    assert same.status == "PASS" and same.figures["method"] == "paired-t-log"
    # 10% slower in every pair, under the same drift: FAIL.
    [slow] = judge(_paired_result([90.0, 63.0, 117.0], [100.0, 70.0, 130.0]))
    assert slow.status == "FAIL" and "3 pairs" in slow.message
    # No baseline side (never qualified, deleted, pull refused): INCOMPLETE with the reason, never a pass.
    [missing] = judge(_paired_result([90.0, 91.0, 92.0], None, reason="the previous release 1.0 has no PASS run"))
    assert missing.status == "INCOMPLETE" and "no PASS run" in missing.message


def test_paired_test_catches_five_percent_under_drift_that_the_unpaired_test_misses() -> None:
    rng = random.Random(14)
    trials = 400
    caught = {"paired": 0, "unpaired": 0}
    false = {"paired": 0, "unpaired": 0}
    for _ in range(trials):
        drift = [rng.lognormvariate(0, 0.15) for _ in range(5)]  # the machine's state, shared by a pair
        base = [100 * d * rng.lognormvariate(0, 0.01) for d in drift]
        slow = [95 * d * rng.lognormvariate(0, 0.01) for d in drift]
        same = [100 * d * rng.lognormvariate(0, 0.01) for d in drift]
        kwargs = dict(max_regression=0.02, alpha=0.05, min_samples=3)
        caught["paired"] += stats.compare_pairs(slow, base, "higher", **kwargs).regressed
        caught["unpaired"] += stats.compare_samples(slow, base, "higher", **kwargs).regressed
        false["paired"] += stats.compare_pairs(same, base, "higher", **kwargs).regressed
        false["unpaired"] += stats.compare_samples(same, base, "higher", **kwargs).regressed
    assert caught["paired"] / trials > 0.9, caught
    assert caught["unpaired"] / trials < 0.3, caught
    assert false["paired"] / trials <= 0.05, false


def test_paired_validation_needs_a_previous_release() -> None:
    from qualify.manifest.load import ManifestError

    with pytest.raises(ManifestError, match="previous_tag"):
        make_release(gate_extra=PAIRED, release_extra={"previous_tag": None})

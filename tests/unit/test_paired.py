"""Paired baseline (issue 14): the previous release re-measured beside the candidate, A B A B on one node,
and the gate comparing pair by pair, so that machine drift between pairs cancels."""

from __future__ import annotations

import random
import statistics

import pytest

from qualify import result_document
from qualify.execution import launches
from qualify.gate import noninferiority as ni
from qualify.manifest.cases import expand
from qualify.gate import sequential, stats
from qualify.gate.checks import ResultData, check_regression
from qualify.execution.paired import baseline_document
from support.gate import release as make_release

pytestmark = pytest.mark.unit

PAIRED = {"regression": {"baseline": "paired", "max_regression": 0.05, "alpha": 0.05, "min_samples": 3,
                         "max_launches": 3}}


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
    assert calls == ["A0", "B0", "B1", "A1", "B2", "A2"]  # counterbalanced: A B | B A | B A
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


def test_the_pair_order_is_counterbalanced() -> None:
    sequence = "".join(side for k in range(8) for side in launches.pair_order(k))
    assert sequence == "ABBABAABBAABABBA"
    # Every prefix of whole pairs of even length puts A first as often as B: an order effect cancels.
    assert all(sum(launches.pair_order(k)[0] == "A" for k in range(n)) * 2 == n for n in (2, 4, 6, 8))


def _sequential_pairs(cand_figures: list[float], base_figures: list[float], *, launches_planned: int = 3,
                      max_launches: int = 8) -> tuple[dict, list[str]]:
    calls: list[str] = []

    def side(name: str, figures: list[float]):
        def launch(doc: dict) -> tuple[dict, float]:
            k = doc["launch"]["index"]
            calls.append(f"{name}{k}")
            assert "sequential" not in doc  # the workload never sees the block
            return _passed(figures[k % len(figures)]), 1.0
        return launch

    block = sequential.spec(metric="tokens_per_s", direction="higher", mode="paired", max_regression=0.05,
                            alpha=0.05, min_samples=3, max_launches=max_launches)
    doc = {"case_id": "c", "kind": "train", "params": {}, "launches": launches_planned, "sequential": block}
    merged = launches.run_paired(doc, {**doc}, side("A", cand_figures), side("B", base_figures), "prev")
    return merged, calls


def test_paired_sampling_stops_when_decided_and_at_the_budget() -> None:
    quiet, _ = _sequential_pairs([100.0, 100.4, 99.7], [100.2, 99.8, 100.1])
    assert quiet["metrics"]["launches"] == 3  # decided at the first look: PASS
    assert quiet["environment"]["sequential"]["reason"].startswith("decided (pass) after 3 pairs")
    slow, _ = _sequential_pairs([85.0, 85.3, 84.8], [100.0, 100.2, 99.9])
    assert slow["metrics"]["launches"] == 3 and "decided (fail)" in slow["environment"]["sequential"]["reason"]
    # A 9% pair spread: undecided at every look, deciding needs about the budget's order: to the budget.
    noisy, calls = _sequential_pairs([100.0, 110.0, 91.0, 104.0, 96.0, 108.0, 93.0, 102.0], [100.0])
    assert noisy["metrics"]["launches"] == 8 and len(calls) == 16
    assert "undecided at the budget of 8 pairs" in noisy["environment"]["sequential"]["reason"]
    assert result_document.paired_baseline_series(noisy["samples"], "tokens_per_s") is not None
    # A 40% spread: deciding needs far more than 4 times the budget: it stops at the first look (futility).
    wild, calls = _sequential_pairs([100.0, 140.0, 60.0, 120.0, 80.0], [100.0, 70.0, 130.0, 90.0])
    assert wild["metrics"]["launches"] == 3 and len(calls) == 6
    assert "more than 4 times the budget of 8" in wild["environment"]["sequential"]["reason"]


def test_history_sampling_adds_candidate_launches_until_decided() -> None:
    variation = ni.RunVariation(0.002, 20)
    block = sequential.spec(metric="tokens_per_s", direction="higher", mode="history", max_regression=0.05,
                            alpha=0.05, min_samples=3, max_launches=8, baseline=[100.0, 101.0, 99.0, 100.5],
                            variation=variation)
    figures = iter([100.0, 103.0, 97.0, 101.0, 99.0, 100.5, 99.5, 100.2])
    merged, docs = launches.run_launches({"case_id": "c", "kind": "train", "params": {}, "launches": 3,
                                          "sequential": block}, lambda d: (_passed(next(figures)), 1.0))
    stop = merged["environment"]["sequential"]
    assert 3 < len(docs) <= 8 and stop["launches"] == len(docs) and stop["planned"] == 3
    final = stats.compare_history(merged["samples"]["per_launch.tokens_per_s"], block["baseline"], "higher",
                                  variation=variation, min_samples=3, max_launches=8)
    assert ("decided (pass)" in stop["reason"]) == (final.decision is ni.Decision.PASS)  # the gate agrees


def test_a_metric_no_launch_reports_never_keeps_the_runners_going() -> None:
    """The budget counts launches, not figures: launches that lack the metric (a synthetic case whose steps report
    another figure) stopped the loop only at the budget of figures, which never came (583 launches for a budget
    of 4 in a `qualify run`). Both runners stop at the planned launches and say why."""
    block = sequential.spec(metric="tokens_per_s", direction="higher", mode="paired", max_regression=0.05,
                            alpha=0.05, min_samples=3, max_launches=4)
    calls: list[int] = []

    def without_metric(doc: dict) -> tuple[dict, float]:
        calls.append(doc["launch"]["index"])
        assert len(calls) < 50, "the runner does not stop"
        return {"status": "passed", "metrics": {"steps_per_s": 10.0}, "samples": {}, "environment": {},
                "duration_s": 1.0}, 1.0

    doc = {"case_id": "c", "kind": "synthetic", "params": {}, "launches": 3, "sequential": block}
    merged = launches.run_paired(doc, {**doc}, without_metric, without_metric, "prev")
    assert merged["metrics"]["launches"] == 3 and len(calls) == 6
    assert "tokens_per_s missing" in merged["environment"]["sequential"]["reason"]
    calls.clear()
    history = {**doc, "sequential": {**block, "mode": "history", "baseline": [1.0, 1.0, 1.0]}}
    merged, docs = launches.run_launches(history, without_metric)
    assert len(docs) == 3 and "tokens_per_s missing" in merged["environment"]["sequential"]["reason"]


def test_the_budget_stops_the_runner_whatever_the_rule_says() -> None:
    block = sequential.spec(metric="tokens_per_s", direction="higher", mode="paired", max_regression=0.05,
                            alpha=0.05, min_samples=5, max_launches=4)  # a first look the budget never reaches
    step = sequential.next_step(block, [100.0] * 4, [100.0] * 4)
    assert not step.more and "budget" in step.reason
    assert sequential.next_step(block, [100.0] * 3, [100.0] * 3).more
    assert not sequential.next_step(block, [100.0, None, 100.0], [100.0] * 3).more  # a missing figure: stop


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
    [same] = judge(_paired_result([100.0, 70.0, 130.0], [100.5, 69.8, 130.4]))
    assert same.status == "PASS" and same.figures["design"] == "paired-t", same.message
    # 10% slower in every pair, under the same drift: FAIL, on the same scale as history (-10%, not -11.1%).
    [slow] = judge(_paired_result([90.0, 63.0, 117.0], [100.0, 70.0, 130.0]))
    assert slow.status == "FAIL" and "3 pairs" in slow.message and "-10.0%" in slow.message
    # No baseline side (never qualified, deleted, pull refused): INCOMPLETE with the reason, never a pass.
    [missing] = judge(_paired_result([90.0, 91.0, 92.0], None, reason="the previous release 1.0 has no PASS run"))
    assert missing.status == "INCOMPLETE" and "no PASS run" in missing.message


def test_paired_test_sees_through_drift_that_history_cannot() -> None:
    """15% drift between pairs (the machine's state, shared by a pair), 1% noise within: the pairs decide a 10%
    drop and an identical candidate; two runs with that drift as their run-to-run variation decide neither."""
    rng = random.Random(14)
    trials = 300
    paired = {"slow": 0, "same": 0, "false": 0}
    history = {"slow": 0, "same": 0}
    for _ in range(trials):
        drift = [rng.lognormvariate(0, 0.15) for _ in range(5)]
        base = [100 * d * rng.lognormvariate(0, 0.01) for d in drift]
        slow = [90 * d * rng.lognormvariate(0, 0.01) for d in drift]
        same = [100 * d * rng.lognormvariate(0, 0.01) for d in drift]
        kwargs = dict(max_regression=0.05, alpha=0.05, min_samples=5, max_launches=5)
        paired["slow"] += stats.compare_pairs(slow, base, "higher", **kwargs).decision is ni.Decision.FAIL
        paired["same"] += stats.compare_pairs(same, base, "higher", **kwargs).decision is ni.Decision.PASS
        paired["false"] += stats.compare_pairs(same, base, "higher", **kwargs).decision is ni.Decision.FAIL
        variation = ni.RunVariation(0.15, 20)
        history["slow"] += stats.compare_history(slow, base, "higher", variation=variation,
                                                 **kwargs).decision is ni.Decision.FAIL
        history["same"] += stats.compare_history(same, base, "higher", variation=variation,
                                                 **kwargs).decision is ni.Decision.PASS
    assert paired["slow"] / trials > 0.9 and paired["same"] / trials > 0.9, paired
    assert paired["false"] == 0, paired
    assert history["slow"] / trials < 0.1 and history["same"] / trials < 0.1, history


def test_paired_validation_needs_a_previous_release() -> None:
    from qualify.manifest.load import ManifestError

    with pytest.raises(ManifestError, match="previous_tag"):
        make_release(gate_extra=PAIRED, release_extra={"previous_tag": None})

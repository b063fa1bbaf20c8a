"""Launch-level samples: a case's launches merged into one result, and the gate testing one figure per
launch (issue 12: repeats inside one process share its start-up, clocks and placement, so they are
not independent samples)."""

from __future__ import annotations

import random
import statistics

import pytest

from qualify.execution import launches
from qualify.manifest.cases import expand
from qualify.gate import stats
from qualify.gate.checks import ResultData, check_regression, check_variant_gains
from qualify.manifest import ExecutionSpec, GatePolicy

pytestmark = pytest.mark.unit


def _doc(tps: float, steps: list[float], *, memory: int = 100, status: str = "passed", error_class=None,
         error=None) -> dict:
    return {"status": status, "error_class": error_class, "error": error,
            "metrics": {"tokens_per_s": tps, "peak_memory_bytes": memory, "attn": None},
            "samples": {"tokens_per_s": [tps * 0.99, tps * 1.01], "step_time_s": steps},
            "environment": {"pid": 1}, "duration_s": 2.0}


def test_merged_launches_report_one_figure_per_launch_and_where_each_sample_came_from() -> None:
    docs = [_doc(100.0, [0.1, 0.1], memory=10), _doc(110.0, [0.09], memory=30), _doc(90.0, [0.11], memory=20)]
    merged = launches.merge_launches(docs, [1.0, 2.0, 3.0])
    assert merged["status"] == "passed"
    assert merged["metrics"]["tokens_per_s"] == 100.0  # median of the launches
    assert merged["metrics"]["peak_memory_bytes"] == 30  # a peak is the worst launch's
    assert merged["metrics"]["launches"] == 3
    assert merged["samples"]["per_launch.tokens_per_s"] == [100.0, 110.0, 90.0]
    assert merged["samples"]["step_time_s"] == [0.1, 0.1, 0.09, 0.11]
    assert merged["samples"]["launch_index.step_time_s"] == [0, 0, 1, 2]
    between = merged["metrics"]["cv_tokens_per_s_between_launches"]
    assert between == pytest.approx(statistics.stdev([100, 110, 90]) / 100)
    assert merged["metrics"]["cv_tokens_per_s_within_launch"] == pytest.approx(
        statistics.stdev([0.99, 1.01]) / 1.0)
    assert [e["duration_s"] for e in merged["environment"]["launches"]] == [1.0, 2.0, 3.0]


def test_a_failing_launch_decides_the_case_and_stops_the_others() -> None:
    seen: list[dict] = []

    def launch(doc: dict) -> tuple[dict, float]:
        seen.append(doc)
        if doc["launch"]["index"] == 1:
            return _doc(0.0, [], status="error", error_class="oom", error="out of memory"), 1.0
        return _doc(100.0, [0.1]), 1.0

    merged, docs = launches.run_launches({"case_id": "c", "kind": "train", "params": {}, "launches": 3}, launch)
    assert len(seen) == len(docs) == 2  # the third launch never started
    assert [d["launch"] for d in seen] == [{"index": 0, "of": 3}, {"index": 1, "of": 3}]
    assert all("launches" not in d for d in seen)
    assert merged["status"] == "error" and merged["error_class"] == "oom"
    assert merged["error"] == "launch 2 of 3: out of memory"
    assert merged["environment"]["launches_planned"] == 3


def test_cases_carry_their_launch_count_by_kind_and_it_is_part_of_the_fingerprint() -> None:
    from qualify.manifest.fingerprint import of_case
    from support.gate import release as make_release

    release = make_release()
    release = release.model_copy(update={"execution": ExecutionSpec(launches={"train": 4})})
    cases = expand(release)
    by_kind = {c.kind: c.launches for c in cases}
    assert by_kind["train"] == 4 and by_kind.get("infer", 3) == 3
    train = next(c for c in cases if c.kind == "train")
    assert train.document()["launches"] == 4
    assert of_case(train, {})["launches"] == 4
    assert ExecutionSpec(launches=5).launches_for("sleep") == 5
    with pytest.raises(ValueError, match="1..20"):
        ExecutionSpec(launches={"train": 0})
    with pytest.raises(ValueError):
        ExecutionSpec(launches=True)


def _result(per_launch: list[float], within: list[float] | None = None) -> ResultData:
    samples = {"per_launch.tokens_per_s": per_launch}
    if within is not None:
        samples["tokens_per_s"] = within
    return ResultData(case_id="c", kind="train", status="passed", metrics={"tokens_per_s": statistics.median(per_launch)},
                      samples=samples, fingerprint={"kind": "train"})


def test_the_gate_tests_launches_not_the_repeats_inside_one_process() -> None:
    """The baseline's and the candidate's repeats differ by 8% with almost no spread inside each process
    (a Mann-Whitney test on them says p < 0.01), but across launches the two are the same: no FAIL."""
    from support.gate import release as make_release

    release = make_release(gate_extra={"regression": {"max_regression": 0.05, "alpha": 0.05, "min_samples": 3,
                                                      "noise_floor": 0.2}})
    policy: GatePolicy = release.gate
    case = next(c for c in expand(release) if c.kind == "train")
    candidate = _result([92.0, 104.0, 99.0], within=[92.0, 92.1, 91.9, 92.05, 91.95, 92.0])
    baseline = _result([100.0, 95.0, 103.0], within=[100.0, 100.1, 99.9, 100.05, 99.95, 100.0])
    reasons = check_regression(policy, [case], {case.case_id: candidate}, {case.case_id: baseline}, "prev")
    regression = [r for r in reasons if r.check == "regression"]
    assert regression and all(r.status == "PASS" for r in regression), regression
    assert regression[0].figures["method"] == "welch-log"
    assert regression[0].figures["n_candidate"] == 3
    # The same figures, a real 15% drop on every launch: FAIL.
    worse = _result([85.0, 88.0, 86.5])
    reasons = check_regression(policy, [case], {case.case_id: worse}, {case.case_id: baseline}, "prev")
    assert [r.status for r in reasons if r.check == "regression"] == ["FAIL"]


def test_one_launch_is_never_tested_only_compared_with_the_noise_floor() -> None:
    cmp = stats.compare_samples([90.0], [100.0], "higher", min_samples=3, noise_floor=0.2, test="welch-log",
                                unit="launches")
    assert cmp.method == "ratio-only" and not cmp.regressed and "1 vs 1 launches" in cmp.message


def test_launch_level_gains_use_the_launch_figures() -> None:
    from support.gate import release as make_release

    release = make_release()
    cases = [c for c in expand(release) if c.kind == "train"]
    results = {c.case_id: _result([100.0, 101.0, 99.0], within=[1.0, 1.0]) for c in cases}
    reasons = check_variant_gains(release.gate, cases, results)
    assert reasons and all(r.figures.get("n_variant") in (None, 3) for r in reasons)


def _false_alarms(method: str, trials: int, rng: random.Random) -> float:
    """A/A: the same code, 3% launch-to-launch and 1% within-launch noise (issue 12's figures)."""
    alarms = 0
    for _ in range(trials):
        def launch() -> list[float]:
            level = 100 * rng.lognormvariate(0, 0.03)
            return [level * rng.lognormvariate(0, 0.01) for _ in range(5)]

        if method == "within":  # today's main: one process per side, its 5 repeats as the samples
            cand, base = launch(), launch()
            test = "mann-whitney"
        else:
            cand = [statistics.median(launch()) for _ in range(3)]
            base = [statistics.median(launch()) for _ in range(3)]
            test = "welch-log"
        cmp = stats.compare_samples(cand, base, "higher", max_regression=0.0, alpha=0.05, min_samples=3,
                                    test=test)
        alarms += cmp.regressed
    return alarms / trials


def test_launch_level_testing_keeps_the_false_alarm_rate_that_the_gate_promises() -> None:
    rng = random.Random(12)
    within = _false_alarms("within", 1500, rng)
    launch_level = _false_alarms("launches", 1500, rng)
    assert within > 0.25  # the repeats of one process see its start-up as a "difference"
    assert launch_level <= 0.065, launch_level


def test_welch_on_logs_sees_a_ten_percent_regression_with_three_launches() -> None:
    rng = random.Random(3)
    caught = 0
    for _ in range(500):
        base = [100 * rng.lognormvariate(0, 0.03) for _ in range(3)]
        cand = [90 * rng.lognormvariate(0, 0.03) for _ in range(3)]
        caught += stats.compare_samples(cand, base, "higher", min_samples=3, test="welch-log").regressed
    assert caught / 500 > 0.8


def test_identical_launches_are_an_exact_comparison() -> None:
    same = stats.compare_samples([90.0] * 3, [100.0] * 3, "higher", min_samples=3, test="welch-log")
    assert same.regressed and same.p_value == 0.0
    better = stats.compare_samples([110.0] * 3, [100.0] * 3, "higher", min_samples=3, test="welch-log")
    assert not better.regressed

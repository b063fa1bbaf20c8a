"""The gate's pure functions: every check, waivers (incl. expired), verdict precedence."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from support.gate import (
    GOOD_COMPONENTS,
    TODAY,
    agreement_parts,
    as_result,
    calibrated,
    cases_of,
    good_doc,
    good_results,
    noisy,
    release,
    result_doc,
)

from qualify.gate import stats
from qualify.gate.noninferiority import Decision, RunVariation
from qualify.gate.checks import ComponentData, ResultData
from qualify.gate.evaluate import decide, evaluate
from qualify.manifest import Waiver


_GOOD_BASELINE = object()  # the previous release's good results (release() names one)


def judge(rel, results, *, baseline=_GOOD_BASELINE, components=GOOD_COMPONENTS, today=TODAY, waivers=None,
          previous_named=None, calibrations=None):
    """History mode counts runs: every fingerprint is calibrated (0.5% run to run) unless told otherwise."""
    if baseline is _GOOD_BASELINE:
        baseline = good_results(rel, seed=100)
    return evaluate(rel.gate, cases_of(rel), results, components, baseline, today=today,
                    expected_components=rel.components, waivers=waivers, previous_named=previous_named,
                    calibrations=calibrated(results) if calibrations is None else calibrations)


def only(verdict, check=None, case_id=None, status=None):
    return [r for r in verdict.reasons
            if (check is None or r.check == check) and (case_id is None or r.case_id == case_id)
            and (status is None or r.status == status)]


def replace(results, case_id, **changes):
    out = dict(results)
    out[case_id] = dataclasses.replace(results[case_id], **changes)
    return out


@pytest.fixture
def rel():
    return release()


@pytest.fixture
def good(rel):
    return good_results(rel)


@pytest.fixture
def baseline(rel):
    return good_results(rel, seed=100)


# --------------------------------------------------------------------------- verdict basics


def test_all_good_with_baseline_passes(rel, good, baseline):
    verdict = judge(rel, good, baseline=baseline)
    assert verdict.verdict == "PASS", [r.to_dict() for r in verdict.reasons if r.status != "PASS"]
    assert {r.status for r in verdict.reasons} == {"PASS", "NOTE"}  # NOTE: each MFU's peak source
    checks = {r.check for r in verdict.reasons}
    assert {"completeness", "component:torch", "threshold:tokens_per_s", "threshold:latency_s_p90",
            "agreement", "probe:prefix_cache", "regression", "variant_gain"} <= checks


def test_no_previous_release_is_incomplete_in_history_mode(rel, good):
    # History mode (the default) with no previous release judged nothing: never a PASS (issue 24.1).
    verdict = judge(rel, good, baseline=None, previous_named=False)
    assert verdict.verdict == "INCOMPLETE"
    [reason] = only(verdict, "regression")
    assert reason.status == "INCOMPLETE" and "no previous release" in reason.message


def test_no_previous_release_is_reported_when_the_baseline_is_optional(rel, good):
    gate = rel.gate.model_copy(update={"regression": rel.gate.regression.model_copy(update={"baseline": "optional"})})
    first = rel.model_copy(update={"gate": gate})
    verdict = judge(first, good, baseline=None, previous_named=False)
    assert verdict.verdict == "PASS"
    [reason] = only(verdict, "regression")
    assert reason.status == "NO-BASELINE" and "no previous release" in reason.message


def test_baseline_missing_a_case_is_incomplete_unless_optional(rel, good, baseline):
    del baseline["infer/tq/none"]
    verdict = judge(rel, good, baseline=baseline)
    assert verdict.verdict == "INCOMPLETE"
    [reason] = only(verdict, "regression", "infer/tq/none")
    assert reason.status == "INCOMPLETE" and "no result for this case" in reason.message
    optional = release(gate_extra={"regression": {"baseline": "optional"}})
    verdict = judge(optional, good, baseline=baseline)
    assert verdict.verdict == "PASS"
    [reason] = only(verdict, "regression", "infer/tq/none")
    assert reason.status == "NO-BASELINE" and "optional" in reason.message


def test_reasons_are_json_dicts_with_the_cli_keys(rel, good, baseline):
    verdict = judge(rel, good, baseline=baseline)
    dicts = verdict.reason_dicts()
    json.dumps(dicts, allow_nan=False)
    for d in dicts:
        assert set(d) >= {"check", "case_id", "status", "message", "figures"}
        assert d["status"] in ("PASS", "FAIL", "WAIVED", "NO-BASELINE", "INCOMPLETE", "NOTE")
        assert d["message"] and "\n" not in d["message"]


@pytest.mark.parametrize("statuses,expected", [
    ({"PASS"}, "PASS"), ({"PASS", "WAIVED", "NO-BASELINE"}, "PASS"), ({"PASS", "INCOMPLETE"}, "INCOMPLETE"),
    ({"INCOMPLETE", "FAIL"}, "FAIL"), ({"FAIL", "WAIVED"}, "FAIL"), (set(), "PASS"),
])
def test_decide_precedence(statuses, expected):
    from qualify.gate.checks import Reason

    assert decide([Reason("x", None, s, "m") for s in statuses]) == expected


# --------------------------------------------------------------------------- completeness


def test_missing_result_is_incomplete(rel, good):
    del good["train/tiny/compile"]
    verdict = judge(rel, good)
    assert verdict.verdict == "INCOMPLETE"
    [reason] = only(verdict, "completeness", "train/tiny/compile")
    assert reason.status == "INCOMPLETE" and "no final result" in reason.message


def test_infra_error_is_incomplete_never_pass(rel, good):
    good = replace(good, "infer/tq/none", status="error", error_class="infra", error="worker lost")
    verdict = judge(rel, good)
    assert verdict.verdict == "INCOMPLETE"
    assert "worker lost" in only(verdict, "completeness", "infer/tq/none")[0].message


@pytest.mark.parametrize("status,error_class", [("error", "oom"), ("error", "crash"), ("error", "timeout"),
                                                ("failed", "nan_loss"), ("failed", "degenerate")])
def test_error_or_failed_case_fails(rel, good, status, error_class):
    good = replace(good, "train/tiny/base", status=status, error_class=error_class, error="boom")
    verdict = judge(rel, good)
    assert verdict.verdict == "FAIL"
    [reason] = only(verdict, "completeness", "train/tiny/base")
    assert reason.status == "FAIL" and error_class in reason.message


def test_fail_beats_incomplete(rel, good):
    del good["infer/tq/none"]
    good = replace(good, "train/tiny/base", status="error", error_class="oom", error="OOM")
    assert judge(rel, good).verdict == "FAIL"


# --------------------------------------------------------------------------- components


def test_component_mismatch_fails(rel, good):
    comps = [ComponentData("torch", False, "2.13.0", "2.12.1", "exact"), GOOD_COMPONENTS[1]]
    verdict = judge(rel, good, components=comps)
    assert verdict.verdict == "FAIL"
    [reason] = only(verdict, "component:torch")
    assert "expected 2.13.0" in reason.message and "2.12.1" in reason.message


def test_optional_component_may_be_missing_but_not_wrong(rel, good):
    assert only(judge(rel, good), "component:apex")[0].status == "PASS"
    comps = [GOOD_COMPONENTS[0], ComponentData("apex", False, "0.1", "0.0.9", "exact", optional=True)]
    assert only(judge(rel, good, components=comps), "component:apex")[0].status == "FAIL"


def test_component_never_checked_is_incomplete(rel, good):
    verdict = judge(rel, good, components=[])
    assert verdict.verdict == "INCOMPLETE"
    assert only(verdict, "component:torch")[0].status == "INCOMPLETE"
    assert only(verdict, "component:apex")[0].status == "PASS"  # optional


def test_component_waiver(rel, good):
    comps = [ComponentData("torch", False, "2.13.0", "2.12.1", "exact"), GOOD_COMPONENTS[1]]
    waiver = Waiver(id="W1", check="component:torch", reason="known", expires=TODAY)
    verdict = judge(rel, good, components=comps, waivers=[waiver])
    assert verdict.verdict == "PASS"
    assert only(verdict, "component:torch")[0].status == "WAIVED"


# --------------------------------------------------------------------------- thresholds


def test_min_threshold_on_higher_metric(rel, good):
    low = replace(good, "train/tiny/base", metrics={"tokens_per_s": 99.9})
    verdict = judge(rel, low)
    [reason] = only(verdict, "threshold:tokens_per_s", "train/tiny/base")
    assert reason.status == "FAIL" and "below the minimum 100" in reason.message
    assert reason.figures["value"] == pytest.approx(99.9)
    edge = replace(good, "train/tiny/base", metrics={"tokens_per_s": 100.0})
    assert only(judge(rel, edge), "threshold:tokens_per_s", "train/tiny/base")[0].status == "PASS"


def test_max_threshold_on_lower_metric(rel, good):
    slow = replace(good, "infer/tq/w8a8", metrics={**good["infer/tq/w8a8"].metrics, "latency_s_p90": 2.5})
    verdict = judge(rel, slow)
    assert verdict.verdict == "FAIL"
    [reason] = only(verdict, "threshold:latency_s_p90", "infer/tq/w8a8")
    assert "above the maximum 2" in reason.message
    # the glob covers only inference cases: training results have no latency and are not judged
    assert not only(verdict, "threshold:latency_s_p90", "train/tiny/base")


@pytest.mark.parametrize("metrics,phrase", [({"tokens_per_s": None}, "is null"), ({}, "is missing")])
def test_null_or_missing_metric_fails_clearly(rel, good, metrics, phrase):
    verdict = judge(rel, replace(good, "train/tiny/compile", metrics=metrics))
    [reason] = only(verdict, "threshold:tokens_per_s", "train/tiny/compile")
    assert reason.status == "FAIL" and phrase in reason.message and "tokens_per_s" in reason.message


def test_threshold_waiver_and_expired_waiver(rel, good):
    low = replace(good, "train/tiny/base", metrics={"tokens_per_s": 10.0})
    valid = Waiver(id="KI-1", cases="train/*", check="threshold:tokens_per_s", reason="slow box",
                   expires=TODAY + dt.timedelta(days=1))
    verdict = judge(rel, low, waivers=[valid])
    assert verdict.verdict == "PASS"
    assert "KI-1" in only(verdict, "threshold:tokens_per_s", "train/tiny/base")[0].message
    expired = valid.model_copy(update={"expires": TODAY - dt.timedelta(days=1)})
    verdict = judge(rel, low, waivers=[expired])
    assert verdict.verdict == "FAIL"
    reason = only(verdict, "threshold:tokens_per_s", "train/tiny/base")[0]
    assert reason.status == "FAIL" and "expired on" in reason.message


def test_waiver_expiring_today_still_covers(rel, good):
    low = replace(good, "train/tiny/base", metrics={"tokens_per_s": 10.0})
    waiver = Waiver(id="W", check="threshold:*", reason="edge", expires=TODAY)
    assert judge(rel, low, waivers=[waiver]).verdict == "PASS"
    assert judge(rel, low, waivers=[waiver], today=TODAY + dt.timedelta(days=1)).verdict == "FAIL"


def test_completeness_failures_cannot_be_waived(rel, good):
    broken = replace(good, "train/tiny/base", status="error", error_class="crash", error="segfault")
    for check in ("completeness", "completeness:*"):  # refused at validation; never a cover either
        waiver = Waiver.model_construct(id="W", cases="*", check=check, reason="everything", expires=TODAY)
        assert judge(rel, broken, waivers=[waiver]).verdict == "FAIL"


# --------------------------------------------------------------------------- agreement


def _with_agreement(results, case_id, value, **kwargs):
    metrics, samples, env = agreement_parts(value, **kwargs)
    r = results[case_id]
    return replace(results, case_id, metrics={**r.metrics, **metrics}, samples={**r.samples, **samples},
                   environment={**r.environment, **env})


def test_agreement_per_scheme(rel, good):
    low = _with_agreement(good, "infer/tq/w8a8", 0.85)
    verdict = judge(rel, low)
    assert verdict.verdict == "FAIL"
    # against the scheme's minimum (a second line compares with the previous release's positions)
    [reason] = [r for r in only(verdict, "agreement", "infer/tq/w8a8") if "upper bound" in r.message]
    assert "token agreement 0.8500, upper bound 0.8557" in reason.message and "< 0.9 for w8a8" in reason.message
    # the unquantized scheme has no minimum in this policy: only its comparison with the previous release
    assert [r for r in only(verdict, "agreement", "infer/tq/none") if "previous" not in r.message] == []


def test_workload_low_agreement_failure_is_an_agreement_fail_and_waivable(rel, good):
    failed = replace(good, "infer/tq/w8a8", status="failed", error_class="low_agreement",
                     error="token agreement 0.5 < 0.9")
    verdict = judge(rel, failed)
    assert verdict.verdict == "FAIL" and only(verdict, "agreement", "infer/tq/w8a8")[0].status == "FAIL"
    waiver = Waiver(id="Q", cases="infer/tq/w8a8", check="threshold:token_agreement", reason="known", expires=TODAY)
    assert judge(rel, failed, waivers=[waiver]).verdict == "PASS"


# --------------------------------------------------------------------------- probes


def _probe_failed(good, name="prefix_cache", case_id="infer/tq/w8a8"):
    probes = {**good[case_id].probes, name: {"status": "failed", "detail": "garbled output"}}
    return replace(good, case_id, probes=probes)


def test_failed_probe_fails(rel, good):
    verdict = judge(rel, _probe_failed(good))
    assert verdict.verdict == "FAIL"
    [reason] = only(verdict, "probe:prefix_cache", "infer/tq/w8a8")
    assert "garbled output" in reason.message


def test_skipped_probe_is_incomplete_unless_skipped_by_setting(rel, good):
    probes = {**good["infer/tq/none"].probes, "degenerate": {"status": "skipped", "detail": "no vllm"}}
    verdict = judge(rel, replace(good, "infer/tq/none", probes=probes))
    assert verdict.verdict == "INCOMPLETE"
    [reason] = only(verdict, "probe:degenerate", "infer/tq/none")
    assert reason.status == "INCOMPLETE" and "tested nothing" in reason.message and "no vllm" in reason.message
    probes["degenerate"] = {"status": "skipped", "detail": "disabled in engine_args", "by_setting": True}
    verdict = judge(rel, replace(good, "infer/tq/none", probes=probes))
    assert verdict.verdict == "PASS"
    assert "skipped by setting" in only(verdict, "probe:degenerate", "infer/tq/none")[0].message


def test_errored_probe_is_incomplete(rel, good):
    probes = {**good["infer/tq/none"].probes, "degenerate": {"status": "error", "detail": "RuntimeError: boom"}}
    verdict = judge(rel, replace(good, "infer/tq/none", probes=probes))
    assert verdict.verdict == "INCOMPLETE"
    assert only(verdict, "probe:degenerate", "infer/tq/none")[0].status == "INCOMPLETE"


def test_probe_waiver_covers_only_matching_cases_and_checks(rel, good):
    bad = _probe_failed(good)
    waiver = Waiver(id="KI-pc", cases="infer/tq/*", check="probe:prefix_cache", reason="vLLM 0.8.5 issue",
                    expires=TODAY + dt.timedelta(days=30))
    verdict = judge(rel, bad, waivers=[waiver])
    assert verdict.verdict == "PASS"
    assert only(verdict, "probe:prefix_cache", "infer/tq/w8a8")[0].status == "WAIVED"
    other_case = Waiver(id="X", cases="infer/other/*", check="probe:prefix_cache", reason="n/a", expires=TODAY)
    other_check = Waiver(id="Y", cases="infer/tq/*", check="probe:degenerate", reason="n/a", expires=TODAY)
    assert judge(rel, bad, waivers=[other_case, other_check]).verdict == "FAIL"


def test_probe_waiver_expired_says_so(rel, good):
    waiver = Waiver(id="KI-pc", cases="infer/*", check="probe:prefix_cache", reason="issue",
                    expires=dt.date(2025, 1, 31))
    verdict = judge(rel, _probe_failed(good), waivers=[waiver])
    assert verdict.verdict == "FAIL"
    reason = only(verdict, "probe:prefix_cache", "infer/tq/w8a8")[0]
    assert "KI-pc expired on 2025-01-31" in reason.message


def test_requested_probe_not_reported_is_incomplete(rel, good):
    probes = {"prefix_cache": {"status": "passed", "detail": ""}}
    verdict = judge(rel, replace(good, "infer/tq/none", probes=probes))
    [reason] = only(verdict, "probe:degenerate", "infer/tq/none")
    assert reason.status == "INCOMPLETE" and "not reported" in reason.message


def test_probes_not_required_only_reports(good):
    rel = release(gate_extra={"probes_required": False})
    verdict = judge(rel, _probe_failed(good))
    assert verdict.verdict == "PASS"
    assert "not required" in only(verdict, "probe:prefix_cache", "infer/tq/w8a8")[0].message


# --------------------------------------------------------------------------- regression


def _scaled(rel, results, case_id, factor, seed=7, n=5, noise=0.01):
    case = next(c for c in cases_of(rel) if c.case_id == case_id)
    return {**results, case_id: as_result(case, good_doc(case, scale=factor, seed=seed, n=n, noise=noise))}


def test_true_regression_fails_with_figures(rel, good, baseline):
    slower = _scaled(rel, good, "train/tiny/base", 0.85)
    verdict = judge(rel, slower, baseline=baseline)
    assert verdict.verdict == "FAIL"
    [reason] = only(verdict, "regression", "train/tiny/base")
    assert reason.status == "FAIL" and "regression shown" in reason.message and "5 launches" in reason.message
    assert reason.figures["change"] == pytest.approx(-0.15, abs=0.02) and reason.figures["change_best"] < -0.05
    assert reason.figures["n_candidate"] == 5 and reason.figures["n_baseline"] == 5
    assert "could see >=" in reason.message and reason.figures["calibrated"] is True


def test_improvement_never_fails(rel, good, baseline):
    faster = _scaled(rel, good, "infer/tq/none", 1.5)
    verdict = judge(rel, faster, baseline=baseline)
    assert verdict.verdict == "PASS"
    assert "non-inferiority shown" in only(verdict, "regression", "infer/tq/none")[0].message


def test_a_small_change_passes_only_when_its_worst_end_is_within_the_tolerance(rel, good, baseline):
    assert judge(rel, _scaled(rel, good, "train/tiny/base", 0.99), baseline=baseline).verdict == "PASS"
    # -3% with 1% launch noise at the 5th of 8 launches: the worst end is beyond -5%, so not yet shown
    reason = only(judge(rel, _scaled(rel, good, "train/tiny/base", 0.97), baseline=baseline), "regression",
                  "train/tiny/base")[0]
    assert reason.status == "INCOMPLETE" and "undecided" in reason.message


def test_too_few_launches_are_never_a_pass_nor_a_noise_floor_ratio(rel, good, baseline):
    for factor in (0.88, 1.0, 0.6):
        few = _scaled(rel, good, "train/tiny/base", factor, n=2)
        reason = only(judge(rel, few, baseline=baseline), "regression", "train/tiny/base")[0]
        assert reason.status == "INCOMPLETE" and "min_samples" in reason.message, reason.message


def test_single_figure_without_samples_cannot_decide(rel, good, baseline):
    one = replace(good, "train/tiny/base", samples={}, metrics={"tokens_per_s": 500.0})
    one = replace(one, "train/tiny/compile", samples={})
    verdict = judge(rel, one, baseline=baseline)
    reason = only(verdict, "regression", "train/tiny/base")[0]
    assert reason.status == "INCOMPLETE" and "1 vs 5 launches" in reason.message


def test_noisy_and_undecided_is_incomplete_not_pass(rel, good, baseline):
    # 8% slower median but 25% noise: neither a regression nor non-inferiority is shown
    case_id = "train/tiny/base"
    cand = replace(good, case_id, samples={"per_launch.tokens_per_s": [920.0, 1400.0, 700.0, 1150.0, 850.0]})
    reason = only(judge(rel, cand, baseline=baseline), "regression", case_id)[0]
    assert reason.status == "INCOMPLETE" and "undecided" in reason.message


def test_history_without_calibration_is_incomplete_calibrate_or_use_paired(rel, good, baseline):
    verdict = judge(rel, good, baseline=baseline, calibrations={})
    reasons = only(verdict, "regression")
    assert verdict.verdict == "INCOMPLETE" and reasons
    assert all(r.status == "INCOMPLETE" and "calibrate" in r.message and "use paired" in r.message for r in reasons)


def test_regression_waiver(rel, good, baseline):
    slower = _scaled(rel, good, "train/tiny/base", 0.8)
    waiver = Waiver(id="R", cases="train/tiny/base", check="regression", reason="known", expires=TODAY)
    verdict = judge(rel, slower, baseline=baseline, waivers=[waiver])
    assert verdict.verdict == "PASS" and only(verdict, "regression", "train/tiny/base")[0].status == "WAIVED"


def test_regression_disabled(good, baseline):
    rel = release(gate_extra={"regression": {"enabled": False}})
    slower = _scaled(rel, good, "train/tiny/base", 0.5)
    verdict = judge(rel, slower, baseline=baseline)
    assert verdict.verdict == "PASS" and "disabled" in only(verdict, "regression")[0].message


def test_lower_is_better_regression_uses_direction():
    rel = release(training=None, inference=None,
                  custom_cases=[{"name": "nap", "kind": "sleep", "params": {"seconds": 1}}],
                  execution={"launches": {"sleep": 5}}, gate={"regression": {"max_regression": 0.05}})
    base = good_results(rel, seed=3)
    worse = good_results(rel, scale=1.2, seed=4)  # 20% more wall time: worse
    better = good_results(rel, scale=0.8, seed=4)
    worse_pct = only(judge(rel, worse, baseline=base), "regression")[0].figures["change"]
    assert worse_pct == pytest.approx(1 / 1.2 - 1, abs=0.01)  # one scale: baseline / candidate - 1 for a time
    assert judge(rel, worse, baseline=base).verdict == "FAIL"
    assert judge(rel, better, baseline=base).verdict == "PASS"


def test_candidate_without_regression_metric_fails(rel, good, baseline):
    empty = replace(good, "infer/tq/none", samples={}, metrics={"latency_s_p90": 0.5, "token_agreement": 1.0})
    reason = only(judge(rel, empty, baseline=baseline), "regression", "infer/tq/none")[0]
    assert reason.status == "FAIL" and "no output_tokens_per_s" in reason.message


# --------------------------------------------------------------------------- variant gains


def test_variant_gain_reported_either_way(rel):
    ok = judge(rel, good_results(rel, gain={"compile": 1.25}))
    [reason] = only(ok, "variant_gain")
    assert reason.status == "PASS" and "+25" in reason.message and reason.figures["gain"] == pytest.approx(0.25, abs=0.02)
    low = judge(rel, good_results(rel, gain={"compile": 1.05}))
    [reason] = only(low, "variant_gain")
    assert low.verdict == "FAIL" and reason.status == "FAIL" and "required +10.0%" in reason.message


def test_variant_gain_not_enforced_only_reports():
    rel = release(gate_extra={"variant_gains": [{"variant": "compile", "min_gain": 0.5, "enforce": False}]})
    verdict = judge(rel, good_results(rel, gain={"compile": 0.9}),
                    baseline=good_results(rel, seed=100, gain={"compile": 0.9}))
    assert verdict.verdict == "PASS"
    [reason] = only(verdict, "variant_gain")
    assert "-10" in reason.message and "not enforced" in reason.message


def test_variant_gain_missing_side_is_incomplete(rel, good):
    del good["train/tiny/base"]
    verdict = judge(rel, good)
    assert only(verdict, "variant_gain")[0].status == "INCOMPLETE"


def test_variant_gain_waiver(rel):
    waiver = Waiver(id="G", cases="train/*", check="variant_gain", reason="cpu box", expires=TODAY)
    verdict = judge(rel, good_results(rel, gain={"compile": 0.7}), waivers=[waiver],
                    baseline=good_results(rel, seed=100, gain={"compile": 0.7}))
    assert verdict.verdict == "PASS" and only(verdict, "variant_gain")[0].status == "WAIVED"


# --------------------------------------------------------------------------- properties


FAIL_D = Decision.FAIL
finite = st.floats(min_value=1.0, max_value=1e6, allow_nan=False, allow_infinity=False)


@settings(max_examples=150, deadline=None)
@given(base=st.lists(finite, min_size=1, max_size=12), factor=st.floats(min_value=1.0, max_value=10.0),
       direction=st.sampled_from(["higher", "lower"]), sd_run=st.floats(min_value=0.0, max_value=0.2))
@example(base=[1.0, 1.0, 1.0], factor=1.0, direction="higher", sd_run=1.0265511696926059e-137)  # df underflowed
def test_property_improvement_never_fails(base, factor, direction, sd_run):
    # every launch better (or equal) than its counterpart: never FAIL, in either mode
    cand = [x * factor for x in base] if direction == "higher" else [x / factor for x in base]
    assert stats.compare_history(cand, base, direction, variation=RunVariation(sd_run, 5)).decision is not FAIL_D
    assert stats.compare_pairs(cand, base, direction).decision is not FAIL_D


@settings(max_examples=100, deadline=None)
@given(samples=st.lists(finite, min_size=1, max_size=12), direction=st.sampled_from(["higher", "lower"]))
def test_property_identical_samples_never_fail(samples, direction):
    assert stats.compare_history(samples, samples, direction, variation=RunVariation(0.0, 5)).decision is not FAIL_D
    assert stats.compare_pairs(samples, samples, direction).decision is not FAIL_D


@settings(max_examples=60, deadline=None)
@given(tps=st.floats(min_value=0, max_value=1e4), minimum=st.floats(min_value=0, max_value=1e4))
def test_property_threshold_min(tps, minimum):
    rel = release(gate={"thresholds": [{"cases": "train/*", "metric": "tokens_per_s", "min": minimum}],
                        "regression": {"enabled": False}})
    results = good_results(rel)
    results = replace(results, "train/tiny/base", metrics={"tokens_per_s": tps})
    reason = only(judge(rel, results), "threshold:tokens_per_s", "train/tiny/base")[0]
    assert (reason.status == "PASS") == (tps >= minimum)


def test_result_data_from_row_like_object(rel):
    case = cases_of(rel)[0]
    doc = result_doc(case, metrics={"tokens_per_s": 5.0}, samples={"tokens_per_s": noisy(5.0)})

    class Row:
        case_id, kind, model, variant = case.case_id, case.kind, case.model, case.variant
        status, error_class, error = "passed", None, None
        metrics, samples, probes = doc["metrics"], doc["samples"], doc["probes"]
        fingerprint, attempts, environment = as_result(case, doc).fingerprint, 1, doc["environment"]

    assert ResultData.from_row(Row()) == as_result(case, doc)


# --------------------------------------------------------------------------- issue 11: holes that fooled the verdict


def test_a_variant_whose_switch_had_no_effect_fails(rel, good):
    env = {**good["train/tiny/compile"].environment, "compile_graphs": 0}
    verdict = judge(rel, replace(good, "train/tiny/compile", environment=env))
    assert verdict.verdict == "FAIL"
    [reason] = only(verdict, "variant_evidence", "train/tiny/compile")
    assert reason.status == "FAIL" and "ran eager" in reason.message
    assert only(verdict, "variant_evidence", "train/tiny/compile", "FAIL")


def test_fingerprint_mismatch_is_not_compared(rel, good, baseline):
    case = "train/tiny/base"
    other = dict(baseline[case].fingerprint or {}, **{"params.seq_len": 4096, "device": "H800 PCIe"})
    verdict = judge(rel, good, baseline=replace(baseline, case, fingerprint=other))
    [reason] = only(verdict, "regression", case)
    assert reason.status == "INCOMPLETE" and "fingerprints differ" in reason.message
    assert "params.seq_len" in reason.message and "H800 PCIe" in reason.message
    assert verdict.verdict == "INCOMPLETE"


def test_a_waiver_covers_exactly_its_check(rel, good):
    """A case that failed on low agreement, once the agreement is waived, is still judged by its threshold."""
    case = "infer/tq/w8a8"
    bad = replace(good, case, status="failed", error_class="low_agreement", error="agreement 0.5 < 0.9",
                  metrics={**good[case].metrics, "token_agreement": 0.5, "latency_s_p90": 9.0})
    waiver = Waiver(id="W-agree", cases=case, check="agreement", reason="accepted", expires=TODAY)
    verdict = judge(rel, bad, waivers=[waiver])
    assert only(verdict, "agreement", case)[0].status == "WAIVED"
    [threshold] = only(verdict, "threshold:latency_s_p90", case)
    assert threshold.status == "FAIL" and verdict.verdict == "FAIL"


def test_regression_judges_every_listed_metric_in_its_own_direction(good, baseline):
    rel = release(gate_extra={"regression": {"metrics": {"train": ["tokens_per_s", "peak_memory_bytes"],
                                                         "infer": "output_tokens_per_s"}}})
    case = next(c for c in cases_of(rel) if c.case_id == "train/tiny/base")
    grown = dict(good)
    grown[case.case_id] = dataclasses.replace(
        good[case.case_id], metrics={**good[case.case_id].metrics, "peak_memory_bytes": 2.0e9},
        samples={**good[case.case_id].samples, "per_launch.peak_memory_bytes": [2.0e9, 2.01e9, 1.99e9]})
    base = dict(baseline)
    base[case.case_id] = dataclasses.replace(
        baseline[case.case_id], metrics={**baseline[case.case_id].metrics, "peak_memory_bytes": 1.0e9},
        samples={**baseline[case.case_id].samples, "per_launch.peak_memory_bytes": [1.0e9, 1.01e9, 0.99e9]})
    verdict = judge(rel, grown, baseline=base)
    by_metric = {r.figures.get("metric"): r for r in only(verdict, "regression", case.case_id)}
    assert by_metric["tokens_per_s"].status == "PASS"
    assert by_metric["peak_memory_bytes"].status == "FAIL"  # lower is better: doubling memory regresses


def test_gain_check_is_noise_aware(good):
    """min_gain 0.0 and a variant that changes nothing: inconclusive (INCOMPLETE), never a coin-flip FAIL."""
    rel = release(gate_extra={"variant_gains": [{"variant": "compile", "baseline": "base", "min_gain": 0.0}]})
    outcomes = set()
    for seed in range(20):
        same = {cid: as_result(c, good_doc(c, seed=seed, gain={}, noise=0.03)) for cid, c in
                {c.case_id: c for c in cases_of(rel)}.items()}
        outcomes.add(only(judge(rel, same), "variant_gain")[0].status)
    assert "FAIL" not in outcomes and "INCOMPLETE" in outcomes
    clear = {cid: as_result(c, good_doc(c, gain={"compile": 1.3})) for cid, c in
             {c.case_id: c for c in cases_of(rel)}.items()}
    assert only(judge(rel, clear), "variant_gain")[0].status == "PASS"
    slower = {cid: as_result(c, good_doc(c, gain={"compile": 0.7})) for cid, c in
              {c.case_id: c for c in cases_of(rel)}.items()}
    assert only(judge(rel, slower), "variant_gain")[0].status == "FAIL"


def test_retried_cases_are_shown(rel, good):
    verdict = judge(rel, replace(good, "train/tiny/base", attempts=2))
    [reason] = only(verdict, "retries", "train/tiny/base")
    assert reason.status == "PASS" and "2 attempts" in reason.message


def test_unverified_quantization_is_incomplete(rel, good):
    case = "infer/tq/w8a8"
    env = {**good[case].environment, "quantization_verified": False,
           "quantization_not_verified_reason": "the checkpoint is a hub id"}
    verdict = judge(rel, replace(good, case, environment=env))
    [reason] = only(verdict, "quantization", case)
    assert reason.status == "INCOMPLETE" and "hub id" in reason.message and verdict.verdict == "INCOMPLETE"
    layers = [f"model.layers.{i}.mlp.down_proj" for i in range(14)]
    shown = replace(good, case, metrics={**good[case].metrics, "quantized_weights": 14, "linear_weights": 14,
                                         "quantized_share": 1.0, "weight_bytes_ratio": 0.26},
                    environment={**good[case].environment, "layer_quantization": {
                        "expected": layers, "quantized": layers, "not_quantized": ["lm_head"], "lm_head": None}})
    assert only(judge(rel, shown), "quantization", case)[0].status == "PASS"


def test_checkpointing_none_asks_for_no_evidence():
    rel = release(training={"models": [{"name": "tiny", "preset": "tiny-llama"}],
                            "variants": [{"name": "base"}, {"name": "ckpt", "activation_checkpointing": "all"}]},
                  gate_extra={"variant_gains": []})
    results = good_results(rel)
    assert [c.params["activation_checkpointing"] for c in cases_of(rel) if c.kind == "train"] == ["none", "all"]
    verdict = judge(rel, results)
    assert only(verdict, "variant_evidence", "train/tiny/base") == []
    assert only(verdict, "variant_evidence", "train/tiny/ckpt")[0].status == "PASS"
    no_effect = replace(results, "train/tiny/ckpt",
                        environment={**results["train/tiny/ckpt"].environment, "checkpointed_layers": 0})
    assert only(judge(rel, no_effect), "variant_evidence", "train/tiny/ckpt")[0].status == "FAIL"


def test_a_null_mfu_is_said_in_the_verdict(rel, good):
    case = "train/tiny/base"
    env = {**good[case].environment, "mfu_null_reason": "no peak FLOP/s for PPU/bf16 (give peak_flops_per_device)"}
    verdict = judge(rel, replace(good, case, environment=env))
    [reason] = only(verdict, "mfu", case)
    assert "MFU not computed" in reason.message and "PPU/bf16" in reason.message
    # a figure that could not be computed is disclosed, never counted as a passed check (issue 26.8)
    assert reason.status == "NOTE" and verdict.counts().get("PASS", 0) == sum(
        r.status == "PASS" for r in verdict.reasons if r.check != "mfu")
    assert all(r.status == "NOTE" for r in verdict.reasons if r.check == "mfu")
    assert verdict.verdict == judge(rel, good).verdict  # a NOTE decides nothing


def test_a_manifest_peak_needs_its_source():
    from pydantic import ValidationError

    from qualify.manifest import TrainSettings

    with pytest.raises(ValidationError, match="peak_flops_source"):
        TrainSettings(peak_flops_per_device=1e15)
    assert TrainSettings(peak_flops_per_device=1e15, peak_flops_source="vendor datasheet").peak_flops_per_device

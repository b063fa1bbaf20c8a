"""The regression checks: each throughput case against its baseline (history, paired or duet) by the
non-inferiority rule, and the variant gains an ablation must show."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from qualify import result_document
from qualify import metrics as metric_info
from qualify.manifest.cases import Case
from qualify.manifest.fingerprint import differences as fingerprint_differences
from qualify.gate import duet_stats, stats
from qualify.gate import noninferiority as ni
from qualify.gate.calibration import lookup as calibration_lookup
from qualify.manifest import GatePolicy, is_reference_case, train_case_id
from qualify.gate.reasons import PASS, FAIL, NO_BASELINE, INCOMPLETE, ResultData, Reason, _num, _passed, _pct


def series(result: ResultData, metric: str) -> list[float]:
    """The samples behind a metric that the gate tests: one figure per independent launch
    (qualify.launches), else the single reported figure. Repeats inside one process are never the
    sample count: they share the process's start-up, clocks and placement."""
    per_launch = result_document.per_launch_series(result.samples, metric)
    if per_launch:
        return [v for v in per_launch if _num(v) is not None]
    value = _num(result.metrics.get(metric))
    return [value] if value is not None else []


def _regression_status(cmp: stats.Comparison) -> str:
    """PASS only when non-inferiority is shown, FAIL only when a regression is; the rest is INCOMPLETE."""
    return {ni.Decision.PASS: PASS, ni.Decision.FAIL: FAIL, ni.Decision.UNDECIDED: INCOMPLETE}[cmp.decision]


def _launch_note(result: ResultData) -> str:
    """How many launches the case took and why (the runner's sequential stop, when it recorded one)."""
    stop = result.environment.get("sequential") if isinstance(result.environment, Mapping) else None
    if isinstance(stop, Mapping) and stop.get("reason"):
        return f" [{stop.get('launches')} launches: {stop['reason']}]"
    return ""


def check_regression(policy: GatePolicy, cases: Sequence[Case], results: Mapping[str, ResultData],
                     baseline: Mapping[str, ResultData] | None, baseline_label: str = "", *,
                     previous_named: bool | None = None,
                     calibrations: Mapping[str, ni.RunVariation] | None = None) -> list[Reason]:
    """Compare each case's regression metrics with the previous release's (qualify.gate.stats, the rule in
    qualify.gate.noninferiority): PASS when non-inferiority is shown, FAIL when a regression is, else INCOMPLETE.

    History mode counts runs: ``calibrations`` maps a result's fingerprint and metric (calibration.lookup)
    to the run-to-run variation measured for it; without one the comparison is INCOMPLETE ("calibrate, or use
    paired"). A result is compared only with a baseline result whose fingerprint matches. When a previous
    release is named and no usable baseline exists, the check is INCOMPLETE with the reason -- unless the
    policy says `baseline: optional`, when it is NO-BASELINE (reported, not failing).
    """
    reg = policy.regression
    cases = [c for c in cases if not is_reference_case(c)]  # compared with gate.reference: check_reference
    if not reg.enabled:
        return [Reason("regression", None, PASS, "regression check disabled by the policy")]
    if reg.baseline == "paired":
        return check_paired_regression(policy, cases, results)
    if reg.baseline == "duet":
        return check_duet_regression(policy, cases, results)
    named = (baseline is not None or bool(baseline_label)) if previous_named is None else previous_named
    unusable = NO_BASELINE if reg.baseline == "optional" else INCOMPLETE
    suffix = " (gate.regression.baseline: optional)" if reg.baseline == "optional" else ""
    if not named:
        # History mode without a previous release judges nothing: only a first release says so (optional).
        return [Reason("regression", None, unusable, f"no previous release named (release.previous_tag){suffix}")]
    if baseline is None:
        return [Reason("regression", None, unusable,
                       f"no usable baseline: {baseline_label or 'the previous release has no PASS run'}{suffix}")]
    reasons: list[Reason] = []
    for case in cases:
        result = results.get(case.case_id)
        if result is None:
            continue
        for metric in reg.metrics_for(case.kind):
            cand_samples = series(result, metric)
            if not cand_samples:
                if result.status == "passed":
                    reasons.append(Reason("regression", case.case_id, FAIL,
                                          f"the result has no {metric} (samples or figure) to compare with the "
                                          "baseline", {"metric": metric}))
                continue  # a failed case without the figure is the completeness check's
            base = baseline.get(case.case_id)
            why = _unusable_baseline(result, base, metric)
            if why:
                reasons.append(Reason("regression", case.case_id, unusable, f"{metric}: {why}{suffix}",
                                      {"metric": metric}))
                continue
            assert base is not None
            variation = (calibrations or {}).get(calibration_lookup(result.fingerprint, metric))
            cmp = stats.compare_history(cand_samples, series(base, metric), metric_info.direction(metric),
                                        variation=variation, metric=metric, max_regression=reg.max_regression,
                                        alpha=reg.alpha, min_samples=reg.min_samples, max_launches=reg.max_launches)
            figures = {**cmp.figures(), "calibrated": variation is not None,
                       "run_to_run": variation.sd_run if variation else None}
            reasons.append(Reason("regression", case.case_id, _regression_status(cmp),
                                  f"{metric} {cmp.message}{_launch_note(result)}", figures))
    return reasons


def check_paired_regression(policy: GatePolicy, cases: Sequence[Case],
                            results: Mapping[str, ResultData]) -> list[Reason]:
    """gate.regression.baseline: paired -- each case's launches against the previous release's launches measured
    beside them in counterbalanced order (execution.paired.run_paired), pair by pair (stats.compare_pairs). A
    case without its baseline side (the previous image could not be had, or its launch failed) is INCOMPLETE
    with the reason."""
    reg = policy.regression
    reasons: list[Reason] = []
    for case, result in _passed(cases, results):  # a missing or failed case is the completeness check's
        paired = result.environment.get("paired") if isinstance(result.environment, Mapping) else None
        for metric in reg.metrics_for(case.kind):
            cand = result_document.per_launch_series(result.samples, metric)
            base = result_document.paired_baseline_series(result.samples, metric)
            if not cand or not base:
                why = (paired or {}).get("reason") if isinstance(paired, Mapping) else None
                why = why or ("the case was not measured in pairs" if not paired else f"no paired {metric}")
                reasons.append(Reason("regression", case.case_id, INCOMPLETE, f"{metric}: paired baseline: {why}",
                                      {"metric": metric, "baseline": (paired or {}).get("baseline")}))
                continue
            cmp = stats.compare_pairs(cand, base, metric_info.direction(metric), metric=metric,
                                      max_regression=reg.max_regression, alpha=reg.alpha,
                                      min_samples=reg.min_samples, max_launches=reg.max_launches)
            figures = {**cmp.figures(), "baseline": paired.get("baseline") if paired else None,
                       "order": paired.get("order") if paired else None, "candidate": cand, "baseline_samples": base}
            reasons.append(Reason("regression", case.case_id, _regression_status(cmp),
                                  f"{metric} {cmp.message}{_launch_note(result)}", figures))
    return reasons


def check_duet_regression(policy: GatePolicy, cases: Sequence[Case],
                          results: Mapping[str, ResultData]) -> list[Reason]:
    """gate.regression.baseline: duet -- each case's per-step log ratios against the previous release run at the
    same time (execution.duet), launch pairs as blocks, side bias removed (gate/duet_stats). PASS when the worst end
    of the interval is within max_regression, FAIL when its best end is beyond it, else INCOMPLETE (the run
    already sampled up to its budget). A case measured paired instead (no node for both sides, no duet hook)
    is judged pair by pair, with the reason said."""
    reg = policy.regression
    reasons: list[Reason] = []
    for case, result in _passed(cases, results):  # a missing or failed case is the completeness check's
        env = result.environment if isinstance(result.environment, Mapping) else {}
        record = env.get("duet") if isinstance(env.get("duet"), Mapping) else {}
        blocks = [duet_stats.DuetBlock(side, tuple(ratios))
                  for side, ratios in result_document.duet_pairs(result.samples)]
        ran = [p for p in record.get("pairs") or [] if isinstance(p, Mapping)]
        left_out = [p for p in ran if p.get("problem")]
        if not blocks and record.get("mode") == "duet" and ran:
            # Measured in duet, but no pair is usable (each disturbed, or without ratios): never PASS, and never
            # judged as if paired from the same disturbed launches.
            why = "; ".join(sorted({str(p["problem"]) for p in left_out})) or "no pair gave per-step ratios"
            if record.get("busy"):
                why += f"; {record['busy']}"
            for metric in reg.metrics_for(case.kind):
                reasons.append(Reason("regression", case.case_id, INCOMPLETE,
                                      f"{metric}: duet: none of the {len(ran)} launch pairs is usable ({why})",
                                      {"metric": metric, "baseline": record.get("baseline"), "pairs": 0,
                                       "pairs_run": len(ran), "pairs_left_out": len(left_out)}))
            continue
        if not blocks:
            fallback = record.get("reason") or "the case was not measured in duet"
            for reason in check_paired_regression(policy, [case], {case.case_id: result}):
                reasons.append(Reason(reason.check, reason.case_id, reason.status,
                                      f"{reason.message} (duet: {fallback})", reason.figures))
            continue
        # The last look's share of alpha: the runner looked after the planned pairs and every two more while
        # undecided (duet_stats.Looks); judging the last look at full alpha would undo the spending.
        looks = _duet_looks(record)
        # The look the runner reached counts the pairs it ran, usable or not (a pair left out still took a look's
        # place in its schedule).
        look_alpha = looks.alpha_at(max(len(ran), len(blocks)), reg.alpha)
        interval = duet_stats.duet_interval(blocks, alpha=look_alpha) if look_alpha > 0 else None
        call = duet_stats.decide(interval, reg.max_regression)
        for metric in reg.metrics_for(case.kind):
            figures: dict[str, Any] = {"metric": metric, "baseline": record.get("baseline_image")
                                       or record.get("baseline"), "max_regression": reg.max_regression,
                                       "pairs": len(blocks), "call": call.value, "look_alpha": look_alpha,
                                       "pairs_run": max(len(ran), len(blocks)), "pairs_left_out": len(left_out),
                                       "pairs_planned": looks.planned, "pairs_budget": looks.budget,
                                       **(interval.figures() if interval else {})}
            if interval is None:
                reasons.append(Reason("regression", case.case_id, INCOMPLETE,
                                      f"{metric}: duet: {len(blocks)} launch pairs cannot give an interval (at least "
                                      f"{max(duet_stats.MIN_PAIRS, looks.planned)}, with the candidate on each side)",
                                      figures))
                continue
            side = (f"side bias {_pct(interval.side_bias or 0.0)} [{_pct(interval.side_bias_lower or 0.0)}, "
                    f"{_pct(interval.side_bias_upper or 0.0)}] removed")
            text = (f"{metric} duet: change {_pct(interval.estimate)} [worst {_pct(interval.lower)}, best "
                    f"{_pct(interval.upper)}] (one-sided {1 - look_alpha:.1%} at this look, {interval.n} launch pairs, "
                    + (f"{interval.steps} two-step units on traded cores" if ran and all(
                        p.get("traded_cores") for p in ran) else f"{interval.steps} synchronized steps")
                    + (", neighbours' CPU time removed" if ran and all(p.get("held_times") for p in ran) else "")
                    + f"; {side}"
                    + (f"; {len(left_out)} pair(s) left out: {left_out[0]['problem']}" if left_out else "") + ")")
            words = ni.MarginWords.of(reg.max_regression)  # a tolerance, or a reference's required gain
            if call == duet_stats.DuetCall.PASS:
                reasons.append(Reason("regression", case.case_id, PASS, f"{text}: {words.passed}", figures))
            elif call == duet_stats.DuetCall.FAIL:
                reasons.append(Reason("regression", case.case_id, FAIL, f"{text}: {words.failed}", figures))
            else:
                reasons.append(Reason("regression", case.case_id, INCOMPLETE,
                                      f"{text}: undecided after {interval.n} launch pairs (the budget): "
                                      f"{words.spans}", figures))
    return reasons


def check_reference(policy: GatePolicy, cases: Sequence[Case], results: Mapping[str, ResultData]) -> list[Reason]:
    """gate.reference: each reference case, the candidate measured beside the reference image (paired or duet), by
    the same interval rule against the reference's required change (gate.regression_for): PASS when the worst end
    reaches min_gain (superiority shown) or stays within max_regression, FAIL when even the best end misses it,
    else INCOMPLETE. A reference case measured without the reference beside it is INCOMPLETE with the reason."""
    ref = policy.reference
    compared = [c for c in cases if is_reference_case(c)]
    if ref is None or not compared:
        return []
    rule = policy.model_copy(update={"regression": policy.regression_for(compared[0])})
    judge = check_duet_regression if ref.mode == "duet" else check_paired_regression
    required = {"required_change": ref.required_change, "reference": ref.name, "reference_image": ref.image}
    return [Reason("reference", r.case_id, r.status, f"against {ref.name}: {r.message}", {**r.figures, **required})
            for r in judge(rule, compared, results)]


def _duet_looks(record: Mapping[str, Any]) -> duet_stats.Looks:
    """The look schedule the runner recorded (pairs_planned, pairs_budget); the smallest plan it can have when the
    record does not say (a plan with fewer looks would give the last one more alpha)."""
    planned, budget = record.get("pairs_planned"), record.get("pairs_budget")
    if isinstance(planned, int) and isinstance(budget, int) and duet_stats.MIN_PAIRS <= planned <= budget:
        return duet_stats.Looks(planned, budget)
    return duet_stats.Looks.for_planned(4)


def _unusable_baseline(result: ResultData, base: ResultData | None, metric: str) -> str | None:
    """Why the baseline result cannot be compared with this one (None when it can)."""
    if base is None:
        return "the baseline run has no result for this case"
    if base.status != "passed":
        return f"the baseline result is {base.status} ({base.error_class or 'no error class'})"
    diffs = fingerprint_differences(result.fingerprint, base.fingerprint)
    if diffs:
        return "not like for like, the fingerprints differ: " + "; ".join(diffs[:6]) + (
            f"; and {len(diffs) - 6} more" if len(diffs) > 6 else "")
    if not series(base, metric):
        return f"the baseline result has no {metric}"
    return None


def check_variant_gains(policy: GatePolicy, cases: Sequence[Case], results: Mapping[str, ResultData]) -> list[Reason]:
    """Each optimisation variant's gain over its baseline variant of the same model, same run."""
    reasons: list[Reason] = []
    train = [c for c in cases if c.kind == "train"]
    models = list(dict.fromkeys(c.model for c in train))
    for gain in policy.variant_gains:
        direction = metric_info.direction(gain.metric) if metric_info.is_known(gain.metric) else "higher"
        for model in models:
            variant_id, base_id = train_case_id(str(model), gain.variant), train_case_id(str(model), gain.baseline)
            ids = {c.case_id for c in train}
            if variant_id not in ids or base_id not in ids:
                continue
            figures: dict[str, Any] = {"metric": gain.metric, "variant": gain.variant, "baseline": gain.baseline,
                                       "min_gain": gain.min_gain, "enforce": gain.enforce}
            label = f"{gain.variant} vs {gain.baseline} on {model}"
            missing = [cid for cid in (variant_id, base_id)
                       if results.get(cid) is None or results[cid].status != "passed"
                       or not series(results[cid], gain.metric)]
            if missing:
                msg = f"{label}: cannot compute the gain, no passed {gain.metric} for {', '.join(missing)}"
                reasons.append(Reason("variant_gain", variant_id, INCOMPLETE if gain.enforce else PASS,
                                      msg + ("" if gain.enforce else " (not enforced)"), figures))
                continue
            gained = stats.gain_outcome(series(results[variant_id], gain.metric),
                                        series(results[base_id], gain.metric), direction, required=gain.min_gain,
                                        alpha=policy.regression.alpha)
            if gained is None:
                reasons.append(Reason("variant_gain", variant_id, INCOMPLETE if gain.enforce else PASS,
                                      f"{label}: fewer than 2 positive launches of {gain.metric} on a side",
                                      figures))
                continue
            iv = gained.outcome.interval
            figures.update({"gain": iv.change, "gain_low": iv.worst, "gain_high": iv.best, "alpha": iv.alpha,
                            "n": iv.n, "design": iv.design})
            outcome = gained.judgement
            msg = (f"{label}: gain {_pct(iv.change)} (one-sided {1 - iv.alpha:.0%} bounds "
                   f"{_pct(iv.worst)} .. {_pct(iv.best)}, Welch on the launches' logs), required {_pct(gain.min_gain)}: "
                   + {"met": "met (the worst end clears it)", "missed": "missed (even the best end falls short)",
                      "inconclusive": "inconclusive (the interval spans the requirement: more launches are needed "
                      "to tell)"}[outcome])
            if not gain.enforce:
                msg += " (reported only, not enforced)"
                status = PASS
            else:
                status = {"met": PASS, "missed": FAIL, "inconclusive": INCOMPLETE}[outcome]
            reasons.append(Reason("variant_gain", variant_id, status, msg, figures))
    return reasons


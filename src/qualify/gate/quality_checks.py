"""The quality checks: agreement with the reference (and with the previous release), the evidence that a
variant did what it claims (compile graphs, checkpointed layers, quantized layers), and the MFU disclosure."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from qualify import result_document
from qualify.gate import agreement as agreement_stats
from qualify.manifest.cases import Case
from qualify.manifest.fingerprint import differences as fingerprint_differences
from qualify.manifest import GatePolicy
from qualify.workloads.infer import metrics as infer_metrics
from qualify.gate.reasons import PASS, FAIL, INCOMPLETE, NOTE, ResultData, Reason, _num, _fmt, _judged, _metric_problem


def _agreement_counts(result: ResultData) -> tuple[list[float], list[float]] | None:
    """The per-sequence agreement counts of a result (the workload's first launch reports them), or None."""
    agree = result.samples.get(infer_metrics.AGREE_SERIES)
    positions = result.samples.get(infer_metrics.POSITIONS_SERIES)
    if not agree or not positions or len(agree) != len(positions):
        return None
    index = result.samples.get(result_document.LAUNCH_INDEX + infer_metrics.AGREE_SERIES)
    if index and len(index) == len(agree):  # merged launches: one launch's sequences only
        agree = [a for a, i in zip(agree, index) if i == index[0]]
        positions = [n for n, i in zip(positions, index) if i == index[0]]
    return [float(a) for a in agree], [float(n) for n in positions]


def _agreement_flags(result: ResultData) -> tuple[list[list[bool]], str] | None:
    counts = _agreement_counts(result)
    text = result.environment.get(infer_metrics.FLAGS_KEY)
    data = result.environment.get(infer_metrics.DATA_KEY)
    if counts is None or not isinstance(text, str) or not isinstance(data, str):
        return None
    try:
        return infer_metrics.unpack_flags(text, [int(n) for n in counts[1]]), data
    except ValueError:
        return None


def check_agreement(policy: GatePolicy, cases: Sequence[Case], results: Mapping[str, ResultData],
                    baseline: Mapping[str, ResultData] | None = None) -> list[Reason]:
    """Greedy token agreement with the unquantized reference (gate/agreement.py for the statistics).

    Against the scheme's minimum: PASS only when the sequence-level lower bound clears it, FAIL when the
    upper bound is below it, else INCOMPLETE. Against the previous release, where its result holds the same
    positions (same fingerprint and evaluation data): the change position by position (clustered McNemar),
    PASS when a drop beyond gate.agreement_max_drop is excluded, FAIL when one is shown, else INCOMPLETE.
    """
    reasons: list[Reason] = []
    for case, result in _judged(cases, results, "token_agreement"):
        if case.kind != "infer":
            continue
        if result.status == "failed" and result.error_class == "low_agreement":
            continue  # reported by check_completeness under this same check name
        if case.variant in policy.agreement:
            reasons.append(_agreement_minimum(policy.agreement[case.variant], case, result))  # type: ignore[index]
        if baseline is not None and result.status == "passed":
            paired = _agreement_vs_baseline(policy, case, result, baseline.get(case.case_id))
            if paired is not None:
                reasons.append(paired)
    return reasons


def _agreement_minimum(minimum: float, case: Case, result: ResultData) -> Reason:
    figures: dict[str, Any] = {"metric": "token_agreement", "scheme": case.variant, "min": minimum}
    problem = _metric_problem(result, "token_agreement")
    if problem:
        return Reason("agreement", case.case_id, FAIL,
                      f"{problem}; scheme {case.variant} needs token agreement >= {minimum:g}", {**figures, "value": None})
    value = float(result.metrics["token_agreement"])
    figures["value"] = value
    counts = _agreement_counts(result)
    interval = agreement_stats.interval_for_agreement(*counts) if counts else None
    if interval is None:
        return Reason("agreement", case.case_id, INCOMPLETE,
                      f"token agreement {value:.4f} has no per-sequence counts (at least 2 sequences in samples "
                      f"{infer_metrics.AGREE_SERIES}/{infer_metrics.POSITIONS_SERIES}), so it cannot be bounded "
                      f"against the minimum {minimum:g} for {case.variant}", figures)
    if abs(interval.value - value) > 1e-9:
        return Reason("agreement", case.case_id, INCOMPLETE,
                      f"token agreement {value:.4f} is not what its per-sequence counts give ({interval.value:.4f}): "
                      "the result contradicts itself and cannot be judged", {**figures, "counted": interval.value})
    figures.update(interval.figures())
    call = agreement_stats.decide_against_minimum(interval, minimum)
    over = (f"over {interval.positions:,} positions in {interval.sequences} sequences, design effect "
            f"{interval.design_effect:.2f}")
    if call is agreement_stats.Call.PASS:
        return Reason("agreement", case.case_id, PASS,
                      f"token agreement {value:.4f}, lower bound {interval.low:.4f} >= {minimum:g} for "
                      f"{case.variant} ({1 - interval.alpha:.0%} one-sided, {over})", figures)
    if call is agreement_stats.Call.FAIL:
        return Reason("agreement", case.case_id, FAIL,
                      f"token agreement {value:.4f}, upper bound {interval.high:.4f} < {minimum:g} for "
                      f"{case.variant} ({1 - interval.alpha:.0%} one-sided, {over})", figures)
    needed = agreement_stats.sequences_to_decide(interval, minimum)
    figures["sequences_needed"] = needed
    return Reason("agreement", case.case_id, INCOMPLETE,
                  f"token agreement {value:.4f}: its {interval.confidence:.0%} interval {interval.low:.4f} .. "
                  f"{interval.high:.4f} ({over}) spans the minimum {minimum:g} for {case.variant}: undecided"
                  + (f"; about {needed} sequences would decide it (eval_sequences)" if needed else ""), figures)


def _agreement_vs_baseline(policy: GatePolicy, case: Case, result: ResultData,
                           base: ResultData | None) -> Reason | None:
    """The paired comparison with the previous release's result, or None when it holds no such positions."""
    if base is None or base.status != "passed":
        return None
    # Like for like, except the launch count: the agreement comes from one launch on either side.
    if [d for d in fingerprint_differences(result.fingerprint, base.fingerprint) if not d.startswith("launches:")]:
        return None
    cand, prev = _agreement_flags(result), _agreement_flags(base)
    if cand is None or prev is None or cand[1] != prev[1]:
        return None  # no per-position flags on a side, or other evaluation data: not the same positions
    try:
        cmp = agreement_stats.compare_paired(cand[0], prev[0])
    except ValueError:
        return None
    if cmp is None:
        return None
    max_drop = policy.agreement_max_drop
    figures = {"metric": "token_agreement", "scheme": case.variant, "max_drop": max_drop, **cmp.figures()}
    call = cmp.decide(max_drop)
    what = (f"token agreement vs the previous release on the same {cmp.positions:,} positions: "
            f"{cmp.baseline:.4f} -> {cmp.candidate:.4f} ({cmp.change * 100:+.2f} points, "
            f"{1 - 2 * cmp.alpha:.0%} interval {cmp.low * 100:+.2f} .. {cmp.high * 100:+.2f}; "
            f"{cmp.only_baseline} positions only the baseline gets right, {cmp.only_candidate} only the candidate"
            + (f", clustered McNemar p = {cmp.p_drop:.3g} for a drop" if cmp.p_drop is not None else "") + ")")
    if call is agreement_stats.Call.PASS:
        return Reason("agreement", case.case_id, PASS, f"{what}: no drop beyond {max_drop * 100:g} points", figures)
    if call is agreement_stats.Call.FAIL:
        return Reason("agreement", case.case_id, FAIL, f"{what}: a drop beyond {max_drop * 100:g} points", figures)
    return Reason("agreement", case.case_id, INCOMPLETE,
                  f"{what}: undecided whether it dropped beyond {max_drop * 100:g} points", figures)


def check_variant_evidence(cases: Sequence[Case], results: Mapping[str, ResultData]) -> list[Reason]:
    """A training variant counts only when the workload reports that its switch took effect
    (evidence over flags): compile produced graphs, checkpointing wrapped layers."""
    reasons: list[Reason] = []
    for case in cases:
        result = results.get(case.case_id)
        if case.kind != "train" or result is None or result.status != "passed":
            continue
        env = result.environment
        problems, facts = [], []
        if case.params.get("compile"):
            graphs, breaks = env.get("compile_graphs"), env.get("compile_graph_breaks")
            if not isinstance(graphs, int) or graphs <= 0:
                problems.append(f"torch.compile was asked for but no compiled graph was reported "
                                f"(compile_graphs={graphs!r}): the variant ran eager")
            else:
                facts.append(f"{graphs} compiled graph(s), {breaks if breaks is not None else 'n/a'} graph break(s)")
        if case.params.get("activation_checkpointing") not in (None, False, 0, "none"):  # "all" or a layer count
            layers = env.get("checkpointed_layers")
            if not isinstance(layers, int) or layers <= 0:
                problems.append(f"activation checkpointing was asked for but no layer was checkpointed "
                                f"(checkpointed_layers={layers!r})")
            else:
                facts.append(f"{layers} checkpointed layer(s)")
        figures = {k: env.get(k) for k in ("compile_graphs", "compile_graph_breaks", "checkpointed_layers",
                                            "activation_memory_bytes") if k in env}
        if problems:
            reasons.append(Reason("variant_evidence", case.case_id, FAIL, "; ".join(problems), figures))
        elif facts:
            reasons.append(Reason("variant_evidence", case.case_id, PASS, "; ".join(facts), figures))
    return reasons


def check_mfu_reported(cases: Sequence[Case], results: Mapping[str, ResultData]) -> list[Reason]:
    """Say in the verdict where each training MFU's peak came from, and why an MFU is null (an unknown
    (device, dtype) pair): a null MFU is never a silent gap (a threshold on `mfu` fails on it). Both are NOTEs:
    disclosures, not checks, so a figure that could not be computed never counts as a passed check."""
    reasons: list[Reason] = []
    for case in cases:
        result = results.get(case.case_id)
        if case.kind != "train" or result is None or result.status != "passed":
            continue
        mfu, env = _num(result.metrics.get("mfu")), result.environment
        if mfu is None:
            why = env.get("mfu_null_reason") or "no peak FLOP/s for this device and dtype"
            reasons.append(Reason("mfu", case.case_id, NOTE, f"MFU not computed: {why}", {"mfu": None}))
        else:
            source = env.get("peak_source") or env.get("peak_flops_source") or "unknown"
            reasons.append(Reason("mfu", case.case_id, NOTE, f"MFU {mfu:.3f} (peak from {source})",
                                  {"mfu": mfu, "peak_source": source}))
    return reasons


def check_quantization_evidence(cases: Sequence[Case], results: Mapping[str, ResultData]) -> list[Reason]:
    """A quantized scheme counts only when its weights were read back as quantized (the workload fails a case
    whose weights did not shrink as `quantization_not_applied`); a checkpoint that could not be read back
    proved nothing and is INCOMPLETE."""
    reasons: list[Reason] = []
    for case in cases:
        result = results.get(case.case_id)
        if case.kind != "infer" or case.variant in (None, "none") or result is None or result.status != "passed":
            continue
        env, metrics = result.environment, result.metrics
        figures = {k: metrics.get(k) for k in ("quantized_weights", "linear_weights", "quantized_share",
                                                "weight_bytes_ratio") if k in metrics}
        if env.get("quantization_verified") is False:
            reasons.append(Reason("quantization", case.case_id, INCOMPLETE,
                                  f"the {case.variant} weights were not read back: "
                                  f"{env.get('quantization_not_verified_reason') or 'no reason given'}", figures))
        elif figures.get("quantized_weights") is not None:
            reasons.append(_layer_reason(case, env.get(LAYER_EVIDENCE), figures))
    return reasons


LAYER_EVIDENCE = "layer_quantization"  # qualify.workloads.infer.layer_evidence.KEY


_NAMED = 8  # layers named in a message (all of them are in the figures)


def _layer_reason(case: Case, evidence: Any, figures: dict[str, Any]) -> Reason:
    """Exactly the layers the scheme should quantize are quantized (issue 24.5): a byte ratio lets a third of the
    layers stay in float; the names do not. lm_head is expected only with quantize_lm_head."""
    if not isinstance(evidence, dict) or not isinstance(evidence.get("expected"), list) \
            or not isinstance(evidence.get("quantized"), list) or not evidence["expected"]:
        return Reason("quantization", case.case_id, INCOMPLETE,
                      f"the {case.variant} result reports read-back figures but no per-layer evidence (which linear "
                      "layers are quantized): it cannot show that every layer the scheme targets was quantized",
                      figures)
    expected, quantized = set(map(str, evidence["expected"])), set(map(str, evidence["quantized"]))
    missing, extra = sorted(expected - quantized), sorted(quantized - expected)
    figures = {**figures, "layers_expected": len(expected), "layers_quantized": len(quantized & expected),
               "layers_left_in_float": missing, "layers_quantized_unexpectedly": extra}
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"{len(missing)} of {len(expected)} layers the scheme quantizes are not quantized: "
                         f"{', '.join(missing[:_NAMED])}{' ...' if len(missing) > _NAMED else ''}")
        if extra:
            parts.append(f"{len(extra)} layers outside the scheme are quantized: "
                         f"{', '.join(extra[:_NAMED])}{' ...' if len(extra) > _NAMED else ''}"
                         + (" (lm_head is quantized only with quantize_lm_head)"
                            if any(x.rsplit('.', 1)[-1] == "lm_head" for x in extra) else ""))
        return Reason("quantization", case.case_id, FAIL, f"{case.variant}: " + "; ".join(parts), figures)
    share, ratio = figures.get("quantized_share"), figures.get("weight_bytes_ratio")
    return Reason("quantization", case.case_id, PASS,
                  f"all {len(expected)} linear layers the scheme targets are quantized and no other (share "
                  f"{_fmt(share)}), weight bytes x{_fmt(ratio)} of the reference", figures)


"""The gate's checks: pure functions from plain data to reasons.

Each check returns a list of Reason; a reason's ``check`` names what a waiver matches
(``component:<name>``, ``threshold:<metric>``, ``agreement``, ``probe:<name>``, ``regression``,
``variant_gain``), its ``case_id`` the case (None for run-wide lines). Waivers are applied
afterwards by :func:`apply_waivers`, so every check stays a plain comparison.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from qualify import result_document
from qualify import metrics as metric_info
from qualify.gate import agreement as agreement_stats
from qualify.manifest.cases import Case
from qualify.manifest.fingerprint import differences as fingerprint_differences
from qualify.gate import duet_stats, stats
from qualify.gate import noninferiority as ni
from qualify.gate.calibration import lookup as calibration_lookup
from qualify.manifest import WAIVABLE_CHECKS, WAIVABLE_FAMILIES, Component, GatePolicy, Waiver
from qualify.outcomes import CheckStatus
from qualify.workloads.infer import metrics as infer_metrics

PASS, FAIL, WAIVED, NO_BASELINE, INCOMPLETE, NOTE = (CheckStatus.PASS, CheckStatus.FAIL, CheckStatus.WAIVED,
                                                     CheckStatus.NO_BASELINE, CheckStatus.INCOMPLETE, CheckStatus.NOTE)
REASON_STATUSES = tuple(CheckStatus)

# Checks a waiver can cover; completeness (a case that did not produce a good result) cannot be waived.
# What a waiver may name is checked at validation (qualify.manifest.waiver_check_problem).
WAIVABLE_PREFIXES = tuple(f"{f}:" for f in WAIVABLE_FAMILIES) + WAIVABLE_CHECKS


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class ResultData:
    """One final case result as the gate sees it (from a CaseResult row or a result document)."""

    case_id: str
    kind: str
    status: str  # passed | failed | error
    error_class: str | None = None
    error: str | None = None
    metrics: Mapping[str, Any] = field(default_factory=dict)
    samples: Mapping[str, Sequence[float]] = field(default_factory=dict)
    probes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    model: str | None = None
    variant: str | None = None
    fingerprint: Mapping[str, Any] | None = None  # qualify.manifest.fingerprint: what it may be compared with
    attempts: int = 1
    environment: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_row(cls, row: Any) -> "ResultData":
        return cls(case_id=row.case_id, kind=row.kind, status=row.status, error_class=row.error_class,
                   error=row.error, metrics=dict(row.metrics or {}), samples=dict(row.samples or {}),
                   probes=dict(row.probes or {}), model=row.model, variant=row.variant,
                   fingerprint=dict(row.fingerprint) if row.fingerprint else None, attempts=row.attempts or 1,
                   environment=dict(row.environment or {}))

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any], *, model: str | None = None, variant: str | None = None,
                 fingerprint: Mapping[str, Any] | None = None, attempts: int = 1) -> "ResultData":
        return cls(case_id=doc["case_id"], kind=doc.get("kind") or "", status=doc["status"],
                   error_class=doc.get("error_class"), error=doc.get("error"),
                   metrics=dict(doc.get("metrics") or {}), samples=dict(doc.get("samples") or {}),
                   probes=dict(doc.get("probes") or {}), model=model, variant=variant,
                   fingerprint=fingerprint, attempts=attempts, environment=dict(doc.get("environment") or {}))


@dataclass(frozen=True)
class ComponentData:
    name: str
    ok: bool
    expected: str = ""
    actual: str | None = None
    rule: str = "exact"
    optional: bool = False
    detail: str = ""

    @classmethod
    def from_row(cls, row: Any) -> "ComponentData":
        return cls(name=row.name, ok=bool(row.ok), expected=row.expected, actual=row.actual, rule=row.rule,
                   optional=bool(row.optional), detail=row.detail or "")


@dataclass
class Reason:
    check: str
    case_id: str | None
    status: str
    message: str
    figures: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        # The stored message names its case: `qualify runs show` prints status, check and message only.
        message = self.message
        if self.case_id and not message.startswith(self.case_id):
            message = f"{self.case_id}: {message}"
        return {"check": self.check, "case_id": self.case_id, "status": self.status,
                "message": message, "figures": _json_safe(self.figures)}


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, (dt.date, dt.datetime)):
        return value.isoformat()
    return value


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(float(value)) else None


def _fmt(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.4g}"


def _pct(value: float) -> str:
    return f"{value * 100:+.1f}%"


# --------------------------------------------------------------------------- completeness


def check_completeness(cases: Sequence[Case], results: Mapping[str, ResultData]) -> list[Reason]:
    """Every expanded case has a final result; an error fails, an infrastructure error or a
    missing result is INCOMPLETE (never a silent PASS)."""
    reasons: list[Reason] = []
    good = 0
    for case in cases:
        result = results.get(case.case_id)
        if result is None:
            reasons.append(Reason("completeness", case.case_id, INCOMPLETE, "no final result recorded"))
        elif result.status == "passed":
            good += 1
        elif result.status == "error" and result.error_class == "infra":
            reasons.append(Reason("completeness", case.case_id, INCOMPLETE,
                                  f"infrastructure error, the case did not run to the end: {_short(result.error)}",
                                  {"error_class": "infra"}))
        elif result.status == "failed" and result.error_class == "low_agreement":
            # The workload applied the policy's own minimum (cases.expand passes it in): reported
            # under the agreement check so that the same waiver can cover it.
            reasons.append(Reason("agreement", case.case_id, FAIL,
                                  f"the case failed its token-agreement check: {_short(result.error)}",
                                  {"error_class": result.error_class}))
        else:
            what = "errored" if result.status == "error" else "failed"
            reasons.append(Reason("completeness", case.case_id, FAIL,
                                  f"case {what} ({result.error_class or 'no error class'}): {_short(result.error)}",
                                  {"error_class": result.error_class, "result_status": result.status}))
    if cases and good == len(cases):
        reasons.insert(0, Reason("completeness", None, PASS, f"all {len(cases)} cases passed",
                                 {"cases": len(cases)}))
    elif not cases:
        reasons.append(Reason("completeness", None, INCOMPLETE, "the manifest expands to no case"))
    return reasons


def _short(text: str | None, limit: int = 300) -> str:
    if not text:
        return "no message"
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


# --------------------------------------------------------------------------- components


def check_components(expected: Sequence[Component], checks: Sequence[ComponentData]) -> list[Reason]:
    reasons: list[Reason] = []
    by_name = {c.name: c for c in checks}
    for comp in expected:
        if comp.name not in by_name:
            if comp.optional:
                reasons.append(Reason(f"component:{comp.name}", None, PASS,
                                      f"optional component {comp.name} was not checked"))
            else:
                reasons.append(Reason(f"component:{comp.name}", None, INCOMPLETE,
                                      f"component {comp.name} was not checked (expected {comp.expected})"))
    for check in checks:
        figures = {"expected": check.expected, "actual": check.actual, "rule": check.rule,
                   "optional": check.optional}
        if check.ok:
            reasons.append(Reason(f"component:{check.name}", None, PASS,
                                  f"{check.name} {check.actual} matches {check.expected} ({check.rule})", figures))
        elif check.optional and check.actual is None:
            reasons.append(Reason(f"component:{check.name}", None, PASS,
                                  f"optional component {check.name} is not installed", figures))
        else:
            found = check.actual if check.actual is not None else "not found"
            detail = f" ({check.detail})" if check.detail else ""
            reasons.append(Reason(f"component:{check.name}", None, FAIL,
                                  f"{check.name}: expected {check.expected} ({check.rule}), found {found}{detail}",
                                  figures))
    return reasons


# --------------------------------------------------------------------------- thresholds, agreement


def _passed(cases: Sequence[Case], results: Mapping[str, ResultData]) -> list[tuple[Case, ResultData]]:
    out = []
    for case in cases:
        result = results.get(case.case_id)
        if result is not None and result.status == "passed":
            out.append((case, result))
    return out


def _judged(cases: Sequence[Case], results: Mapping[str, ResultData],
            metric: str) -> list[tuple[Case, ResultData]]:
    """The results a metric check applies to: every passed result (a missing metric then fails), and
    every failed or errored result that still reports the metric. A waiver of another check (or a
    case's failure) never exempts a figure from its own check."""
    out = []
    for case in cases:
        result = results.get(case.case_id)
        if result is None:
            continue
        if result.status == "passed" or _num(result.metrics.get(metric)) is not None:
            out.append((case, result))
    return out


def _metric_problem(result: ResultData, metric: str) -> str | None:
    if metric not in result.metrics:
        return f"{metric} is missing from the result"
    value = result.metrics[metric]
    if value is None:
        return f"{metric} is null in the result (not measured or not finite)"
    if _num(value) is None:
        return f"{metric} is not a number ({value!r})"
    return None


def check_thresholds(policy: GatePolicy, cases: Sequence[Case], results: Mapping[str, ResultData]) -> list[Reason]:
    """Absolute bounds per case glob and metric: ``min`` for higher-is-better figures, ``max`` for
    lower-is-better ones (both may be given). Every result that reports the metric is judged,
    whatever its status (a failed case is also the completeness check's)."""
    reasons: list[Reason] = []
    for threshold in policy.thresholds:
        ran = _judged(cases, results, threshold.metric)
        check = f"threshold:{threshold.metric}"
        covered = [c for c in cases if fnmatch.fnmatchcase(c.case_id, threshold.cases)]
        if not covered:
            reasons.append(Reason(check, None, PASS,
                                  f"threshold on {threshold.metric} for {threshold.cases!r} covers no case of this run"))
            continue
        bound = " and ".join(filter(None, [
            f">= {threshold.min:g}" if threshold.min is not None else "",
            f"<= {threshold.max:g}" if threshold.max is not None else ""]))
        for case, result in ran:
            if not fnmatch.fnmatchcase(case.case_id, threshold.cases):
                continue
            figures: dict[str, Any] = {"metric": threshold.metric, "min": threshold.min, "max": threshold.max}
            problem = _metric_problem(result, threshold.metric)
            if problem:
                reasons.append(Reason(check, case.case_id, FAIL, f"{problem}; the threshold needs {bound}",
                                      {**figures, "value": None}))
                continue
            value = float(result.metrics[threshold.metric])
            figures["value"] = value
            low = threshold.min is not None and value < threshold.min
            high = threshold.max is not None and value > threshold.max
            if low or high:
                side = f"below the minimum {threshold.min:g}" if low else f"above the maximum {threshold.max:g}"
                reasons.append(Reason(check, case.case_id, FAIL, f"{threshold.metric} = {_fmt(value)} is {side}",
                                      figures))
            else:
                reasons.append(Reason(check, case.case_id, PASS, f"{threshold.metric} = {_fmt(value)} {bound}",
                                      figures))
    return reasons


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


# --------------------------------------------------------------------------- probes


def check_probes(policy: GatePolicy, cases: Sequence[Case], results: Mapping[str, ResultData]) -> list[Reason]:
    """One check per probe, `probe:<name>`, so that a waiver or `probes_required: false` covers exactly it.

    passed -> PASS; failed -> FAIL (or PASS, said so, when probes are not required); skipped by an explicit
    setting (the workload marks it `by_setting`) -> PASS; skipped for any other reason, errored, or
    requested and not reported -> INCOMPLETE with the reason: a probe that did not run proved nothing.
    """
    reasons: list[Reason] = []
    for case in cases:
        result = results.get(case.case_id)
        if case.kind != "infer" or result is None or (result.status == "error" and not result.probes):
            continue
        requested = case.params.get("probes")
        for name in sorted(set(requested or ()) | set(result.probes)):
            check = f"probe:{name}"
            probe = result.probes.get(name)
            if probe is None:
                reasons.append(Reason(check, case.case_id, INCOMPLETE, f"probe {name} was requested but not reported",
                                      {"probe_status": "missing"}))
                continue
            status, detail = str(probe.get("status")), _short(str(probe.get("detail") or ""))
            figures = {"probe_status": status}
            if status == "passed":
                reasons.append(Reason(check, case.case_id, PASS, f"probe {name} passed: {detail}", figures))
            elif status == "skipped" and probe.get("by_setting"):
                reasons.append(Reason(check, case.case_id, PASS, f"probe {name} skipped by setting: {detail}",
                                      figures))
            elif status == "failed":
                if policy.probes_required:
                    reasons.append(Reason(check, case.case_id, FAIL, f"probe {name} failed: {detail}", figures))
                else:
                    reasons.append(Reason(check, case.case_id, PASS,
                                          f"probe {name} failed: {detail} (probes not required)", figures))
            else:
                reasons.append(Reason(check, case.case_id, INCOMPLETE,
                                      f"probe {name} {status}, so it tested nothing: {detail}", figures))
    return reasons


# --------------------------------------------------------------------------- regression


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
    for case in cases:
        result = results.get(case.case_id)
        if result is None or result.status != "passed":
            continue  # a missing or failed case is the completeness check's
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
    for case in cases:
        result = results.get(case.case_id)
        if result is None or result.status != "passed":
            continue  # a missing or failed case is the completeness check's
        env = result.environment if isinstance(result.environment, Mapping) else {}
        record = env.get("duet") if isinstance(env.get("duet"), Mapping) else {}
        blocks = [duet_stats.DuetBlock(side, tuple(ratios))
                  for side, ratios in result_document.duet_pairs(result.samples)]
        if not blocks:
            fallback = record.get("reason") or "the case was not measured in duet"
            for reason in check_paired_regression(policy, [case], {case.case_id: result}):
                reasons.append(Reason(reason.check, reason.case_id, reason.status,
                                      f"{reason.message} (duet: {fallback})", reason.figures))
            continue
        # The last look's share of alpha: the runner looked after the planned pairs and every two more while
        # undecided (duet_stats.Looks); judging the last look at full alpha would undo the spending.
        looks = _duet_looks(record)
        look_alpha = looks.alpha_at(len(blocks), reg.alpha)
        interval = duet_stats.duet_interval(blocks, alpha=look_alpha) if look_alpha > 0 else None
        call = duet_stats.decide(interval, reg.max_regression)
        for metric in reg.metrics_for(case.kind):
            figures: dict[str, Any] = {"metric": metric, "baseline": record.get("baseline"),
                                       "pairs": len(blocks), "call": call.value, "look_alpha": look_alpha,
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
                    f"{interval.steps} synchronized steps; {side})")
            if call == duet_stats.DuetCall.PASS:
                reasons.append(Reason("regression", case.case_id, PASS,
                                      f"{text}: within the {reg.max_regression:.0%} tolerance", figures))
            elif call == duet_stats.DuetCall.FAIL:
                reasons.append(Reason("regression", case.case_id, FAIL,
                                      f"{text}: regression beyond {reg.max_regression:.0%}", figures))
            else:
                reasons.append(Reason("regression", case.case_id, INCOMPLETE,
                                      f"{text}: undecided after {interval.n} launch pairs (the budget): neither "
                                      f"within {reg.max_regression:.0%} nor a regression shown", figures))
    return reasons


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


def check_retries(cases: Sequence[Case], results: Mapping[str, ResultData]) -> list[Reason]:
    """Every case that needed more than one attempt is shown (a flaky pass is still a pass, but visible)."""
    reasons = []
    for case in cases:
        result = results.get(case.case_id)
        if result is not None and result.attempts > 1:
            reasons.append(Reason("retries", case.case_id, PASS,
                                  f"{result.attempts} attempts (infrastructure retries); final: {result.status}",
                                  {"attempts": result.attempts}))
    return reasons


# --------------------------------------------------------------------------- variant gains


def check_variant_gains(policy: GatePolicy, cases: Sequence[Case], results: Mapping[str, ResultData]) -> list[Reason]:
    """Each optimisation variant's gain over its baseline variant of the same model, same run."""
    reasons: list[Reason] = []
    train = [c for c in cases if c.kind == "train"]
    models = list(dict.fromkeys(c.model for c in train))
    for gain in policy.variant_gains:
        direction = metric_info.direction(gain.metric) if metric_info.is_known(gain.metric) else "higher"
        for model in models:
            variant_id, base_id = f"train/{model}/{gain.variant}", f"train/{model}/{gain.baseline}"
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


# --------------------------------------------------------------------------- variant evidence


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


# --------------------------------------------------------------------------- waivers


def _waivable(check: str) -> bool:
    return check in WAIVABLE_CHECKS or any(check.startswith(p) for p in WAIVABLE_PREFIXES if p.endswith(":"))


def _waiver_subject(reason: Reason) -> str:
    # Component lines are run-wide: a waiver's `cases` glob is matched against the component name.
    if reason.case_id is not None:
        return reason.case_id
    if reason.check.startswith("component:"):
        return reason.check.split(":", 1)[1]
    return "*"


def _covers(waiver: Waiver, subject: str, check: str) -> bool:
    if waiver.covers(subject, check):
        return True
    # The agreement check is a threshold on token_agreement: accept either spelling.
    return check == "agreement" and waiver.covers(subject, "threshold:token_agreement")


def apply_waivers(reasons: Iterable[Reason], waivers: Sequence[Waiver], today: dt.date) -> list[Reason]:
    """A FAIL covered by a waiver that has not expired becomes WAIVED; an expired waiver does not
    cover (expired means ``expires < today``, as manifest validation counts it) and the reason
    says so."""
    out: list[Reason] = []
    for reason in reasons:
        if reason.status != FAIL or not _waivable(reason.check):
            out.append(reason)
            continue
        subject = _waiver_subject(reason)
        covering = [w for w in waivers if _covers(w, subject, reason.check)]
        valid = [w for w in covering if w.expires >= today]
        expired = [w for w in covering if w.expires < today]
        if valid:
            w = valid[0]
            out.append(Reason(reason.check, reason.case_id, WAIVED,
                              f"{reason.message} [waived by {w.id} until {w.expires.isoformat()}: {w.reason}]",
                              {**reason.figures, "waiver": w.id, "waiver_expires": w.expires.isoformat()}))
        elif expired:
            names = ", ".join(f"{w.id} expired on {w.expires.isoformat()}" for w in expired)
            out.append(Reason(reason.check, reason.case_id, FAIL, f"{reason.message} [waiver {names}]",
                              {**reason.figures, "expired_waivers": [w.id for w in expired]}))
        else:
            out.append(reason)
    return out

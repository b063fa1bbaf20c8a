"""The gate's checks: pure functions from plain data to reasons.

Each check returns a list of Reason; a reason's ``check`` names what a waiver matches
(``component:<name>``, ``threshold:<metric>``, ``agreement``, ``probe:<name>``, ``regression``,
``variant_gain``), its ``case_id`` the case (None for run-wide lines). Waivers are applied
afterwards by :func:`apply_waivers`, so every check stays a plain comparison.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
from typing import Any, Iterable, Mapping, Sequence

from qualify.manifest.cases import Case
from qualify.manifest import WAIVABLE_CHECKS, WAIVABLE_FAMILIES, Component, GatePolicy, Waiver
from qualify.gate.quality_checks import (LAYER_EVIDENCE, check_agreement, check_mfu_reported,
                                         check_quantization_evidence, check_variant_evidence)
from qualify.gate.reasons import (FAIL, INCOMPLETE, NO_BASELINE, NOTE, PASS, REASON_STATUSES, WAIVED, ComponentData,
                                  Reason, ResultData, _fmt, _judged, _metric_problem, _short)
from qualify.gate.regression_checks import (check_duet_regression, check_paired_regression, check_reference,
                                            check_regression, check_variant_gains, series)

# The gate's checks and their data, importable from here (the check families live in reasons, regression_checks
# and quality_checks; this module holds the run-wide checks and the waivers).
__all__ = ["PASS", "FAIL", "WAIVED", "NO_BASELINE", "INCOMPLETE", "NOTE", "REASON_STATUSES", "ResultData",
           "ComponentData", "Reason", "LAYER_EVIDENCE", "WAIVABLE_PREFIXES", "series", "check_completeness",
           "check_components", "check_thresholds", "check_probes", "check_retries", "check_regression",
           "check_reference", "check_paired_regression", "check_duet_regression", "check_variant_gains", "check_agreement",
           "check_variant_evidence", "check_mfu_reported", "check_quantization_evidence", "apply_waivers"]


# Checks a waiver can cover; completeness (a case that did not produce a good result) cannot be waived.
# What a waiver may name is checked at validation (qualify.manifest.waiver_check_problem).
WAIVABLE_PREFIXES = tuple(f"{f}:" for f in WAIVABLE_FAMILIES) + WAIVABLE_CHECKS


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


def check_components(expected: Sequence[Component], checks: Sequence[ComponentData], image: str = "") -> list[Reason]:
    """One image's components (image "": the release's own; a further image's checks are named `<image>/<name>`
    and only its own rows count)."""
    reasons: list[Reason] = []
    checks = [c for c in checks if c.image == image]
    by_name = {c.name: c for c in checks}
    label = f"{image}/" if image else ""
    for comp in expected:
        if comp.name not in by_name:
            if comp.optional:
                reasons.append(Reason(f"component:{label}{comp.name}", None, PASS,
                                      f"optional component {label}{comp.name} was not checked"))
            else:
                reasons.append(Reason(f"component:{label}{comp.name}", None, INCOMPLETE,
                                      f"component {label}{comp.name} was not checked (expected {comp.expected})"))
    for check in checks:
        name = f"{label}{check.name}"
        figures = {"expected": check.expected, "actual": check.actual, "rule": check.rule,
                   "optional": check.optional} | ({"image": image} if image else {})
        if check.ok:
            reasons.append(Reason(f"component:{name}", None, PASS,
                                  f"{name} {check.actual} matches {check.expected} ({check.rule})", figures))
        elif check.optional and check.actual is None:
            reasons.append(Reason(f"component:{name}", None, PASS,
                                  f"optional component {name} is not installed", figures))
        else:
            found = check.actual if check.actual is not None else "not found"
            detail = f" ({check.detail})" if check.detail else ""
            reasons.append(Reason(f"component:{name}", None, FAIL,
                                  f"{name}: expected {check.expected} ({check.rule}), found {found}{detail}",
                                  figures))
    return reasons


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


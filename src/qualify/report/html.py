"""The run report a release manager reads: one self-contained HTML file (charts embedded as data URIs), so
it can be attached to a ticket.

Order: the verdict banner and what failed or is incomplete (passed checks folded), the run and its image,
components, training (table and, per model, tokens/s, MFU and each variant's gain over its baseline drawn
as an ablation chart), the comparison with the baseline run per case, inference (table and charts),
probes, waivers in force, retries, every case, and the environment. Input: reporting.report_view.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any, Iterable, Sequence

from qualify.numbers import signed_pct
from qualify.manifest.policy import is_reference_case
from qualify.report import charts
from qualify.report.views import STATUS_ORDER, fmt_number, reasons_by_status

esc = html.escape

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:0;color:#1f2328;background:#fff}
main{max-width:1250px;margin:0 auto;padding:0 24px 48px}
h2{border-bottom:1px solid #d0d7de;padding-bottom:4px;margin-top:34px}
h3{margin-bottom:6px}
table{border-collapse:collapse;font-size:13px;margin:8px 0}
td,th{border:1px solid #d0d7de;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#f6f8fa}
td.num{text-align:right;font-variant-numeric:tabular-nums}
code{font-size:12px}
.banner{padding:18px 24px;color:#fff}
.banner h1{margin:0;font-size:26px}
.banner .sub{margin-top:6px;font-size:14px;opacity:.95}
.v-PASS{background:#1a7f37}.v-FAIL{background:#cf222e}.v-INCOMPLETE{background:#9a6700}.v-none{background:#57606a}
.counts span{display:inline-block;margin-right:12px}
nav{font-size:13px;padding:8px 0;border-bottom:1px solid #d0d7de}
nav a{margin-right:12px;color:#0969da;text-decoration:none}
.PASS{color:#1a7f37}.FAIL{color:#cf222e;font-weight:600}.INCOMPLETE{color:#9a6700;font-weight:600}
.WAIVED,.NO-BASELINE,.NOTE{color:#57606a}
.regression{color:#cf222e;font-weight:600}.improvement{color:#1a7f37}.within-tolerance{color:#1a7f37}.undecided{color:#9a6700}
.missing,.not-comparable{color:#9a6700}
tr.bad td{background:#ffebe9}
details{margin:8px 0}summary{cursor:pointer;color:#0969da}
pre{background:#f6f8fa;padding:8px;font-size:12px;overflow-x:auto;max-height:320px}
.note{color:#57606a;font-size:13px}
img.chart{max-width:100%;border:1px solid #d0d7de;margin:6px 0}
"""


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]], *, classes: Sequence[str] | None = None,
           row_classes: Sequence[str] | None = None) -> str:
    """A table of already-escaped cells; `classes` per column (e.g. 'num'), `row_classes` per row."""
    out = ["<table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in headers) + "</tr>"]
    for k, row in enumerate(rows):
        rc = f" class='{row_classes[k]}'" if row_classes and row_classes[k] else ""
        cells = "".join(f"<td class='{classes[i]}'>{cell}</td>" if classes and classes[i] else f"<td>{cell}</td>"
                        for i, cell in enumerate(row))
        out.append(f"<tr{rc}>{cells}</tr>")
    out.append("</table>")
    return "".join(out)


def _status(status: str | None) -> str:
    return f"<span class='{esc(status or '')}'>{esc(status or 'n/a')}</span>"


def _case_status(case: dict[str, Any]) -> str:
    """A case's status, red when it did not pass (with its error class)."""
    if case["status"] == "passed":
        return "passed"
    text = case["status"] + (f" ({case['error_class']})" if case.get("error_class") else "")
    return f"<span class='FAIL'>{esc(text)}</span>"


def _n(value: Any) -> str:
    return esc(fmt_number(value))


def _seconds(value: Any) -> str:
    """Durations in one format (0.0, 331.0): a column that mixes 0.008964 and 331 reads as noise."""
    return esc(f"{value:.1f}") if isinstance(value, (int, float)) else "n/a"


def _bytes(value: Any) -> str:
    if not isinstance(value, (int, float)):
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return "n/a"


def _img(png: bytes, alt: str) -> str:
    return f"<img class='chart' alt='{esc(alt)}' src='{charts.data_uri(png)}'>"


def _span(samples: Any) -> tuple[float | None, float | None]:
    values = [float(value) for value in (samples or [])
              if isinstance(value, (int, float)) and not isinstance(value, bool)]
    return (min(values), max(values)) if values else (None, None)


def _reasons_by_case(decision: dict[str, Any] | None, check: str) -> dict[str, dict[str, Any]]:
    if not decision:
        return {}
    return {reason["case_id"]: reason for reason in decision["reasons"]
            if reason["check"] == check and reason.get("case_id")}


# --------------------------------------------------------------------------- sections


def _banner(view: dict[str, Any], decision: dict[str, Any] | None) -> str:
    verdict = decision["verdict"] if decision else "no decision"
    groups = reasons_by_status(decision["reasons"]) if decision else {}
    counts = " ".join(f"<span>{len(groups[status])} {esc(status)}</span>"
                      for status in STATUS_ORDER if groups.get(status))
    cls = "v-" + (verdict if verdict in ("PASS", "FAIL", "INCOMPLETE") else "none")
    cases = view["cases"]
    passed = sum(case["status"] == "passed" for case in cases)
    return (f"<header class='banner {cls}'><h1>{esc(view['release'])} — run {view['run']}: {esc(verdict)}</h1>"
            f"<div class='sub'>candidate <code>{esc(view['digest'] or 'n/a')}</code> · {passed}/{len(cases)} cases "
            f"passed · decided {esc(str(decision['decided_at'])[:19]) if decision else 'never'}</div>"
            f"<div class='sub counts'>checks: {counts or 'none'}</div></header>")


NAV = [("gate", "verdict"), ("run", "run"), ("images", "images"), ("history", "other runs"), ("promotions", "promotions"),
       ("components", "components"), ("training", "training"),
       ("baseline", "baseline"), ("reference", "reference"), ("inference", "inference"), ("probes", "probes"), ("waivers", "waivers"),
       ("retries", "retries"), ("cases", "cases"), ("environment", "environment")]


def _gate(decision: dict[str, Any] | None) -> str:
    out = ["<section id='gate'><h2>What decided the verdict</h2>"]
    if not decision:
        out.append("<p class='note'>The run has no gate decision yet: <code>qualify gate evaluate RUN</code>.</p>"
                   "</section>")
        return "".join(out)
    groups = reasons_by_status(decision["reasons"])
    titles = {"FAIL": "Failed checks", "INCOMPLETE": "Incomplete checks (could not be judged)",
              "WAIVED": "Waived failures", "NO-BASELINE": "Not compared with a baseline",
              "NOTE": "Notes: figures disclosed, not checks"}
    if not groups.get("FAIL") and not groups.get("INCOMPLETE"):
        out.append("<p>No check failed and none is incomplete.</p>")
    for status in ("FAIL", "INCOMPLETE", "WAIVED", "NO-BASELINE", "NOTE"):
        rows = groups.get(status) or []
        if not rows:
            continue
        out.append(f"<h3 class='{esc(status)}' id='checks-{esc(status.lower())}'>{esc(titles[status])} "
                   f"({len(rows)})</h3>")
        out.append(_table(["status", "check", "case", "reason"],
                          [[_status(reason["status"]), esc(reason["check"]), esc(reason.get("case_id") or "run"),
                            esc(reason["message"])] for reason in rows],
                          row_classes=["bad" if status == "FAIL" else "" for _ in rows]))
    passes = groups.get("PASS") or []
    if passes:
        out.append(f"<details><summary>{len(passes)} passed checks</summary>")
        out.append(_table(["check", "case", "reason"],
                          [[esc(reason["check"]), esc(reason.get("case_id") or "run"), esc(reason["message"])]
                           for reason in passes]))
        out.append("</details>")
    out.append("</section>")
    return "".join(out)


def _run_facts(view: dict[str, Any], decision: dict[str, Any] | None) -> str:
    image = view.get("image") or {}
    rows = [
        ["release", esc(view["release"])],
        ["candidate", esc(f"{image.get('repository')}:{image.get('tag')}" if image else "n/a")],
        ["digest", f"<code>{esc(view['digest'] or 'n/a')}</code>"],
        ["builder", esc(image.get("builder") or "n/a")],
        ["status / stage", esc(f"{view['status']} / {view['stage']}")],
        ["started / finished", esc(f"{str(view['started_at'])[:19]} / {str(view['finished_at'] or 'n/a')[:19]}")],
        ["manifest", esc(f"{view['manifest_path'] or 'n/a'} (sha256 {str(view['manifest_sha256'])[:12]})")],
        ["gate policy", esc(str(decision["policy_sha256"])[:12] if decision else "n/a")],
        ["baseline run", esc(str(decision["baseline_run_id"]) if decision and decision["baseline_run_id"] else "none")],
        ["triggered by", esc(view.get("triggered_by") or "n/a")],
        ["Prefect flow run", _flow_run_link(view)],
    ]
    if view.get("error"):
        rows.append(["error", esc(view["error"])])
    if view["stage_seconds"]:
        stages = ", ".join(f"{name} {value:.1f} s" for name, value in view["stage_seconds"].items())
        rows.append(["stages", esc(stages)])
    if view.get("launch_time"):
        rows.append(["launch time", esc(view["launch_time"]["line"])])
    if view.get("schedule"):
        rows.append(["schedule", esc(view["schedule"]["line"].removeprefix("schedule: "))])
    if view.get("build_where"):
        rows.append(["build", esc(view["build_where"].removeprefix("build: "))])
    if view.get("pulls"):
        rows.append(["image pulls", esc(view["pulls"].removeprefix("pulls: "))])
    return ("<section id='run'><h2>Run</h2><table>"
            + "".join(f"<tr><th>{esc(name)}</th><td>{value}</td></tr>" for name, value in rows) + "</table></section>")


def _images(view: dict[str, Any]) -> str:
    """A release of several images (manifest `images:`): each image, its digest, and the cases that ran in it."""
    images = view.get("images") or []
    if len(images) < 2:
        return ""
    rows = [[esc(i["name"]), esc(f"{i['repository']}:{i['tag']}"), f"<code>{esc(i['digest'])}</code>",
             esc(i["builder"] or "n/a"), esc(", ".join(i["cases"]) or "none")] for i in images]
    return ("<section id='images'><h2>Images</h2><p>The verdict covers every image; a PASS promotes each to its own "
            "targets, all or none.</p>" + _table(["image", "candidate", "digest", "builder", "cases run in it"], rows)
            + "</section>")


def _flow_run_link(view: dict[str, Any]) -> str:
    """The flow run's page in the Prefect UI when its URL is known (view['flow_run_url']), else its bare id."""
    flow_run_id = view.get("flow_run_id")
    url = view.get("flow_run_url")
    if flow_run_id and url:
        return f"<a href='{esc(url, quote=True)}'>{esc(flow_run_id)}</a>"
    return esc(flow_run_id or "n/a")


def _components(view: dict[str, Any]) -> str:
    comps = view["components"]
    if not comps:
        return "<section id='components'><h2>Components</h2><p class='note'>No component was checked.</p></section>"
    def absent_optional(component: dict[str, Any]) -> bool:
        return bool(component.get("optional")) and component["actual"] is None

    bad = [component for component in comps if not component["ok"] and not absent_optional(component)]
    baseline = view.get("baseline_components")
    before = (baseline or {}).get("actual") or {}

    def against_baseline(component: dict[str, Any]) -> str:
        was = before.get(component["name"])
        if was == component["actual"]:
            return esc(was or "missing")
        return f"<b>{esc(was or 'missing')} → {esc(component['actual'] or 'missing')}</b>"

    several = len(view.get("images") or []) > 1
    rows = [[*([esc(component.get("image") or "")] if several else []), esc(component["name"]),
             esc(component["rule"]), esc(component["expected"]),
             esc(component["actual"] or "missing"), *([against_baseline(component)] if baseline else []),
             ("<span class='PASS'>yes</span>" if component["ok"] else
              "<span class='WAIVED'>optional, absent</span>" if absent_optional(component) else
              "<span class='FAIL'>NO</span>"), esc(component.get("detail") or "")] for component in comps]
    return (f"<section id='components'><h2>Components</h2><p>{len(comps) - len(bad)}/{len(comps)} as expected.</p>"
            + (f"<p>Against the baseline run {baseline['run']} ({esc(baseline['release'])}): a change is shown "
               "as before → now.</p>" if baseline else "")
            + _table([*(["image"] if several else []), "name", "rule", "expected", "actual",
                      *([f"baseline run {baseline['run']}"] if baseline else []), "ok", "detail"], rows,
                     row_classes=["bad" if component in bad else "" for component in comps]) + "</section>")


def _training(view: dict[str, Any], decision: dict[str, Any] | None) -> str:
    train = [case for case in view["cases"] if case["kind"] == "train"]
    out = ["<section id='training'><h2>Training</h2>"]
    if not train:
        out.append("<p class='note'>No training case in this run.</p></section>")
        return "".join(out)
    gains = _reasons_by_case(decision, "variant_gain")
    evidence = _reasons_by_case(decision, "variant_evidence")
    policy_gains = {gain["variant"]: gain for gain in ((view.get("policy") or {}).get("variant_gains") or [])}
    rows, classes = [], []
    beside = []  # cases measured at the same time as another image (duet): their rates are not alone-rates
    for case in train:
        metrics = case["metrics"] or {}
        low, high = _span((case.get("samples") or {}).get("tokens_per_s"))
        duet = ((case.get("environment") or {}).get("duet") or {}) if isinstance(case.get("environment"), dict) else {}
        if isinstance(duet, dict) and duet.get("mode") == "duet":
            beside.append(case["case_id"])
        gain_reason = gains.get(case["case_id"])
        figures = (gain_reason or {}).get("figures") or {}
        required = figures.get("min_gain", (policy_gains.get(case["variant"]) or {}).get("min_gain"))
        gain = (f"{signed_pct(figures['gain'])} [{signed_pct(figures.get('gain_low'))} .. {signed_pct(figures.get('gain_high'))}]"
                if figures.get("gain") is not None else "n/a")
        evidence_reason = evidence.get(case["case_id"])
        rows.append([esc(case["case_id"]), _case_status(case),
                     _n(metrics.get("tokens_per_s")), esc(f"{fmt_number(low)} .. {fmt_number(high)}"),
                     _n(metrics.get("tflops_per_device")), esc(signed_pct(metrics.get("mfu"), signed=False)),
                     _n(metrics.get("step_time_s_median")), esc(_bytes(metrics.get("peak_memory_bytes"))),
                     esc(gain), esc(signed_pct(required) if required is not None else "n/a"),
                     _status(gain_reason["status"]) if gain_reason else "n/a",
                     (_status(evidence_reason["status"]) + " " + esc(evidence_reason["message"].split(": ", 1)[-1]))
                     if evidence_reason else "n/a"])
        classes.append("bad" if case["status"] != "passed" or (gain_reason and gain_reason["status"] == "FAIL") else "")
    out.append(_table(["case", "status", "tokens/s", "min..max", "TFLOP/s/device", "MFU", "step s", "peak memory",
                       "gain over baseline [90% interval]", "required", "gain check", "variant evidence"], rows,
                      classes=["", "", "num", "num", "num", "num", "num", "num", "", "num", "", ""],
                      row_classes=classes))
    if beside:
        out.append(f"<p class='note'>{esc(', '.join(beside))}: measured in duet, at the same time as the other image "
                   "on the same node (the two sides share it, on CPUs trading cores every step), so their tokens/s, "
                   "TFLOP/s, MFU and step times are lower than the image's alone; what the gate judges is the ratio "
                   "of the two sides, step by step (the duet section).</p>")
    for model in dict.fromkeys(case["model"] for case in train):
        chart_rows = []
        # The ablation chart draws each variant once: a reference case (gate.reference) is the same variant
        # measured again beside another image, shown in its own section.
        for case in (case for case in train if case["model"] == model and not is_reference_case(case["case_id"])):
            metrics = case["metrics"] or {}
            low, high = _span((case.get("samples") or {}).get("tokens_per_s"))
            gain_reason = gains.get(case["case_id"])
            figures = (gain_reason or {}).get("figures") or {}
            policy_gain = policy_gains.get(case["variant"]) or {}
            chart_rows.append({"variant": case["variant"], "tokens_per_s": metrics.get("tokens_per_s"), "tps_low": low,
                               "tps_high": high, "mfu": metrics.get("mfu"), "gain": figures.get("gain"),
                               "gain_low": figures.get("gain_low"), "gain_high": figures.get("gain_high"),
                               "min_gain": figures.get("min_gain", policy_gain.get("min_gain")),
                               "gain_status": gain_reason["status"] if gain_reason else None,
                               "gain_baseline": figures.get("baseline", policy_gain.get("baseline"))})
        out.append(f"<h3>{esc(str(model))}</h3>")
        out.append(_img(charts.training_chart(str(model), chart_rows), f"training chart {model}"))
    out.append("</section>")
    return "".join(out)


def _baseline(view: dict[str, Any]) -> str:
    out = ["<section id='baseline'><h2>Comparison with the baseline</h2>"]
    comparison = view.get("baseline")
    mode = ((view.get("policy") or {}).get("regression") or {}).get("baseline", "history")
    if view.get("paired") is not None:
        return _paired(view["paired"], (view.get("policy") or {}).get("regression") or {})
    if view.get("duet") is not None:
        return _duet(view["duet"], (view.get("policy") or {}).get("regression") or {})
    if not comparison:
        out.append(f"<p class='note'>{esc(view.get('baseline_note') or 'no baseline')} "
                   f"(baseline mode: {esc(mode)}).</p></section>")
        return "".join(out)
    baseline_run = comparison["a"]
    how = ("paired: the previous image measured beside the candidate" if comparison["baseline_mode"] == "paired" else
           f"{comparison['baseline_mode']}: the previous release's stored results")
    policy = comparison["policy"]
    out.append(f"<p>Baseline: run {baseline_run['run_id']} of {esc(baseline_run['label'])} (digest <code>{esc(baseline_run['digest'] or 'n/a')}"
               f"</code>), {esc(how)}. Rule (qualify.gate.noninferiority): change = candidate / baseline − 1 in "
               f"the metric's better direction, with one-sided bounds over the two runs (the fingerprint's calibrated "
               f"run-to-run variation included; alpha {policy['alpha']:g} over all looks, first look at "
               f"{policy['min_samples']} launches, budget {policy['max_launches']}). PASS when the worst end is within "
               f"−{policy['max_regression']:.0%}, FAIL when even the best end is beyond it, otherwise undecided "
               f"(INCOMPLETE).</p>")
    rows, classes = [], []
    for row in comparison["rows"]:
        interval = (f"{row['change_worst'] * 100:+.1f}% .. {row['change_best'] * 100:+.1f}%"
                    if row.get("change_worst") is not None else "n/a")
        rows.append([esc(row["case_id"]), esc(row["metric"]), _n(row["median_a"]), _n(row["median_b"]),
                     esc(f"{row['change'] * 100:+.1f}%" if row.get("change") is not None else "n/a"), esc(interval),
                     esc(f"≥ {row['could_see']:.0%}" if row.get("could_see") is not None else "n/a"),
                     esc(f"{row['n_b']} vs {row['n_a']}"),
                     f"<span class='{esc(row['call'].replace(' ', '-'))}'>{esc(row['call'])}</span>",
                     _status(row.get("gate_status")), esc(row["message"])])
        classes.append("bad" if row["call"] == "regression" else "")
    out.append(_table(["case", "metric", "baseline", "candidate", "change", "worst .. best", "could see", "launches",
                       "call",
                       "gate", "detail"], rows,
                      classes=["", "", "num", "num", "num", "num", "num", "num", "", "", ""], row_classes=classes))
    title = f"change against run {baseline_run['run_id']} ({baseline_run['label']})"
    out.append(_img(charts.baseline_chart(comparison["rows"], title),
                    "baseline comparison chart"))
    out.append("</section>")
    return "".join(out)


def _paired(rows_in: list[dict[str, Any]], policy: dict[str, Any]) -> str:
    """gate.regression.baseline: paired -- the previous release measured beside the candidate, launch by launch."""
    out = ["<section id='baseline'><h2>Comparison with the baseline (paired)</h2>",
           "<p>The previous release's image was measured on the same node as the candidate, launches in "
           "counterbalanced order (A B B A B A A B ...), so that the machine's state is the same for both sides of a "
           "pair and an order effect cannot pass for a regression. Rule (qualify.gate.noninferiority): change = "
           "candidate / baseline − 1 in the better direction, Student-t bounds on the mean log pair ratio at the "
           f"sequential look's level (alpha {policy.get('alpha', 0.05):g} over all looks, first look at "
           f"{policy.get('min_samples')} pairs, budget {policy.get('max_launches')}); PASS when the worst end is within "
           f"−{policy.get('max_regression', 0):.0%}, FAIL when even the best end is beyond it, else INCOMPLETE.</p>"]
    if not rows_in:
        out.append("<p class='note'>no paired comparison was recorded</p></section>")
        return "".join(out)
    rows, classes = [], []
    for row in rows_in:
        cand, base = row.get("candidate") or [], row.get("baseline_samples") or []
        pairs = " ".join(f"{cand_value:.4g}/{base_value:.4g}" for cand_value, base_value in zip(cand, base)) or "n/a"
        rows.append([esc(row.get("case_id") or ""), esc(row.get("metric") or ""), _n(row.get("median_baseline")),
                     _n(row.get("median_candidate")),
                     esc(f"{row['change'] * 100:+.1f}%" if row.get("change") is not None else "n/a"),
                     esc(f"{row['change_worst'] * 100:+.1f}% .. {row['change_best'] * 100:+.1f}%"
                         if row.get("change_worst") is not None else "n/a"), esc(pairs),
                     esc(" ".join(row.get("order") or []) or "n/a"), esc(row.get("baseline") or "n/a"),
                     _status(row.get("status")), esc(row.get("message") or "")])
        classes.append("bad" if row.get("status") == "FAIL" else "")
    out.append(_table(["case", "metric", "baseline median", "candidate median", "change", "worst .. best",
                       "pairs (candidate/baseline)", "order", "baseline image", "gate", "detail"], rows,
                      classes=["", "", "num", "num", "num", "num", "", "", "", "", ""], row_classes=classes))
    out.append("</section>")
    return "".join(out)


def _duet(rows_in: list[dict[str, Any]], policy: dict[str, Any]) -> str:
    """gate.regression.baseline: duet -- the previous release run at the same time as the candidate, step by step."""
    out = ["<section id='baseline'><h2>Comparison with the baseline (duet)</h2>",
           "<p>The previous release's image ran at the same time as the candidate on one node, each side on its own "
           "cores (or GPUs), both starting each timed step together; on CPUs the sides traded cores every step. Each "
           "launch pair is one block: the gate fits the pairs' median log ratios with the side as a fixed effect "
           "(the A/A bias of the two core sets, estimated from the swaps and removed) and takes Student-t bounds "
           f"with pairs − 2 degrees of freedom at the look's share of alpha ({policy.get('alpha', 0.05):g} over all "
           f"looks). PASS when the worst end is within −{policy.get('max_regression', 0):.0%}, FAIL when even the "
           "best end is beyond it, else INCOMPLETE. A case that could not run in duet was measured paired, and its "
           "detail says why.</p>"]
    if not rows_in:
        out.append("<p class='note'>no duet comparison was recorded</p></section>")
        return "".join(out)
    rows, classes = [], []
    for row in rows_in:
        run, left_out = row.get("pairs_run"), row.get("pairs_left_out")
        pairs = "n/a" if run is None else f"{row.get('pairs', 0)} of {run}" + (f" ({left_out} left out)"
                                                                                 if left_out else "")
        bias = (f"{row['side_bias'] * 100:+.1f}% [{row['side_bias_lower'] * 100:+.1f}, "
                f"{row['side_bias_upper'] * 100:+.1f}]" if row.get("side_bias") is not None else "n/a")
        rows.append([esc(row.get("case_id") or ""), esc(row.get("metric") or ""),
                     esc(f"{row['estimate'] * 100:+.1f}%" if row.get("estimate") is not None else "n/a"),
                     esc(f"{row['lower'] * 100:+.1f}% .. {row['upper'] * 100:+.1f}%"
                         if row.get("lower") is not None else "n/a"),
                     esc(f"{1 - row['look_alpha']:.1%}" if row.get("look_alpha") else "n/a"), esc(pairs),
                     esc(str(row["steps"]) if row.get("steps") is not None else "n/a"), esc(bias),
                     esc(row.get("baseline") or "n/a"), _status(row.get("status")), esc(row.get("message") or "")])
        classes.append("bad" if row.get("status") == "FAIL" else "")
    out.append(_table(["case", "metric", "change", "worst .. best", "one-sided level", "launch pairs", "units",
                       "side bias (removed)", "baseline image", "gate", "detail"], rows,
                      classes=["", "", "num", "num", "num", "num", "num", "num", "", "", ""], row_classes=classes))
    out.append("</section>")
    return "".join(out)


def _reference(decision: dict[str, Any] | None) -> str:
    """gate.reference -- the candidate measured beside an image it must beat (or stay within a tolerance of): the
    gain with its interval against the required one, per reference case. Empty when no reference was named."""
    reasons = [r for r in (decision or {}).get("reasons") or [] if r.get("check") == "reference" and r.get("case_id")]
    if not reasons:
        return ""
    first = reasons[0].get("figures") or {}
    required = first.get("required_change")
    rule = ("a gain shown: PASS when the worst end is at or above the required gain, FAIL when even the best end "
            "is below it" if isinstance(required, (int, float)) and required > 0 else
            "within a tolerance: PASS when the worst end is within it, FAIL when even the best end is beyond it")
    out = ["<section id='reference'><h2>Against the reference image</h2>",
           f"<p>{esc(str(first.get('reference') or ''))} ({esc(str(first.get('reference_image') or ''))}) was measured "
           "beside the candidate, with the same case, on the same node; the change is candidate / reference − 1 in "
           f"the better direction, decided by the gate's interval rule: {rule}, else INCOMPLETE.</p>"]
    rows, classes = [], []
    for reason in reasons:
        f = reason.get("figures") or {}
        change = f.get("change", f.get("estimate"))
        worst, best = f.get("change_worst", f.get("lower")), f.get("change_best", f.get("upper"))
        units = f.get("n", f.get("pairs"))
        rows.append([esc(reason["case_id"]), esc(str(f.get("metric") or "")),
                     esc(f"{change * 100:+.1f}%" if isinstance(change, (int, float)) else "n/a"),
                     esc(f"{worst * 100:+.1f}% .. {best * 100:+.1f}%"
                         if isinstance(worst, (int, float)) and isinstance(best, (int, float)) else "n/a"),
                     esc(f"{f['required_change'] * 100:+.1f}%" if isinstance(f.get("required_change"), (int, float))
                         else "n/a"),
                     esc(f"{units} {f.get('unit') or 'launch pairs'}" if units is not None else "n/a"),
                     _status(reason.get("status")), esc(reason.get("message") or "")])
        classes.append("bad" if reason.get("status") == "FAIL" else "")
    out.append(_table(["case", "metric", "change", "worst .. best", "required", "units", "gate", "detail"], rows,
                      classes=["", "", "num", "num", "num", "num", "", ""], row_classes=classes))
    out.append("</section>")
    return "".join(out)


def _inference(view: dict[str, Any], decision: dict[str, Any] | None) -> str:
    infer = [case for case in view["cases"] if case["kind"] == "infer"]
    out = ["<section id='inference'><h2>Inference</h2>"]
    if not infer:
        out.append("<p class='note'>No inference case in this run.</p></section>")
        return "".join(out)
    minimums = (view.get("policy") or {}).get("agreement") or {}
    agreement = _reasons_by_case(decision, "agreement")
    rows, classes = [], []
    for case in infer:
        metrics = case["metrics"] or {}
        agreement_reason = agreement.get(case["case_id"])
        rows.append([esc(case["case_id"]), _case_status(case),
                     esc(str(case["variant"])), _n(metrics.get("output_tokens_per_s")),
                     _n(metrics.get("token_agreement")), _n(minimums.get(case["variant"])),
                     _status(agreement_reason["status"]) if agreement_reason else "n/a",
                     _n(metrics.get("topk_overlap")), _n(metrics.get("kl_div_mean")),
                     _n(metrics.get("perplexity_delta")), _n(metrics.get("latency_s_p90")),
                     _n(metrics.get("ttft_s_p90")), _n(metrics.get("quantized_share")),
                     _n(metrics.get("weight_bytes_ratio"))])
        failed_check = bool(agreement_reason and agreement_reason["status"] == "FAIL")
        classes.append("bad" if case["status"] != "passed" or failed_check else "")
    out.append(_table(["case", "status", "scheme", "output tokens/s", "token agreement", "required", "agreement check",
                       "top-k overlap", "KL", "perplexity Δ", "latency p90 s", "TTFT p90 s", "quantized share",
                       "weight bytes ×"], rows,
                      classes=["", "", "", "num", "num", "num", "", "num", "num", "num", "num", "num", "num", "num"],
                      row_classes=classes))
    for model in dict.fromkeys(case["model"] for case in infer):
        chart_rows = []
        for case in (case for case in infer if case["model"] == model):
            metrics = case["metrics"] or {}
            low, high = _span((case.get("samples") or {}).get("output_tokens_per_s"))
            chart_rows.append({"scheme": case["variant"], "tokens_per_s": metrics.get("output_tokens_per_s"),
                               "tps_low": low,
                               "tps_high": high, "token_agreement": metrics.get("token_agreement"),
                               "topk_overlap": metrics.get("topk_overlap"),
                               "min_agreement": minimums.get(case["variant"]),
                               "status": case["status"]})
        out.append(f"<h3>{esc(str(model))}</h3>")
        out.append(_img(charts.inference_chart(str(model), chart_rows), f"inference chart {model}"))
    out.append("</section>")
    return "".join(out)


def _probes(view: dict[str, Any], decision: dict[str, Any] | None) -> str:
    gate = {}
    if decision:
        gate = {(reason.get("case_id"), reason["check"].split(":", 1)[1]): reason for reason in decision["reasons"]
                if reason["check"].startswith("probe:")}
    rows, classes = [], []
    for case in view["cases"]:
        for name, probe in sorted((case.get("probes") or {}).items()):
            probe = probe if isinstance(probe, dict) else {"status": str(probe)}
            gate_reason = gate.get((case["case_id"], name))
            rows.append([esc(case["case_id"]), esc(name), esc(str(probe.get("status"))),
                         _status(gate_reason["status"]) if gate_reason else "n/a", esc(str(probe.get("detail") or ""))])
            classes.append("bad" if gate_reason and gate_reason["status"] == "FAIL" else "")
    body = (_table(["case", "probe", "result", "gate", "detail"], rows, row_classes=classes) if rows else
            "<p class='note'>No probe ran in this run.</p>")
    return f"<section id='probes'><h2>Probes (the release note's known issues)</h2>{body}</section>"


def _waivers(view: dict[str, Any], decision: dict[str, Any] | None) -> str:
    import datetime as dt

    waivers = (view.get("policy") or {}).get("waivers") or []
    used: dict[str, list[str]] = {}
    for reason in (decision or {}).get("reasons", []):
        waiver = (reason.get("figures") or {}).get("waiver")
        if waiver:
            used.setdefault(waiver, []).append(f"{reason['check']} {reason.get('case_id') or ''}".strip())
    if not waivers:
        return "<section id='waivers'><h2>Waivers</h2><p class='note'>The policy has no waiver.</p></section>"
    today = dt.date.today()
    rows = []
    for waiver in waivers:
        expires = dt.date.fromisoformat(str(waiver["expires"]))
        state = (f"<span class='PASS'>in force, {(expires - today).days} day(s) left</span>" if expires >= today else
                 f"<span class='FAIL'>expired {(today - expires).days} day(s) ago</span>")
        rows.append([esc(waiver["id"]), esc(waiver["check"]), esc(waiver["cases"]), esc(str(waiver["expires"])), state,
                     esc(waiver["reason"]),
                     esc("; ".join(used.get(waiver["id"], [])) or "nothing (no failure to cover)")])
    return ("<section id='waivers'><h2>Waivers</h2>"
            + _table(["waiver", "check", "cases", "expires", "state today", "reason", "covered in this decision"],
                     rows) + "</section>")


def _earlier_runs(view: dict[str, Any]) -> str:
    rows = view.get("earlier_runs") or []
    if not rows:
        return ("<section id='history'><h2>Other runs of this digest and tag</h2><p class='note'>None: this is "
                "the first run of this digest and of this release tag.</p></section>")
    body = _table(["run", "release", "digest", "status", "verdict", "started"],
                  [[str(row["run"]), esc(row["release"]),
                    "<code>" + esc((row["digest"] or "n/a")[:19]) + "</code>"
                    + (" (this digest)" if row["same_digest"] else ""),
                    esc(row["status"]), _status(row["verdict"]) if row["verdict"] else "no decision",
                    esc(str(row["started_at"])[:19])] for row in rows])
    return f"<section id='history'><h2>Other runs of this digest and tag</h2>{body}</section>"


def _promotions(view: dict[str, Any]) -> str:
    rows = view.get("promotions") or []
    if not rows:
        return ("<section id='promotions'><h2>Promotions</h2><p class='note'>No promotion was made from this "
                "run.</p></section>")
    body = _table(["target", "reference", "outcome", "forced", "when", "detail"],
                  [[esc(row["target_name"]), f"<code>{esc(row['target_ref'])}</code>", esc(row["outcome"]),
                    "yes: " + esc(row.get("reason") or "") if row.get("forced") else "no",
                    esc(str(row.get("created_at") or "n/a")[:19]), esc(row.get("detail") or "")] for row in rows])
    return f"<section id='promotions'><h2>Promotions</h2>{body}</section>"


def _retries(view: dict[str, Any]) -> str:
    retried = [case for case in view["cases"] if (case.get("attempts") or 1) > 1]
    if not retried:
        return ("<section id='retries'><h2>Retries</h2><p class='note'>Every case ran once (no infrastructure "
                "retry).</p></section>")
    rows = [[esc(case["case_id"]), str(case["attempts"]), _status(case["status"]),
             esc(case.get("error_class") or "n/a")]
            for case in retried]
    return ("<section id='retries'><h2>Retries</h2><p>Infrastructure failures are retried; a failed test never "
            "is. A flaky pass is still a pass, shown here.</p>"
            + _table(["case", "attempts", "final status", "error class"], rows) + "</section>")


def _cases(view: dict[str, Any]) -> str:
    rows, classes = [], []
    for case in view["cases"]:
        status = case["status"] + (f" ({case['error_class']})" if case["error_class"] else "")
        cls = "PASS" if case["status"] == "passed" else "FAIL"
        rows.append([esc(case["case_id"]), f"<span class='{cls}'>{esc(status)}</span>", esc(case["key_metrics"]),
                     str(case["attempts"]),
            _seconds(case["queue_wait_s"]), _seconds(case["exec_s"]), esc(case.get("node") or "n/a")])
        classes.append("bad" if case["status"] != "passed" else "")
    out = ["<section id='cases'><h2>Cases</h2>",
           _table(["case", "status", "key metrics", "attempts", "queue s", "exec s", "node"], rows,
                  classes=["", "", "", "num", "num", "num", ""], row_classes=classes)]
    for case in view["cases"]:
        if case["status"] != "passed":
            out.append(f"<details><summary>{esc(case['case_id'])}: {esc(case['status'])} — error and log tail</summary>"
                       f"<pre>{esc(case.get('error') or 'no error message')}</pre>"
                       f"<pre>{esc((case.get('log_tail') or 'no log')[-4000:])}</pre></details>")
    out.append("</section>")
    return "".join(out)


def _flat(env: dict[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in env.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and len(value) <= 12 and not prefix:
            out.update(_flat(value, f"{name}."))
        elif isinstance(value, (dict, list)):
            text = json.dumps(value, sort_keys=True, default=str)
            out[name] = text if len(text) <= 160 else text[:157] + "..."
        else:
            out[name] = "null" if value is None else str(value)
    return out


def _environment(view: dict[str, Any]) -> str:
    flats = {case["case_id"]: _flat(case.get("environment") or {}) for case in view["cases"]}
    keys = sorted({key for flat in flats.values() for key in flat})
    common, varying = [], []
    for key in keys:
        values = {flat.get(key, "n/a") for flat in flats.values()}
        (common if len(values) == 1 else varying).append(key)
    out = ["<section id='environment'><h2>Environment</h2>",
           "<p class='note'>As the workloads reported it from inside the candidate image.</p>"]
    if not keys:
        out.append("<p class='note'>No case reported its environment.</p>")
    if common:
        any_flat = next(iter(flats.values()))
        out.append("<h3>The same for every case</h3>")
        out.append(_table(["name", "value"], [[esc(key), esc(any_flat.get(key, "n/a"))] for key in common]))
    if varying:
        out.append(f"<details><summary>{len(varying)} values that differ between cases</summary>")
        out.append(_table(["case", *varying],
                          [[esc(case_id), *[esc(flat.get(key, "n/a")) for key in varying]]
                           for case_id, flat in flats.items()]))
        out.append("</details>")
    out.append("</section>")
    return "".join(out)


def _calibrations(d: dict[str, Any]) -> str:
    """What the regression check could see here: `qualify calibrate`'s measurements of each result's fingerprint."""
    rows_in = d.get("calibrations") or []
    out = ["<section id='calibrations'><h2>What the regression check can see (calibrations)</h2>"]
    if not rows_in:
        mode = ((d.get("policy") or {}).get("regression") or {}).get("baseline", "history")
        if mode in ("paired", "duet"):
            out.append(f"<p class='note'>no calibration for this run's fingerprints: this run's mode ({esc(mode)}) "
                       "does not need one: it measured the previous release beside the candidate.</p></section>")
        else:
            out.append("<p class='note'>no calibration for this run's fingerprints: history mode cannot decide "
                       "(<code>qualify calibrate MANIFEST</code>); paired and duet modes do not need one.</p>"
                       "</section>")
        return "".join(out)
    rows = [[esc(r["case_id"]), esc(r["metric"]), esc(r["created_at"][:19]), esc(f"{r['runs']} × {r['launches']}"),
             esc(f"{r['sd_run']:.2%}"), esc(f"{r['sd_launch']:.2%}"),
             esc(f"{r['false_alarm_rate']:.0%} of {r['aa_comparisons']}"),
             esc(f"{r['detection_rate']:.0%} at {r['slowdown']:.0%}" if r.get("detection_rate") is not None else "n/a"),
             esc(f"≥ {r['detectable']:.0%}")] for r in rows_in]
    out.append(_table(["case", "metric", "calibrated", "runs × launches", "run-to-run", "launch sd",
                       "realized false alarms", "slowdown detected", "could see (90% power)"], rows,
                      classes=["", "", "", "num", "num", "num", "num", "num", "num"]))
    out.append("</section>")
    return "".join(out)


def render(view: dict[str, Any]) -> str:
    """The report of reporting.report_view (run_detail's keys are enough: policy and baseline are optional)."""
    decision = view["decisions"][-1] if view["decisions"] else None
    verdict = decision["verdict"] if decision else "no decision"
    reference = _reference(decision)
    images = _images(view)
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>{esc(verdict)}: {esc(view['release'])} run {view['run']} — qualify report</title>",
        f"<style>{CSS}</style></head><body>",
        _banner(view, decision),
        "<main><nav>" + "".join(f"<a href='#{anchor}'>{esc(title)}</a>" for anchor, title in NAV
                                if (anchor != "reference" or reference) and (anchor != "images" or images))
        + "</nav>",
        _gate(decision),
        _run_facts(view, decision),
        images,
        _earlier_runs(view),
        _promotions(view),
        _components(view),
        _training(view, decision),
        _baseline(view),
        reference,
        _calibrations(view),
        _inference(view, decision),
        _probes(view, decision),
        _waivers(view, decision),
        _retries(view),
        _cases(view),
        _environment(view),
        "</main></body></html>",
    ]
    return "\n".join(parts)


def write_report(view: dict[str, Any], directory: Path, name: str | None = None) -> Path:
    """Write the report as <directory>/run-N.html (or `name`), atomically: never a half-written report."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / (name or f"run-{view['run']}.html")
    tmp = path.with_suffix(".tmp")
    tmp.write_text(render(view), encoding="utf-8")
    tmp.replace(path)
    return path

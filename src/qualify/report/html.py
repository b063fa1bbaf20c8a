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
.WAIVED,.NO-BASELINE{color:#57606a}
.regression{color:#cf222e;font-weight:600}.improvement{color:#1a7f37}.noise{color:#57606a}
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


def _pct(value: Any, signed: bool = True) -> str:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "n/a"
    return f"{value * 100:+.1f}%" if signed else f"{value * 100:.1f}%"


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
    xs = [float(v) for v in (samples or []) if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return (min(xs), max(xs)) if xs else (None, None)


def _reasons_by_case(decision: dict[str, Any] | None, check: str) -> dict[str, dict[str, Any]]:
    if not decision:
        return {}
    return {r["case_id"]: r for r in decision["reasons"] if r["check"] == check and r.get("case_id")}


# --------------------------------------------------------------------------- sections


def _banner(d: dict[str, Any], decision: dict[str, Any] | None) -> str:
    verdict = decision["verdict"] if decision else "no decision"
    groups = reasons_by_status(decision["reasons"]) if decision else {}
    counts = " ".join(f"<span>{len(groups[s])} {esc(s)}</span>" for s in STATUS_ORDER if groups.get(s))
    cls = "v-" + (verdict if verdict in ("PASS", "FAIL", "INCOMPLETE") else "none")
    cases = d["cases"]
    passed = sum(c["status"] == "passed" for c in cases)
    return (f"<header class='banner {cls}'><h1>{esc(d['release'])} — run {d['run']}: {esc(verdict)}</h1>"
            f"<div class='sub'>candidate <code>{esc(d['digest'] or 'n/a')}</code> · {passed}/{len(cases)} cases "
            f"passed · decided {esc(str(decision['decided_at'])[:19]) if decision else 'never'}</div>"
            f"<div class='sub counts'>checks: {counts or 'none'}</div></header>")


NAV = [("gate", "verdict"), ("run", "run"), ("components", "components"), ("training", "training"),
       ("baseline", "baseline"), ("inference", "inference"), ("probes", "probes"), ("waivers", "waivers"),
       ("retries", "retries"), ("cases", "cases"), ("environment", "environment")]


def _gate(decision: dict[str, Any] | None) -> str:
    out = ["<section id='gate'><h2>What decided the verdict</h2>"]
    if not decision:
        out.append("<p class='note'>The run has no gate decision yet: <code>qualify gate evaluate RUN</code>.</p>"
                   "</section>")
        return "".join(out)
    groups = reasons_by_status(decision["reasons"])
    titles = {"FAIL": "Failed checks", "INCOMPLETE": "Incomplete checks (could not be judged)",
              "WAIVED": "Waived failures", "NO-BASELINE": "Not compared with a baseline"}
    if not groups.get("FAIL") and not groups.get("INCOMPLETE"):
        out.append("<p>No check failed and none is incomplete.</p>")
    for status in ("FAIL", "INCOMPLETE", "WAIVED", "NO-BASELINE"):
        rows = groups.get(status) or []
        if not rows:
            continue
        out.append(f"<h3 class='{esc(status)}' id='checks-{esc(status.lower())}'>{esc(titles[status])} "
                   f"({len(rows)})</h3>")
        out.append(_table(["status", "check", "case", "reason"],
                          [[_status(r["status"]), esc(r["check"]), esc(r.get("case_id") or "run"),
                            esc(r["message"])] for r in rows],
                          row_classes=["bad" if status == "FAIL" else "" for _ in rows]))
    passes = groups.get("PASS") or []
    if passes:
        out.append(f"<details><summary>{len(passes)} passed checks</summary>")
        out.append(_table(["check", "case", "reason"],
                          [[esc(r["check"]), esc(r.get("case_id") or "run"), esc(r["message"])] for r in passes]))
        out.append("</details>")
    out.append("</section>")
    return "".join(out)


def _run_facts(d: dict[str, Any], decision: dict[str, Any] | None) -> str:
    image = d.get("image") or {}
    rows = [
        ["release", esc(d["release"])],
        ["candidate", esc(f"{image.get('repository')}:{image.get('tag')}" if image else "n/a")],
        ["digest", f"<code>{esc(d['digest'] or 'n/a')}</code>"],
        ["builder", esc(image.get("builder") or "n/a")],
        ["status / stage", esc(f"{d['status']} / {d['stage']}")],
        ["started / finished", esc(f"{str(d['started_at'])[:19]} / {str(d['finished_at'] or 'n/a')[:19]}")],
        ["manifest", esc(f"{d['manifest_path'] or 'n/a'} (sha256 {str(d['manifest_sha256'])[:12]})")],
        ["gate policy", esc(str(decision["policy_sha256"])[:12] if decision else "n/a")],
        ["baseline run", esc(str(decision["baseline_run_id"]) if decision and decision["baseline_run_id"] else "none")],
        ["triggered by", esc(d.get("triggered_by") or "n/a")],
        ["Prefect flow run", esc(d.get("flow_run_id") or "n/a")],
    ]
    if d.get("error"):
        rows.append(["error", esc(d["error"])])
    if d["stage_seconds"]:
        rows.append(["stages", esc(", ".join(f"{k} {v:.1f} s" for k, v in d["stage_seconds"].items()))])
    return ("<section id='run'><h2>Run</h2><table>"
            + "".join(f"<tr><th>{esc(k)}</th><td>{v}</td></tr>" for k, v in rows) + "</table></section>")


def _components(d: dict[str, Any]) -> str:
    comps = d["components"]
    if not comps:
        return "<section id='components'><h2>Components</h2><p class='note'>No component was checked.</p></section>"
    bad = [c for c in comps if not c["ok"] and not (c.get("optional") and c["actual"] is None)]
    rows = [[esc(c["name"]), esc(c["rule"]), esc(c["expected"]), esc(c["actual"] or "missing"),
             ("<span class='PASS'>yes</span>" if c["ok"] else
              "<span class='WAIVED'>optional, absent</span>" if c.get("optional") and c["actual"] is None else
              "<span class='FAIL'>NO</span>"), esc(c.get("detail") or "")] for c in comps]
    return (f"<section id='components'><h2>Components</h2><p>{len(comps) - len(bad)}/{len(comps)} as expected.</p>"
            + _table(["name", "rule", "expected", "actual", "ok", "detail"], rows,
                     row_classes=["bad" if c in bad else "" for c in comps]) + "</section>")


def _training(d: dict[str, Any], decision: dict[str, Any] | None) -> str:
    train = [c for c in d["cases"] if c["kind"] == "train"]
    out = ["<section id='training'><h2>Training</h2>"]
    if not train:
        out.append("<p class='note'>No training case in this run.</p></section>")
        return "".join(out)
    gains = _reasons_by_case(decision, "variant_gain")
    evidence = _reasons_by_case(decision, "variant_evidence")
    policy_gains = {g["variant"]: g for g in ((d.get("policy") or {}).get("variant_gains") or [])}
    rows, classes = [], []
    for c in train:
        m = c["metrics"] or {}
        lo, hi = _span((c.get("samples") or {}).get("tokens_per_s"))
        g = gains.get(c["case_id"])
        fig = (g or {}).get("figures") or {}
        required = fig.get("min_gain", (policy_gains.get(c["variant"]) or {}).get("min_gain"))
        gain = (f"{_pct(fig['gain'])} [{_pct(fig.get('gain_low'))} .. {_pct(fig.get('gain_high'))}]"
                if fig.get("gain") is not None else "n/a")
        ev = evidence.get(c["case_id"])
        rows.append([esc(c["case_id"]), _case_status(c),
                     _n(m.get("tokens_per_s")), esc(f"{fmt_number(lo)} .. {fmt_number(hi)}"),
                     _n(m.get("tflops_per_device")), esc(_pct(m.get("mfu"), signed=False)),
                     _n(m.get("step_time_s_median")), esc(_bytes(m.get("peak_memory_bytes"))),
                     esc(gain), esc(_pct(required) if required is not None else "n/a"),
                     _status(g["status"]) if g else "n/a",
                     (_status(ev["status"]) + " " + esc(ev["message"].split(": ", 1)[-1])) if ev else "n/a"])
        classes.append("bad" if c["status"] != "passed" or (g and g["status"] == "FAIL") else "")
    out.append(_table(["case", "status", "tokens/s", "min..max", "TFLOP/s/device", "MFU", "step s", "peak memory",
                       "gain over baseline [90% interval]", "required", "gain check", "variant evidence"], rows,
                      classes=["", "", "num", "num", "num", "num", "num", "num", "", "num", "", ""],
                      row_classes=classes))
    for model in dict.fromkeys(c["model"] for c in train):
        chart_rows = []
        for c in (c for c in train if c["model"] == model):
            m = c["metrics"] or {}
            lo, hi = _span((c.get("samples") or {}).get("tokens_per_s"))
            g = gains.get(c["case_id"])
            fig = (g or {}).get("figures") or {}
            pg = policy_gains.get(c["variant"]) or {}
            chart_rows.append({"variant": c["variant"], "tokens_per_s": m.get("tokens_per_s"), "tps_low": lo,
                               "tps_high": hi, "mfu": m.get("mfu"), "gain": fig.get("gain"),
                               "gain_low": fig.get("gain_low"), "gain_high": fig.get("gain_high"),
                               "min_gain": fig.get("min_gain", pg.get("min_gain")),
                               "gain_status": g["status"] if g else None,
                               "gain_baseline": fig.get("baseline", pg.get("baseline"))})
        out.append(f"<h3>{esc(str(model))}</h3>")
        out.append(_img(charts.training_chart(str(model), chart_rows), f"training chart {model}"))
    out.append("</section>")
    return "".join(out)


def _baseline(d: dict[str, Any]) -> str:
    out = ["<section id='baseline'><h2>Comparison with the baseline</h2>"]
    view = d.get("baseline")
    mode = ((d.get("policy") or {}).get("regression") or {}).get("baseline", "history")
    if d.get("paired") is not None:
        return _paired(d["paired"], (d.get("policy") or {}).get("regression") or {})
    if not view:
        out.append(f"<p class='note'>{esc(d.get('baseline_note') or 'no baseline')} "
                   f"(baseline mode: {esc(mode)}).</p></section>")
        return "".join(out)
    a = view["a"]
    how = ("paired: the previous image measured beside the candidate" if view["baseline_mode"] == "paired" else
           f"{view['baseline_mode']}: the previous release's stored results")
    pol = view["policy"]
    out.append(f"<p>Baseline: run {a['run_id']} of {esc(a['label'])} (digest <code>{esc(a['digest'] or 'n/a')}"
               f"</code>), {esc(how)}. Rule: a regression is a change beyond {pol['max_regression']:.0%} that is "
               f"significant (one-sided Welch t-test on the launches' logs, p &lt; {pol['alpha']:g}) with ≥ {pol['min_samples']} "
               f"samples a side, else beyond the noise floor {pol['noise_floor']:.0%}. Ratio = candidate median / "
               f"baseline median, 90% bootstrap interval.</p>")
    rows, classes = [], []
    for r in view["rows"]:
        interval = (f"[{r['ratio_low']:.3f} .. {r['ratio_high']:.3f}]" if r.get("ratio_low") is not None else "n/a")
        rows.append([esc(r["case_id"]), esc(r["metric"]), _n(r["median_a"]), _n(r["median_b"]),
                     esc(f"{r['ratio']:.3f}" if r.get("ratio") is not None else "n/a"), esc(interval),
                     esc(f"{r['p_value']:.3g}" if r.get("p_value") is not None else "n/a"),
                     esc(f"{r['n_b']} vs {r['n_a']}"),
                     f"<span class='{esc(r['call'].replace(' ', '-'))}'>{esc(r['call'])}</span>",
                     _status(r.get("gate_status")), esc(r["message"])])
        classes.append("bad" if r["call"] == "regression" else "")
    out.append(_table(["case", "metric", "baseline", "candidate", "ratio", "interval", "p", "samples", "call",
                       "gate", "detail"], rows,
                      classes=["", "", "num", "num", "num", "num", "num", "num", "", "", ""], row_classes=classes))
    out.append(_img(charts.baseline_chart(view["rows"], f"change against run {a['run_id']} ({a['label']})"),
                    "baseline comparison chart"))
    out.append("</section>")
    return "".join(out)


def _paired(rows_in: list[dict[str, Any]], pol: dict[str, Any]) -> str:
    """gate.regression.baseline: paired -- the previous release measured beside the candidate, launch by launch."""
    out = ["<section id='baseline'><h2>Comparison with the baseline (paired)</h2>",
           "<p>The previous release's image was measured on the same node as the candidate, launches interleaved "
           "A B A B, so that the machine's state is the same for both sides of a pair. Rule: a regression is a "
           f"median pair change beyond {pol.get('max_regression', 0):.0%} that is significant (one-sided paired "
           f"t-test on the log ratios, p &lt; {pol.get('alpha', 0.05):g}) with ≥ {pol.get('min_samples')} pairs, "
           f"else beyond the noise floor {pol.get('noise_floor', 0):.0%}.</p>"]
    if not rows_in:
        out.append("<p class='note'>no paired comparison was recorded</p></section>")
        return "".join(out)
    rows, classes = [], []
    for r in rows_in:
        cand, base = r.get("candidate") or [], r.get("baseline_samples") or []
        pairs = " ".join(f"{c:.4g}/{b:.4g}" for c, b in zip(cand, base)) or "n/a"
        rows.append([esc(r.get("case_id") or ""), esc(r.get("metric") or ""), _n(r.get("median_baseline")),
                     _n(r.get("median_candidate")),
                     esc(f"{r['ratio']:.3f}" if r.get("ratio") is not None else "n/a"),
                     esc(f"{r['p_value']:.3g}" if r.get("p_value") is not None else "n/a"), esc(pairs),
                     esc(" ".join(r.get("order") or []) or "n/a"), esc(r.get("baseline") or "n/a"),
                     _status(r.get("status")), esc(r.get("message") or "")])
        classes.append("bad" if r.get("status") == "FAIL" else "")
    out.append(_table(["case", "metric", "baseline median", "candidate median", "median pair ratio", "p",
                       "pairs (candidate/baseline)", "order", "baseline image", "gate", "detail"], rows,
                      classes=["", "", "num", "num", "num", "num", "", "", "", "", ""], row_classes=classes))
    out.append("</section>")
    return "".join(out)


def _inference(d: dict[str, Any], decision: dict[str, Any] | None) -> str:
    infer = [c for c in d["cases"] if c["kind"] == "infer"]
    out = ["<section id='inference'><h2>Inference</h2>"]
    if not infer:
        out.append("<p class='note'>No inference case in this run.</p></section>")
        return "".join(out)
    minimums = (d.get("policy") or {}).get("agreement") or {}
    agreement = _reasons_by_case(decision, "agreement")
    rows, classes = [], []
    for c in infer:
        m = c["metrics"] or {}
        a = agreement.get(c["case_id"])
        rows.append([esc(c["case_id"]), _case_status(c),
                     esc(str(c["variant"])), _n(m.get("output_tokens_per_s")), _n(m.get("token_agreement")),
                     _n(minimums.get(c["variant"])), _status(a["status"]) if a else "n/a", _n(m.get("topk_overlap")),
                     _n(m.get("kl_div_mean")), _n(m.get("perplexity_delta")), _n(m.get("latency_s_p90")),
                     _n(m.get("ttft_s_p90")), _n(m.get("quantized_share")), _n(m.get("weight_bytes_ratio"))])
        classes.append("bad" if c["status"] != "passed" or (a and a["status"] == "FAIL") else "")
    out.append(_table(["case", "status", "scheme", "output tokens/s", "token agreement", "required", "agreement check",
                       "top-k overlap", "KL", "perplexity Δ", "latency p90 s", "TTFT p90 s", "quantized share",
                       "weight bytes ×"], rows,
                      classes=["", "", "", "num", "num", "num", "", "num", "num", "num", "num", "num", "num", "num"],
                      row_classes=classes))
    for model in dict.fromkeys(c["model"] for c in infer):
        chart_rows = []
        for c in (c for c in infer if c["model"] == model):
            m = c["metrics"] or {}
            lo, hi = _span((c.get("samples") or {}).get("output_tokens_per_s"))
            chart_rows.append({"scheme": c["variant"], "tokens_per_s": m.get("output_tokens_per_s"), "tps_low": lo,
                               "tps_high": hi, "token_agreement": m.get("token_agreement"),
                               "topk_overlap": m.get("topk_overlap"), "min_agreement": minimums.get(c["variant"]),
                               "status": c["status"]})
        out.append(f"<h3>{esc(str(model))}</h3>")
        out.append(_img(charts.inference_chart(str(model), chart_rows), f"inference chart {model}"))
    out.append("</section>")
    return "".join(out)


def _probes(d: dict[str, Any], decision: dict[str, Any] | None) -> str:
    gate = {}
    if decision:
        gate = {(r.get("case_id"), r["check"].split(":", 1)[1]): r for r in decision["reasons"]
                if r["check"].startswith("probe:")}
    rows, classes = [], []
    for c in d["cases"]:
        for name, probe in sorted((c.get("probes") or {}).items()):
            probe = probe if isinstance(probe, dict) else {"status": str(probe)}
            g = gate.get((c["case_id"], name))
            rows.append([esc(c["case_id"]), esc(name), esc(str(probe.get("status"))),
                         _status(g["status"]) if g else "n/a", esc(str(probe.get("detail") or ""))])
            classes.append("bad" if g and g["status"] == "FAIL" else "")
    body = (_table(["case", "probe", "result", "gate", "detail"], rows, row_classes=classes) if rows else
            "<p class='note'>No probe ran in this run.</p>")
    return f"<section id='probes'><h2>Probes (the release note's known issues)</h2>{body}</section>"


def _waivers(d: dict[str, Any], decision: dict[str, Any] | None) -> str:
    import datetime as dt

    waivers = (d.get("policy") or {}).get("waivers") or []
    used: dict[str, list[str]] = {}
    for r in (decision or {}).get("reasons", []):
        w = (r.get("figures") or {}).get("waiver")
        if w:
            used.setdefault(w, []).append(f"{r['check']} {r.get('case_id') or ''}".strip())
    if not waivers:
        return "<section id='waivers'><h2>Waivers</h2><p class='note'>The policy has no waiver.</p></section>"
    today = dt.date.today()
    rows = []
    for w in waivers:
        expires = dt.date.fromisoformat(str(w["expires"]))
        state = (f"<span class='PASS'>in force, {(expires - today).days} day(s) left</span>" if expires >= today else
                 f"<span class='FAIL'>expired {(today - expires).days} day(s) ago</span>")
        rows.append([esc(w["id"]), esc(w["check"]), esc(w["cases"]), esc(str(w["expires"])), state, esc(w["reason"]),
                     esc("; ".join(used.get(w["id"], [])) or "nothing (no failure to cover)")])
    return ("<section id='waivers'><h2>Waivers</h2>"
            + _table(["waiver", "check", "cases", "expires", "state today", "reason", "covered in this decision"],
                     rows) + "</section>")


def _retries(d: dict[str, Any]) -> str:
    retried = [c for c in d["cases"] if (c.get("attempts") or 1) > 1]
    if not retried:
        return ("<section id='retries'><h2>Retries</h2><p class='note'>Every case ran once (no infrastructure "
                "retry).</p></section>")
    rows = [[esc(c["case_id"]), str(c["attempts"]), _status(c["status"]), esc(c.get("error_class") or "n/a")]
            for c in retried]
    return ("<section id='retries'><h2>Retries</h2><p>Infrastructure failures are retried; a failed test never "
            "is. A flaky pass is still a pass, shown here.</p>"
            + _table(["case", "attempts", "final status", "error class"], rows) + "</section>")


def _cases(d: dict[str, Any]) -> str:
    rows, classes = [], []
    for c in d["cases"]:
        status = c["status"] + (f" ({c['error_class']})" if c["error_class"] else "")
        cls = "PASS" if c["status"] == "passed" else "FAIL"
        rows.append([esc(c["case_id"]), f"<span class='{cls}'>{esc(status)}</span>", esc(c["key_metrics"]),
                     str(c["attempts"]),
            _n(c["queue_wait_s"]), _n(c["exec_s"]), esc(c.get("node") or "n/a")])
        classes.append("bad" if c["status"] != "passed" else "")
    out = ["<section id='cases'><h2>Cases</h2>",
           _table(["case", "status", "key metrics", "attempts", "queue s", "exec s", "node"], rows,
                  classes=["", "", "", "num", "num", "num", ""], row_classes=classes)]
    for c in d["cases"]:
        if c["status"] != "passed":
            out.append(f"<details><summary>{esc(c['case_id'])}: {esc(c['status'])} — error and log tail</summary>"
                       f"<pre>{esc(c.get('error') or 'no error message')}</pre>"
                       f"<pre>{esc((c.get('log_tail') or 'no log')[-4000:])}</pre></details>")
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


def _environment(d: dict[str, Any]) -> str:
    flats = {c["case_id"]: _flat(c.get("environment") or {}) for c in d["cases"]}
    keys = sorted({k for f in flats.values() for k in f})
    common, varying = [], []
    for key in keys:
        values = {f.get(key, "n/a") for f in flats.values()}
        (common if len(values) == 1 else varying).append(key)
    out = ["<section id='environment'><h2>Environment</h2>",
           "<p class='note'>As the workloads reported it from inside the candidate image.</p>"]
    if not keys:
        out.append("<p class='note'>No case reported its environment.</p>")
    if common:
        any_flat = next(iter(flats.values()))
        out.append("<h3>The same for every case</h3>")
        out.append(_table(["name", "value"], [[esc(k), esc(any_flat.get(k, "n/a"))] for k in common]))
    if varying:
        out.append(f"<details><summary>{len(varying)} values that differ between cases</summary>")
        out.append(_table(["case", *varying],
                          [[esc(cid), *[esc(f.get(k, "n/a")) for k in varying]] for cid, f in flats.items()]))
        out.append("</details>")
    out.append("</section>")
    return "".join(out)


def render(view: dict[str, Any]) -> str:
    """The report of reporting.report_view (run_detail's keys are enough: policy and baseline are optional)."""
    decision = view["decisions"][-1] if view["decisions"] else None
    verdict = decision["verdict"] if decision else "no decision"
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>{esc(verdict)}: {esc(view['release'])} run {view['run']} — qualify report</title>",
        f"<style>{CSS}</style></head><body>",
        _banner(view, decision),
        "<main><nav>" + "".join(f"<a href='#{a}'>{esc(t)}</a>" for a, t in NAV) + "</nav>",
        _gate(decision),
        _run_facts(view, decision),
        _components(view),
        _training(view, decision),
        _baseline(view),
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

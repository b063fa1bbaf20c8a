"""The run report a release manager reads: one self-contained HTML file with plots."""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import Any

from qualify.reporting import fmt_number


def _plot_png(title: str, labels: list[str], series: dict[str, list[float | None]], ylabel: str,
              errors: dict[str, list[float]] | None = None) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(4.0, 1.2 * len(labels) + 2), 3.2), dpi=100)
    width = 0.8 / max(1, len(series))
    for k, (name, values) in enumerate(series.items()):
        xs = [i + k * width for i in range(len(labels))]
        ys = [v if v is not None else 0.0 for v in values]
        err = (errors or {}).get(name)
        ax.bar(xs, ys, width=width, label=name, yerr=err if err and any(err) else None, capsize=3)
    ax.set_xticks([i + width * (len(series) - 1) / 2 for i in range(len(labels))])
    ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    if len(series) > 1:
        ax.legend(fontsize=7)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _spread(samples: list[float]) -> float:
    if len(samples) < 2:
        return 0.0
    xs = sorted(samples)
    return (xs[-1] - xs[0]) / 2


def plots(detail: dict[str, Any]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    train = [c for c in detail["cases"] if c["kind"] == "train"]
    for model in sorted({c["model"] for c in train}):
        rows = [c for c in train if c["model"] == model]
        labels = [c["variant"] for c in rows]
        values = [c["metrics"].get("tokens_per_s") for c in rows]
        errs = [_spread(c.get("samples", {}).get("tokens_per_s", [])) for c in rows]
        out.append((f"training throughput, {model}",
                    _plot_png(f"{model}: tokens/s per variant (median, spread over repeats)", labels,
                              {"tokens/s": values}, "tokens/s", {"tokens/s": errs})))
    infer = [c for c in detail["cases"] if c["kind"] == "infer"]
    for model in sorted({c["model"] for c in infer}):
        rows = [c for c in infer if c["model"] == model]
        labels = [c["variant"] for c in rows]
        out.append((f"inference agreement, {model}",
                    _plot_png(f"{model}: agreement with the unquantized reference", labels,
                              {"token agreement": [c["metrics"].get("token_agreement") for c in rows],
                               "top-k overlap": [c["metrics"].get("topk_overlap") for c in rows]}, "fraction")))
        out.append((f"inference throughput, {model}",
                    _plot_png(f"{model}: output tokens/s per scheme", labels,
                              {"tokens/s": [c["metrics"].get("output_tokens_per_s") for c in rows]}, "tokens/s")))
    return out


def render(detail: dict[str, Any]) -> str:
    esc = html.escape
    decision = detail["decisions"][-1] if detail["decisions"] else None
    verdict = decision["verdict"] if decision else "no decision"
    colour = {"PASS": "#1a7f37", "FAIL": "#cf222e", "INCOMPLETE": "#9a6700"}.get(verdict, "#57606a")
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>qualify run {detail['run']}: {esc(detail['release'])} {esc(verdict)}</title>",
        "<style>body{font-family:sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse;"
        "font-size:13px}td,th{border:1px solid #ccc;padding:3px 6px;text-align:left}th{background:#f6f8fa}"
        ".PASS{color:#1a7f37}.FAIL{color:#cf222e}.INCOMPLETE,.NO-BASELINE{color:#9a6700}.WAIVED{color:#57606a}"
        "</style></head><body>",
        f"<h1>{esc(detail['release'])} — run {detail['run']}: <span style='color:{colour}'>{esc(verdict)}</span></h1>",
        f"<p>candidate digest <code>{esc(detail['digest'] or 'n/a')}</code>; status {esc(detail['status'])}; "
        f"started {esc(str(detail['started_at'])[:19])}; manifest {esc(detail['manifest_path'] or 'n/a')}</p>",
    ]
    if detail["stage_seconds"]:
        parts.append("<p>stages: " + ", ".join(f"{esc(k)} {v:.1f} s" for k, v in detail["stage_seconds"].items())
                     + "</p>")
    if decision:
        parts.append("<h2>Gate</h2><table><tr><th>status</th><th>check</th><th>reason</th></tr>")
        for r in decision["reasons"]:
            parts.append(f"<tr><td class='{esc(r['status'])}'>{esc(r['status'])}</td><td>{esc(r['check'])}</td>"
                         f"<td>{esc(r['message'])}</td></tr>")
        parts.append("</table>")
    if detail["components"]:
        parts.append("<h2>Components</h2><table><tr><th>name</th><th>rule</th><th>expected</th><th>actual</th>"
                     "<th>ok</th></tr>")
        for c in detail["components"]:
            parts.append(f"<tr><td>{esc(c['name'])}</td><td>{esc(c['rule'])}</td><td>{esc(c['expected'])}</td>"
                         f"<td>{esc(c['actual'] or 'missing')}</td><td class='{'PASS' if c['ok'] else 'FAIL'}'>"
                         f"{'yes' if c['ok'] else 'NO'}</td></tr>")
        parts.append("</table>")
    parts.append("<h2>Cases</h2><table><tr><th>case</th><th>status</th><th>metrics</th><th>attempts</th>"
                 "<th>queue s</th><th>exec s</th></tr>")
    for c in detail["cases"]:
        status = c["status"] + (f" ({c['error_class']})" if c["error_class"] else "")
        parts.append(f"<tr><td>{esc(c['case_id'])}</td><td>{esc(status)}</td><td>{esc(c['key_metrics'])}</td>"
                     f"<td>{c['attempts']}</td><td>{fmt_number(c['queue_wait_s'])}</td>"
                     f"<td>{fmt_number(c['exec_s'])}</td></tr>")
    parts.append("</table>")
    for title, png in plots(detail):
        parts.append(f"<h3>{esc(title)}</h3><img alt='{esc(title)}' src='data:image/png;base64,{png}'>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(detail: dict[str, Any], directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"run-{detail['run']}.html"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(render(detail), encoding="utf-8")
    tmp.replace(path)  # never a half-written report
    return path

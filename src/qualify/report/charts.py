"""The charts people read (HTML report, `qualify history --png`): matplotlib, rendered to PNG bytes.

Every function takes plain data and returns PNG bytes; `data_uri` embeds them in a self-contained page.
Colours follow the report's statuses (PASS green, FAIL red, INCOMPLETE amber, WAIVED/NO-BASELINE/NOTE grey).
"""

from __future__ import annotations

import base64
import io
from typing import Any, Sequence

from qualify.numbers import finite, signed_pct

STATUS_COLOURS = {"PASS": "#2da44e", "FAIL": "#cf222e", "INCOMPLETE": "#bf8700", "WAIVED": "#8c959f",
                  "NO-BASELINE": "#8c959f", "NOTE": "#8c959f", None: "#57606a"}
CALL_COLOURS = {"regression": "#cf222e", "improvement": "#2da44e", "within tolerance": "#2da44e",
                "undecided": "#9a6700", "not comparable": "#bf8700",
                "missing": "#bf8700"}
BAR = "#4c72b0"
BAR2 = "#dd8452"


def _plt():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    _plt().close(fig)
    return buf.getvalue()


def data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


def _whiskers(values: Sequence[float | None], lows: Sequence[float | None],
              highs: Sequence[float | None]) -> list[list[float]] | None:
    """Asymmetric error bars from [low, high] spans (zero where unknown); None when there is none."""
    below, above = [], []
    for v, lo, hi in zip(values, lows, highs):
        if v is None or lo is None or hi is None:
            below.append(0.0)
            above.append(0.0)
        else:
            below.append(max(0.0, v - lo))
            above.append(max(0.0, hi - v))
    return [below, above] if any(below) or any(above) else None


def _label_bars(ax: Any, xs: Sequence[float], heights: Sequence[float | None], fmt: str = "{:.4g}",
                tops: Sequence[float | None] | None = None) -> None:
    """The value above each bar (above its whisker when `tops` gives the whisker's end)."""
    for k, (x, h) in enumerate(zip(xs, heights)):
        if h is not None:
            top = tops[k] if tops is not None and tops[k] is not None else h
            ax.annotate(fmt.format(h), (x, max(h, top)), textcoords="offset points", xytext=(0, 3), ha="center",
                        fontsize=7)


def _no_data(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=8, color="#57606a", wrap=True, transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def training_chart(model: str, rows: Sequence[dict[str, Any]]) -> bytes:
    """One model's variants: tokens/s (median, whiskers over repeats), MFU, and each variant's gain over its
    baseline variant as the release note's ablation chart draws it (bars labelled with the gain, the gate's
    interval as whiskers, the required gain as a line over each bar).

    rows: {variant, tokens_per_s, tps_low, tps_high, mfu, gain, gain_low, gain_high, min_gain, gain_status,
    gain_baseline}."""
    plt = _plt()
    mfu = [finite(r.get("mfu")) for r in rows]
    has_mfu = any(v is not None for v in mfu)
    if has_mfu:
        fig, (ax_t, ax_m, ax_g) = plt.subplots(1, 3, figsize=(12.5, 3.6), gridspec_kw={"width_ratios": [1, 1, 1.2]})
    else:  # no panel for a figure that could not be computed: the tokens/s title says why
        fig, (ax_t, ax_g) = plt.subplots(1, 2, figsize=(10, 3.6), gridspec_kw={"width_ratios": [1, 1.2]})
    labels = [r["variant"] for r in rows]
    xs = list(range(len(rows)))
    tps = [finite(r.get("tokens_per_s")) for r in rows]
    highs = [finite(r.get("tps_high")) for r in rows]
    ax_t.bar(xs, [v or 0.0 for v in tps], color=BAR,
             yerr=_whiskers(tps, [finite(r.get("tps_low")) for r in rows], highs), capsize=3)
    _label_bars(ax_t, xs, tps, "{:.0f}", highs)
    ax_t.set_title(f"{model}: tokens/s (median; whiskers min..max of launches)"
                   + ("" if has_mfu else "\nMFU n/a: no known peak FLOP/s for this device"), fontsize=9)
    ax_t.set_ylabel("tokens/s", fontsize=8)
    ax_t.set_xticks(xs, labels, rotation=20, ha="right", fontsize=8)
    ax_t.margins(y=0.15)

    if has_mfu:
        pct = [v * 100 if v is not None else None for v in mfu]
        ax_m.bar(xs, [v or 0.0 for v in pct], color=BAR2)
        _label_bars(ax_m, xs, pct, "{:.1f}%")
        for x, v in zip(xs, pct):
            if v is None:
                ax_m.annotate("n/a", (x, 0), textcoords="offset points", xytext=(0, 3), ha="center", fontsize=7)
        ax_m.set_xticks(xs, labels, rotation=20, ha="right", fontsize=8)
        ax_m.margins(y=0.15)
        ax_m.set_title(f"{model}: MFU", fontsize=9)

    gains = [r for r in rows if finite(r.get("gain")) is not None or finite(r.get("min_gain")) is not None]
    if gains:
        gx = list(range(len(gains)))
        values = [finite(r.get("gain")) for r in gains]
        heights = [(v or 0.0) * 100 for v in values]
        # Colour says the direction (a slowdown is red even when the check passed); the check's status is in the
        # tick label.
        colours = [STATUS_COLOURS["FAIL"] if (v or 0.0) < 0 else STATUS_COLOURS["PASS"] for v in values]
        err = _whiskers([h if v is not None else None for h, v in zip(heights, values)],
                        [(finite(r.get("gain_low")) or 0) * 100 if finite(r.get("gain_low")) is not None else None
                         for r in gains],
                        [(finite(r.get("gain_high")) or 0) * 100 if finite(r.get("gain_high")) is not None else None
                         for r in gains])
        ax_g.bar(gx, heights, color=colours, yerr=err, capsize=3, width=0.6)
        ax_g.axhline(0, color="#24292f", linewidth=0.8)
        for x, r, v in zip(gx, gains, values):
            if v is not None:  # the label sits beyond the whisker's end, on the bar's side of zero
                end = finite(r.get("gain_high" if v >= 0 else "gain_low"))
                end = v if end is None else (max(v, end) if v >= 0 else min(v, end))
                ax_g.annotate(signed_pct(v), (x, end * 100), textcoords="offset points", xytext=(0, 4 if v >= 0 else -12),
                              ha="center", fontsize=8, fontweight="bold")
            else:
                ax_g.annotate("n/a", (x, 0), textcoords="offset points", xytext=(0, 4), ha="center", fontsize=8)
            required = finite(r.get("min_gain"))
            if required is not None:
                ax_g.hlines(required * 100, x - 0.42, x + 0.42, colors="#8250df", linestyles="--", linewidth=1.6,
                            label="required gain" if x == 0 else None)
                ax_g.annotate(f"req. {signed_pct(required)}", (x + 0.42, required * 100), textcoords="offset points",
                              xytext=(2, -3), fontsize=6.5, color="#8250df")
        ax_g.set_xticks(gx, [f"{r['variant']}\nvs {r.get('gain_baseline') or 'base'}\n"
                             f"check {r.get('gain_status') or 'n/a'}" for r in gains], fontsize=8)
        ax_g.set_ylabel("gain %", fontsize=8)
        ax_g.legend(fontsize=7, loc="best")
        ax_g.margins(x=0.3, y=0.2)
    else:
        _no_data(ax_g, "no variant gain in the gate policy")
    ax_g.set_title(f"{model}: gain over baseline variant (90% interval)", fontsize=9)
    fig.tight_layout()
    return _png(fig)


def inference_chart(model: str, rows: Sequence[dict[str, Any]]) -> bytes:
    """One model's schemes: output tokens/s (whiskers over repeats) and agreement with the unquantized
    reference (token agreement, top-k overlap) with the scheme's required minimum as a line.

    rows: {scheme, tokens_per_s, tps_low, tps_high, token_agreement, topk_overlap, min_agreement, status}."""
    plt = _plt()
    fig, (ax_t, ax_a) = plt.subplots(1, 2, figsize=(11, 3.5))
    labels = [r["scheme"] for r in rows]
    xs = list(range(len(rows)))
    tps = [finite(r.get("tokens_per_s")) for r in rows]
    highs = [finite(r.get("tps_high")) for r in rows]
    ax_t.bar(xs, [v or 0.0 for v in tps], color=BAR,
             yerr=_whiskers(tps, [finite(r.get("tps_low")) for r in rows], highs), capsize=3)
    _label_bars(ax_t, xs, tps, "{:.0f}", highs)
    ax_t.set_xticks(xs, labels, fontsize=8)
    ax_t.set_title(f"{model}: output tokens/s per scheme (median; whiskers min..max of launches)", fontsize=9)
    ax_t.set_ylabel("output tokens/s", fontsize=8)
    ax_t.margins(y=0.15)

    width = 0.38
    agree = [finite(r.get("token_agreement")) for r in rows]
    topk = [finite(r.get("topk_overlap")) for r in rows]
    ax_a.bar([x - width / 2 for x in xs], [v or 0.0 for v in agree], width, color=BAR, label="token agreement")
    ax_a.bar([x + width / 2 for x in xs], [v or 0.0 for v in topk], width, color=BAR2, label="top-k overlap")
    _label_bars(ax_a, [x - width / 2 for x in xs], agree, "{:.3f}")
    for k, (x, r) in enumerate(zip(xs, rows)):
        required = finite(r.get("min_agreement"))
        if required is not None:
            ax_a.hlines(required, x - 0.45, x + 0.45, colors="#8250df", linestyles="--", linewidth=1.6,
                        label="required agreement" if k == 0 or not any(
                            finite(p.get("min_agreement")) is not None for p in rows[:k]) else None)
        if r.get("status") and r["status"] != "passed":
            ax_a.annotate(r["status"], (x, 0.02), ha="center", fontsize=7, color=STATUS_COLOURS["FAIL"])
    # Agreements sit near 1: start the axis below the lowest value or requirement so differences show.
    shown = [v for v in agree + topk + [finite(r.get("min_agreement")) for r in rows] if v is not None]
    floor = max(0.0, (int(min(shown) * 20) / 20) - 0.05) if shown else 0.0
    ax_a.set_ylim(floor, 1.02)
    ax_a.set_xticks(xs, labels, fontsize=8)
    ax_a.set_title(f"{model}: agreement with the unquantized model"
                   + (f" (axis from {floor:g})" if floor > 0 else ""), fontsize=9)
    ax_a.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return _png(fig)


def baseline_chart(rows: Sequence[dict[str, Any]], title: str) -> bytes:
    """Each case and metric's change against the baseline (+ better), with its interval and the tolerance the
    gate allowed. rows: MetricComparison dicts (plus an optional gate `status`)."""
    plt = _plt()
    shown = [r for r in rows if r.get("change") is not None]
    fig, ax = plt.subplots(figsize=(9.5, max(2.2, 0.38 * len(shown) + 1.5)))
    if not shown:
        _no_data(ax, "nothing to compare")
        return _png(fig)
    ys = list(range(len(shown)))[::-1]
    for y, r in zip(ys, shown):
        change = r["change"]  # B / A - 1 in the better direction (qualify.gate.noninferiority's scale)
        lo, hi = r.get("change_worst"), r.get("change_best")
        colour = CALL_COLOURS.get(r["call"], "#57606a")
        if lo is not None and hi is not None:
            lo, hi = min(lo, hi), max(lo, hi)
            ax.hlines(y, lo * 100, hi * 100, colors=colour, linewidth=2.2, alpha=0.6)
        ax.plot([change * 100], [y], "o", color=colour)
        ax.annotate(f"{signed_pct(change)} {r['call']}", (change * 100, y), textcoords="offset points", xytext=(6, 4),
                    fontsize=7, color=colour)
    tolerance = max((r.get("tolerance") or 0.0) for r in shown)
    ax.axvline(0, color="#24292f", linewidth=0.8)
    if tolerance:
        ax.axvline(-tolerance * 100, color="#cf222e", linestyle="--", linewidth=1,
                   label=f"tolerance -{tolerance:.0%} (worst end inside: PASS; best end beyond: regression)")
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.22 - 1.2 / max(4, len(shown) * 2.5)),
                  frameon=False)
    ax.set_yticks(ys, [f"{r['case_id']} {r['metric']}" for r in shown], fontsize=7.5)
    ax.set_xlabel("change vs baseline, % (+ better), with the gate's one-sided bounds", fontsize=8)
    ax.set_title(title, fontsize=9)
    ax.margins(x=0.25)
    fig.tight_layout()
    return _png(fig)


def history_chart(case_id: str, metric: str, points: Sequence[dict[str, Any]]) -> bytes:
    """A metric over past runs: median per run with the min..max of its samples, coloured by the run's
    verdict; a dashed line where the case's fingerprint changed (before it, not like for like)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(points) + 3), 3.6))
    xs = list(range(len(points)))
    med = [finite(p.get("median")) for p in points]
    ax.plot([x for x, v in zip(xs, med) if v is not None], [v for v in med if v is not None], "-",
            color="#8c959f", linewidth=1, zorder=1)
    err = _whiskers(med, [finite(p.get("low")) for p in points], [finite(p.get("high")) for p in points])
    ax.errorbar(xs, [v if v is not None else float("nan") for v in med], yerr=err, fmt="none", ecolor="#8c959f",
                capsize=3, zorder=1)
    seen: set[str] = set()
    for x, p, v in zip(xs, points, med):
        if v is None:
            continue
        verdict = p.get("verdict") or "no decision"
        ax.scatter([x], [v], color=STATUS_COLOURS.get(p.get("verdict"), STATUS_COLOURS[None]), zorder=2, s=30,
                   label=verdict if verdict not in seen else None)
        seen.add(verdict)
    for x, p in zip(xs, points):
        if p.get("fingerprint_changes"):
            ax.axvline(x - 0.5, color="#bf8700", linestyle="--", linewidth=1.2)
            ax.annotate("fingerprint\nchanged", (x - 0.5, 1.0), xycoords=("data", "axes fraction"), fontsize=6.5,
                        color="#bf8700", ha="left", va="top", xytext=(2, -2), textcoords="offset points")
    ax.set_xticks(xs, [f"run {p['run_id']}\n{p['tag']}" for p in points], fontsize=7,
                  rotation=0 if len(points) <= 12 else 45)
    ax.set_ylabel(metric, fontsize=8)
    ax.set_title(f"{case_id}: {metric} per run (median, min..max of samples)", fontsize=9)
    if seen:
        ax.legend(fontsize=7, loc="best")
    ax.margins(x=0.05, y=0.15)
    fig.tight_layout()
    return _png(fig)

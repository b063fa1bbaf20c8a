"""Publish what people read: Prefect artifacts (keyed per release) and the HTML report."""

from __future__ import annotations

import re

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_progress_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from qualify import pipeline
from qualify.report_html import write_report
from qualify.reporting import fmt_number, run_detail


def artifact_key(ctx: pipeline.RunContext, what: str) -> str:
    """Keys version per release in the UI: qualify-<name>-<tag>-<what> (lowercase, digits, dashes)."""
    info = ctx.release.release
    slug = re.sub(r"[^a-z0-9]+", "-", f"qualify-{info.name}-{info.tag}-{what}".lower()).strip("-")
    return slug[:100]


@task(name="progress-artifact", cache_policy=NO_CACHE)
def progress_artifact_task(ctx: pipeline.RunContext, done: int, total: int) -> str:
    return str(create_progress_artifact(100.0 * done / max(1, total), key=artifact_key(ctx, "progress"),
                                        description=f"run {ctx.run_id}: {done}/{total} cases done"))


@task(name="publish-report", cache_policy=NO_CACHE)
def publish_report_task(ctx: pipeline.RunContext) -> dict:
    with ctx.sessions() as session:
        detail = run_detail(session, ctx.run_id)
    assert detail is not None
    report = write_report(detail, ctx.data_dir / "reports")
    rows = []
    for c in detail["cases"]:
        m = c["metrics"] or {}
        rows.append({
            "case": c["case_id"], "status": c["status"], "error class": c["error_class"] or "n/a",
            "tokens/s": fmt_number(m.get("tokens_per_s", m.get("output_tokens_per_s"))),
            "TFLOP/s per device": fmt_number(m.get("tflops_per_device")), "MFU": fmt_number(m.get("mfu")),
            "agreement": fmt_number(m.get("token_agreement")), "KL": fmt_number(m.get("kl_div_mean")),
            "attempts": c["attempts"], "exec s": fmt_number(c["exec_s"]),
        })
    create_table_artifact(rows, key=artifact_key(ctx, "results"),
                          description=f"run {ctx.run_id} case results ({detail['release']})")
    decision = detail["decisions"][-1] if detail["decisions"] else None
    verdict = decision["verdict"] if decision else "no decision"
    lines = [f"# {detail['release']} run {ctx.run_id}: **{verdict}**", "",
             f"candidate `{detail['digest'] or 'n/a'}`, {len(detail['cases'])} cases, "
             f"{sum(c['status'] == 'passed' for c in detail['cases'])} passed", ""]
    if detail["stage_seconds"]:
        lines.append("stages: " + ", ".join(f"{k} {v:.1f} s" for k, v in detail["stage_seconds"].items()))
        lines.append("")
    if decision:
        lines += ["| status | check | reason |", "|---|---|---|"]
        lines += [f"| {r['status']} | {r['check']} | {r['message'].replace('|', '/')} |" for r in decision["reasons"]]
    bad = [c for c in detail["components"] if not c["ok"]]
    lines += ["", f"components: {len(detail['components']) - len(bad)}/{len(detail['components'])} as expected"]
    lines += [f"- {c['name']}: expected {c['expected']} ({c['rule']}), found {c['actual'] or 'nothing'}" for c in bad]
    lines += ["", f"HTML report: `{report}`"]
    create_markdown_artifact("\n".join(lines), key=artifact_key(ctx, "summary"),
                             description=f"verdict of run {ctx.run_id}")
    return {"report": str(report), "verdict": verdict}

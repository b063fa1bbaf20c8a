"""Publish what people read: Prefect artifacts (keyed per release) and the HTML report."""

from __future__ import annotations

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_progress_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from qualify import pipeline
from qualify.report_html import write_report
from qualify.reporting import artifact_key, report_view, results_table, summary_markdown


def _key(ctx: pipeline.RunContext, what: str) -> str:
    return artifact_key(ctx.release.release.name, ctx.release.release.tag, what)


@task(name="progress-artifact", cache_policy=NO_CACHE)
def progress_artifact_task(ctx: pipeline.RunContext, done: int, total: int) -> str:
    return str(create_progress_artifact(100.0 * done / max(1, total), key=_key(ctx, "progress"),
                                        description=f"run {ctx.run_id}: {done}/{total} cases done"))


@task(name="publish-report", cache_policy=NO_CACHE)
def publish_report_task(ctx: pipeline.RunContext) -> str:
    """Write the HTML report and the results/summary artifacts; returns the report's path."""
    with ctx.sessions() as session:
        detail = report_view(session, ctx.run_id)
    assert detail is not None
    report = str(write_report(detail, ctx.data_dir / "reports"))
    create_table_artifact(results_table(detail), key=_key(ctx, "results"),
                          description=f"run {ctx.run_id} case results ({detail['release']})")
    create_markdown_artifact(summary_markdown(detail, report), key=_key(ctx, "summary"),
                             description=f"verdict of run {ctx.run_id}")
    return report

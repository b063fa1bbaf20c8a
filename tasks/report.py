"""Publish what people read: Prefect artifacts (keyed per release) and the HTML report."""

from __future__ import annotations

from prefect import task
from prefect.artifacts import (create_link_artifact, create_markdown_artifact, create_progress_artifact,
                               create_table_artifact)
from prefect.cache_policies import NO_CACHE

from qualify import pipeline
from qualify.report.html import write_report
from qualify.report.views import artifact_key, report_view, results_table, summary_markdown


def _key(ctx: pipeline.RunContext, what: str) -> str:
    return artifact_key(ctx.manifest.release.name, ctx.manifest.release.tag, what)


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
    path = write_report(detail, ctx.data_dir / "reports").resolve()
    report = str(path)
    create_markdown_artifact(summary_markdown(detail, report), key=_key(ctx, "summary"),
                             description=f"verdict of run {ctx.run_id}, failures first; HTML report {report}")
    create_table_artifact(results_table(detail), key=_key(ctx, "results"),
                          description=f"run {ctx.run_id} case results ({detail['release']}); HTML report {report}")
    create_link_artifact(path.as_uri(), link_text=f"HTML report of run {ctx.run_id} ({path.name})",
                         key=_key(ctx, "report"), description=f"where the report of run {ctx.run_id} was written")
    return report

"""Publish what people read: the HTML report (a task) and the Prefect artifacts (on the flow run itself)."""

from __future__ import annotations

from pathlib import Path

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
def publish_report_task(ctx: pipeline.RunContext, flow_run_url: str | None) -> Path:
    """Write the HTML report (linking back to this flow run in the Prefect UI); returns where it was written."""
    with ctx.sessions() as session:
        detail = report_view(session, ctx.run_id)
    assert detail is not None
    detail["flow_run_url"] = flow_run_url
    return write_report(detail, ctx.data_dir / "reports").resolve()


def publish_artifacts(ctx: pipeline.RunContext, report_link: str) -> None:
    """The summary, results and report-link artifacts. Called from the flow's body, never from a task, so that
    they belong to the flow run (an artifact made inside a task run hangs off the task: "Flow run: None")."""
    with ctx.sessions() as session:
        detail = report_view(session, ctx.run_id)
    assert detail is not None
    create_markdown_artifact(summary_markdown(detail, report_link), key=_key(ctx, "summary"),
                             description=f"verdict of run {ctx.run_id}, failures first; report {report_link}")
    create_table_artifact(results_table(detail), key=_key(ctx, "results"),
                          description=f"run {ctx.run_id} case results ({detail['release']}); report {report_link}")
    create_link_artifact(report_link, link_text=f"HTML report of run {ctx.run_id}", key=_key(ctx, "report"),
                         description=f"the report of run {ctx.run_id}")

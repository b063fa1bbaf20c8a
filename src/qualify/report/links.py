"""Where people open a run's report and its Prefect flow run: links built from the configured base URLs."""

from __future__ import annotations

from pathlib import Path


def report_path(run_id: int) -> str:
    """The service's path of a run's HTML report (qualify.service.reports serves it)."""
    return f"/v1/runs/{run_id}/report"


def report_url(public_url: str | None, run_id: int, written_to: Path) -> str:
    """The report over HTTP when the service's public base URL is configured, else the file where it was
    written (a file:// link, which a browser opens only from the worker's own disk)."""
    if public_url:
        return public_url.rstrip("/") + report_path(run_id)
    return written_to.resolve().as_uri()


def flow_run_url(prefect_ui_url: str | None, flow_run_id: str | None) -> str | None:
    """The flow run's page in the Prefect UI (None when either is unknown)."""
    if not prefect_ui_url or not flow_run_id:
        return None
    return f"{prefect_ui_url.rstrip('/')}/flow-runs/flow-run/{flow_run_id}"

"""Run the qualification flow in this process with Prefect (the `qualify run` launcher)."""

from __future__ import annotations

import os

from qualify.errors import InfraError
from qualify.launcher import ProgressCallback, RunRequest
from qualify.outcomes import RunOutcome
from qualify.settings import Settings


def prepare_environment(settings: Settings, verbose: bool) -> None:
    """Prefect and Ray read their settings from the environment of this process."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # The Prefect API (and so the UI) gets INFO logs of the flow and of every case's task run; the console
    # shows only warnings, because the CLI draws its own progress line (--verbose shows Prefect's INFO too).
    # The loggers' level decides what reaches any handler, so it stays INFO, and only the console handler
    # (Prefect's logging.yml `handlers.console.level`) is raised.
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "INFO")
    os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "INFO" if verbose else "WARNING")
    # The ephemeral API server takes ~10 s to start, far longer on a loaded 2-core machine.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # The flow reads the database from the environment: a URL (with its password) is never a
    # flow parameter, which the Prefect UI would show.
    os.environ["QUALIFY_DATABASE_URL"] = settings.database_url


def launch(request: RunRequest, settings: Settings, on_progress: ProgressCallback) -> RunOutcome:
    prepare_environment(settings, request.verbose)  # before Prefect is imported: it reads them at import
    from prefect.task_runners import ThreadPoolTaskRunner

    from qualify_prefect.flows.qualify_release import qualify_release

    # Every case's Prefect task waits on its Ray task: a pool smaller than the matrix would queue
    # cases behind Prefect instead of Ray.
    sized = qualify_release.with_options(task_runner=ThreadPoolTaskRunner(max_workers=max(4, request.n_cases + 2)))
    try:
        state = sized(manifest=str(request.manifest), ray_address=request.ray_address,
                      resume_run=request.resume_run, wait=request.wait, promote=request.promote,
                      triggered_by=request.triggered_by, on_progress=on_progress, return_state=True)
    except Exception as exc:  # noqa: BLE001 - Prefect itself could not start (API server, settings)
        raise InfraError(f"Prefect could not run the flow: {type(exc).__name__}: {exc}") from exc
    outcome: RunOutcome = state.result()  # raises the flow's expected error (BadInput, Rejected, ...)
    return outcome

"""Run the qualification flow in this process with Prefect (the `qualify run` launcher)."""

from __future__ import annotations

import atexit
import logging
import os

from qualify.errors import InfraError
from qualify.execution import early_ray
from qualify.launcher import ProgressCallback, RunRequest
from qualify.lifetime import bind_children_to_this_process
from qualify.outcomes import RunOutcome
from qualify.progress import listening
from qualify.settings import Settings
from qualify_prefect.driver import early_prefect
from qualify_prefect.driver.local_prefect import reusable_api_url


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
    if not os.environ.get("PREFECT_API_URL"):
        api = reusable_api_url(settings.prefect_reuse_port)
        if api:
            os.environ["PREFECT_API_URL"] = api


class _StateLines(logging.Filter):
    """Drops, from the console only, Prefect's own lines about a task or flow run that ended Failed
    ("Finished in state Failed(...)", "Task run failed with state ...", with "NoneType: None" after them):
    the flow ends Failed only on a QualifyError, whose message the CLI prints once (issue 24.8). The API (and
    so the UI) still gets them; --verbose shows them on the console too."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR or not record.name.startswith(("prefect.task_runs", "prefect.flow_runs")):
            return True
        message = record.getMessage()
        return not message.startswith(("Finished in state Failed", "Task run failed with state"))


def quiet_console() -> None:
    """Attach _StateLines to Prefect's console handlers (they exist once Prefect is imported)."""
    from prefect.logging.handlers import PrefectConsoleHandler

    loggers = [logging.getLogger()] + [logging.getLogger(name) for name in list(logging.root.manager.loggerDict)]
    for logger in loggers:
        for handler in getattr(logger, "handlers", []):
            if isinstance(handler, PrefectConsoleHandler) and not any(
                    isinstance(f, _StateLines) for f in handler.filters):
                handler.addFilter(_StateLines())


def launch(request: RunRequest, settings: Settings, on_progress: ProgressCallback) -> RunOutcome:
    bind_children_to_this_process()  # Prefect's API server, Ray, the workloads: dead with this process
    prepare_environment(settings, request.verbose)  # before Prefect is imported: it reads them at import
    server = None
    if not os.environ.get("PREFECT_API_URL"):
        # Prefect's temporary API server, started now rather than after Prefect's import (driver/early_prefect.py).
        # Stopped at interpreter exit, after Prefect's own exit handlers (registered later, run first) have sent
        # the last logs and events to it, as Prefect stops its own.
        server = early_prefect.start()
        atexit.register(server.stop)
    if request.local_ray and not settings.ray_address:
        early_ray.start_in_background(_start_local_ray)  # beside Prefect's start; the flow's Ray stage claims it
        early_ray.exit_on_sigterm()
    try:
        return _launch(request, on_progress, server)
    finally:
        early_ray.stop()  # a Ray nobody claimed (the run ended before its Ray stage) goes with the launcher


def _start_local_ray() -> None:
    from qualify.execution.ray import start_local_ray  # imported in early_ray's thread: Ray's import overlaps too

    start_local_ray()


def _launch(request: RunRequest, on_progress: ProgressCallback,
            server: early_prefect.TemporaryServer | None) -> RunOutcome:
    from prefect.task_runners import ThreadPoolTaskRunner

    from qualify_prefect.flows.qualify_release import qualify_release

    if server is not None:  # it started while the imports above ran
        try:
            server.wait_healthy(float(os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS") or 180))
        except RuntimeError as exc:
            raise InfraError(f"Prefect could not run the flow: {exc}") from None

    # Every case's Prefect task waits on its Ray task: a pool smaller than the matrix would queue
    # cases behind Prefect instead of Ray.
    if not request.verbose:
        quiet_console()
    sized = qualify_release.with_options(task_runner=ThreadPoolTaskRunner(max_workers=max(4, request.n_cases + 2)))
    try:
        with listening(on_progress):  # a callback, not a flow parameter (the UI would show and store it)
            state = sized(manifest=str(request.manifest), ray_address=request.ray_address,
                          resume_run=request.resume_run, wait=request.wait, promote=request.promote,
                          triggered_by=request.triggered_by, return_state=True)
    except Exception as exc:  # noqa: BLE001 - Prefect itself could not start (API server, settings)
        raise InfraError(f"Prefect could not run the flow: {type(exc).__name__}: {exc}") from exc
    # A FAIL or INCOMPLETE run ends Failed with its outcome as data (qualify_prefect.flows.verdict); an expected
    # error (BadInput, Rejected, ...) ends Failed with the error as data: raised here.
    result = state.result(raise_on_failure=False)
    if isinstance(result, BaseException):
        raise result
    if not isinstance(result, RunOutcome):
        raise InfraError(f"the flow ended {state.name} without an outcome: {state.message}")
    return result

"""A worker's log without tracebacks for outcomes that are not crashes, and under the flow run's final name.

The flow ends Failed on purpose for a FAIL or INCOMPLETE verdict (flows/verdict.py) and for an expected error
(a mistyped manifest, a refused candidate, a named infrastructure failure: qualify.errors.QualifyError), with the
message on the state. In a worker's flow-run process, Prefect's engine then re-raises that state's result and logs
"Engine execution exited with unexpected exception" with about 90 lines of traceback, and its task engine logs
"Task run failed with state ..." followed by "NoneType: None". Those records are dropped or cleaned here; a real
crash (any other exception) keeps its traceback. Installed when the flow module is imported, which is how a
worker's process loads the flow.

The flow run is renamed `<release>:<tag> run <id>` once its run is open; Prefect's engine keeps the name it
started with in its own logger, so its lines ("Finished in state ...") would still carry the interim name.
`rename` makes every later record of that flow run carry the final one.
"""

from __future__ import annotations

import logging

from prefect.exceptions import FailedRun

from qualify.errors import QualifyError

EXPECTED = (QualifyError, FailedRun)  # FailedRun: the engine's exception for a Failed state carrying an outcome
LOGGERS = ("prefect.engine", "prefect.flow_runs", "prefect.task_runs")


_NAMES: dict[str, str] = {}  # flow run id -> its final name


def rename(flow_run_id: str, name: str) -> None:
    _NAMES[str(flow_run_id)] = name


class ExpectedFailures(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        renamed = _NAMES.get(str(getattr(record, "flow_run_id", "")))
        if renamed is not None:
            record.flow_run_name = renamed
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, EXPECTED) and "unexpected exception" in record.getMessage():
            return False  # not unexpected: the flow run's state already says what happened, in one line
        if record.exc_info and exc is None:
            record.exc_info = None  # "NoneType: None": no exception to show
        return True


def install() -> None:
    for name in LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, ExpectedFailures) for f in logger.filters):
            logger.addFilter(ExpectedFailures())

"""A worker's log without tracebacks for outcomes that are not crashes.

The flow ends Failed on purpose for a FAIL or INCOMPLETE verdict (flows/verdict.py) and for an expected error
(a mistyped manifest, a refused candidate, a named infrastructure failure: qualify.errors.QualifyError), with the
message on the state. In a worker's flow-run process, Prefect's engine then re-raises that state's result and logs
"Engine execution exited with unexpected exception" with about 90 lines of traceback, and its task engine logs
"Task run failed with state ..." followed by "NoneType: None". Those records are dropped or cleaned here; a real
crash (any other exception) keeps its traceback. Installed when the flow module is imported, which is how a
worker's process loads the flow.
"""

from __future__ import annotations

import logging

from prefect.exceptions import FailedRun

from qualify.errors import QualifyError

EXPECTED = (QualifyError, FailedRun)  # FailedRun: the engine's exception for a Failed state carrying an outcome
LOGGERS = ("prefect.engine", "prefect.flow_runs", "prefect.task_runs")


class ExpectedFailures(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
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

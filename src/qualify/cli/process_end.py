"""End `qualify run`'s process without the interpreter's module teardown (issue 27: the whole command's fixed cost).

After a run the interpreter holds Prefect, Ray's core worker, SQLAlchemy and thousands of pydantic models. Its
teardown, after the last exit handler (every module's globals cleared, the heap collected, extension modules'
static destructors), took 0.55-0.65 s here, and nothing in it is the user's. `end_now` runs what an interpreter
exit runs that matters, in the interpreter's own order: threading's exit callbacks (Prefect's log and event
services drain there) and the non-daemon threads joined, then atexit's handlers (Prefect's temporary server's
stop, Ray's shutdown, logging's flush); then it flushes stdout and stderr and ends the process with os._exit.
Only the console script uses it: an in-process caller (a test's CliRunner) keeps the normal exit.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn


def exit_code(exc: SystemExit) -> int:
    """The status the interpreter would exit with for this SystemExit (None: 0; an int: itself; else printed, 1)."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def end_now(code: int) -> NoReturn:
    # CPython's own two exit steps; an interpreter without them gets the normal exit.
    shutdown_threads = getattr(threading, "_shutdown", None)
    run_exit_handlers = getattr(atexit, "_run_exitfuncs", None)
    if shutdown_threads is None or run_exit_handlers is None or threading.current_thread() is not \
            threading.main_thread():
        sys.exit(code)
    # First threading's exit callbacks (Prefect's log and event services drain there, while its temporary API
    # server is still up: skipped, the last logs waited 5 s for a server already stopped), then the non-daemon
    # threads joined; then the exit handlers.
    shutdown_threads()
    run_exit_handlers()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can reach it
            pass
    os._exit(code)

"""A local Ray started while Prefect starts (issue 27: the whole command's fixed cost).

`qualify run` on the embedded default starts a local Ray (3-5 s here) and, before the flow, imports Prefect and
starts its ephemeral API (about 10 s) or connects to a running server: one after the other, they were most of
the whole command's overhead. The launcher starts Ray at once in a thread of its own, and the flow's Ray stage
claims it (`claim`), as if it had started it: the flow still owns it and shuts it down.

The thread lives until Ray is shut down, and shuts it down itself: Ray starts its GCS and raylet with
PR_SET_PDEATHSIG, which Linux fires when the *thread* that started them ends, not the process (a Ray started in
a thread that returned lost its GCS at once: "Failed to connect to GCS"). Its shutdown (about 1.4 s here) then
overlaps Prefect's end of the flow run; the launcher waits for it before it returns (`stop`).

ray.init sets its SIGTERM handler (exit, so that the driver's cleanup runs) only on the main thread: the launcher
sets the same one there (`exit_on_sigterm`).

No Ray import here: the start function the launcher hands over imports it in the thread, beside Prefect's import
on the main thread.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from typing import Callable

SHUTDOWN_WAIT_S = 60.0  # the launcher's wait for the owner thread's ray.shutdown()


# What ray.init says on its way up that this start makes wrong or out of place, by logger: that it set no SIGTERM
# handler off the main thread (the launcher sets it: exit_on_sigterm), and that token authentication is on (Ray's
# default, said while Prefect is still starting: a run that then fails on bad input or an unreachable registry
# must say so in one line). The warning that authentication is *off* is left alone.
_START_NOTICES = {
    "ray._private.worker": "SIGTERM handler is not set",
    "ray._private.authentication.authentication_token_setup": "Token authentication is enabled for this Ray",
}


class _StartNotice(logging.Filter):
    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefix)


class _Owner:
    """The thread that started the local Ray: it waits to be released, then shuts Ray down itself."""

    def __init__(self, start: Callable[[], None]) -> None:
        self.start = start
        self.ready = threading.Event()
        self.released = threading.Event()
        self.error: BaseException | None = None
        self.claimed = False
        self.thread = threading.Thread(target=self._run, name="qualify-ray-owner", daemon=True)

    def _run(self) -> None:
        try:
            for name, prefix in _START_NOTICES.items():
                logging.getLogger(name).addFilter(_StartNotice(prefix))
            self.start()
        except BaseException as exc:  # noqa: BLE001 - handed to whoever claims it, raised there
            self.error = exc
        finally:
            self.ready.set()
        if self.error is None:
            self.released.wait()
            import ray

            if ray.is_initialized():
                ray.shutdown()
            from qualify.execution import ray_auth

            ray_auth.restore()  # the local Ray's token mode does not outlive it (execution/ray_auth.py)


_lock = threading.Lock()
_owner: _Owner | None = None


def start_in_background(start: Callable[[], None]) -> None:
    """Start the local Ray with `start` (qualify.execution.ray.start_local_ray, imported by it: this module
    imports no Ray, and the Ray module claims from it) in its owner thread; once (a second call while one is
    pending does nothing)."""
    global _owner
    with _lock:
        if _owner is not None:
            return
        _owner = _Owner(start)
        _owner.thread.start()


def claim() -> bool:
    """Wait for the background start; True when it started Ray (the caller now owns it and shuts it down), False
    when there was none. A failed start raises its error here, as starting Ray in place would have."""
    with _lock:
        owner = _owner
    if owner is None or owner.claimed:
        return False
    owner.ready.wait()
    owner.claimed = True
    if owner.error is not None:
        raise owner.error
    return True


def hand_back() -> None:
    """The claimed Ray is no longer needed: its owner thread shuts it down, beside whatever the caller does next."""
    with _lock:
        owner = _owner
    if owner is not None:
        owner.released.set()


def stop() -> None:
    """The launcher's last word: the owner thread shuts down a Ray that nobody claimed (the run ended before its
    Ray stage, bad input say) or that was handed back, and this waits for it."""
    global _owner
    with _lock:
        owner, _owner = _owner, None
    if owner is None:
        return
    owner.released.set()
    owner.thread.join(SHUTDOWN_WAIT_S)


def exit_on_sigterm() -> None:
    """What ray.init does on the main thread: SIGTERM exits, so that the flow marks its run and cleans up."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(signum))

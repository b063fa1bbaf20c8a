"""Stopping a process and everything it started: the one process-group killer.

Standard library only: the training workload uses it for its launcher (inside the image),
the executors and the container builder on the orchestrator side.
"""

from __future__ import annotations

import os
import signal
import subprocess

# Defaults: time to exit after SIGTERM (write a document, stop its own children), then
# time for the kernel to reap after SIGKILL.
GRACE_S = 5.0
KILL_WAIT_S = 5.0


def _signal_group(proc: subprocess.Popen, sig: int) -> bool:
    """Send sig to proc's process group (proc alone when the group is not ours to signal).

    False when nothing of the group is left.
    """
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        try:
            proc.send_signal(sig)
        except ProcessLookupError:
            return False
    return True


def kill_group(proc: subprocess.Popen, grace_s: float = GRACE_S, kill_wait_s: float = KILL_WAIT_S) -> None:
    """SIGTERM proc's process group, wait up to grace_s for proc to exit, then SIGKILL the group.

    proc must lead its own process group (started with start_new_session=True). The
    SIGKILL goes to the group even when proc exited in time, so that a child that ignored
    SIGTERM does not survive; the last wait is bounded too (kill_wait_s). Only waits
    (never reads proc's pipes), so it may run in another thread than the one reading them.
    """
    if not _signal_group(proc, signal.SIGTERM):
        return
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    if not _signal_group(proc, signal.SIGKILL):
        return
    try:
        proc.wait(timeout=kill_wait_s)
    except subprocess.TimeoutExpired:
        pass

"""Stopping a process and everything it started: the one process-group killer, and
PR_SET_PDEATHSIG so that what a workload starts dies with it.

Standard library only: the training workload uses it for its launcher (inside the image),
the executors and the container builder on the orchestrator side.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from typing import Callable

# Defaults: time to exit after SIGTERM (write a document, stop its own children), then
# time for the kernel to reap after SIGKILL.
GRACE_S = 5.0
KILL_WAIT_S = 5.0
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


_PRCTL: list = []


def _prctl() -> Callable[..., int] | None:
    """libc's prctl (looked up once, in the parent: a preexec_fn must not load libraries)."""
    if not _PRCTL:
        fn = None
        if sys.platform.startswith("linux"):
            try:
                fn = ctypes.CDLL(None, use_errno=True).prctl
            except (OSError, AttributeError):
                fn = None
        _PRCTL.append(fn)
    return _PRCTL[0]


def _prctl_pdeathsig(sig: int, prctl: Callable[..., int] | None) -> bool:
    if prctl is None:
        return False
    try:
        return prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, ctypes.ArgumentError):
        return False


def die_with_parent(sig: int = signal.SIGKILL, *, orphaned_if_init: bool = False) -> bool:
    """Ask the kernel to send sig to this process when its parent dies (Linux PR_SET_PDEATHSIG).

    A workload then never outlives a killed executor (or a killed launcher): its ranks would
    keep their devices while a retry starts beside them. SIGKILL by default: a rank stuck in a
    C call (a collective) never runs a Python SIGTERM handler. When the parent died already
    (between the two getppid() calls; or, with orphaned_if_init, before this call: a launched
    rank whose parent is init has lost its launcher), the signal is raised at once. False where
    unsupported (not Linux).
    """
    parent = os.getppid()
    if not _prctl_pdeathsig(sig, _prctl()):
        return False
    if os.getppid() != parent or (orphaned_if_init and parent == 1 and os.getpid() != 1):
        os.kill(os.getpid(), sig)
    return True


def pdeathsig_preexec(sig: int = signal.SIGKILL) -> Callable[[], None]:
    """A subprocess preexec_fn that makes the child die with the process that starts it.

    Use it in the parent's main thread: the signal fires when the *thread* that forked exits.
    """
    parent = os.getpid()
    prctl = _prctl()

    def preexec() -> None:
        if _prctl_pdeathsig(sig, prctl) and os.getppid() != parent:
            os.kill(os.getpid(), sig)

    return preexec


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

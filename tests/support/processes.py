"""Stopping what a test started in its own process group: SIGTERM, a grace period, then SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess


def stop_group(proc: subprocess.Popen, grace_s: float = 30.0) -> None:  # type: ignore[type-arg]
    """End `proc`'s process group (started with start_new_session=True); a group already gone is fine."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

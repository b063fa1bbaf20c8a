"""Stopping what a test started in its own process group: SIGTERM, a grace period, then SIGKILL; and finding the
processes of one test's run by the mark its environment carries (QUALIFY_TEST_MARK: a workload inherits it), not
by name, since another test's run may be beside it (`pytest -n 2`)."""

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


MARK_VARIABLE = "QUALIFY_TEST_MARK"


def carrying_mark(mark: str) -> set[int]:
    """The living (not zombie) processes whose environment holds QUALIFY_TEST_MARK=mark."""
    needle = f"{MARK_VARIABLE}={mark}".encode()
    found = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                if needle not in fh.read().split(b"\0"):
                    continue
            with open(f"/proc/{name}/stat", "rb") as fh:
                if fh.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    continue
        except (OSError, IndexError):
            continue
        found.add(int(name))
    return found


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""

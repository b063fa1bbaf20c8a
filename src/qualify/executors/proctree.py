"""Every process a workload started, wherever it went: found in /proc, killed by pid.

A process group is not enough: a training workload starts torchrun/deepspeed in a new session
(its own group), and their ranks may start more. So the executor marks the workload's
environment with a token (TRACK_VAR, inherited by everything it starts), samples the
workload's descendants by parent pid while it runs, and at the end kills every process that
it saw or that carries the token. A process is identified by pid AND start time, so a reused
pid is never signalled. Linux only (/proc); elsewhere nothing is tracked and the group kill of
qualify.workloads.procs is all there is.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Iterable

TRACK_VAR = "QUALIFY_EXEC_TOKEN"
PROC = "/proc"


def _stat(pid: int) -> tuple[int, int, str, int] | None:
    """(ppid, pgid, state, start time) of a process; None when it is gone."""
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as fh:
            data = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    # comm (field 2) may hold spaces and parentheses: split after its last ')'.
    rest = data[data.rfind(")") + 2:].split()
    try:
        return int(rest[1]), int(rest[2]), rest[0], int(rest[19])
    except (IndexError, ValueError):
        return None


def _pids() -> list[int]:
    try:
        return [int(name) for name in os.listdir(PROC) if name.isdigit()]
    except OSError:
        return []


def supported() -> bool:
    return os.path.isdir(f"{PROC}/self")


def descendants(root: int) -> dict[int, int]:
    """pid -> start time of every living descendant of root (root excluded)."""
    children: dict[int, list[tuple[int, int]]] = {}
    for pid in _pids():
        st = _stat(pid)
        if st is not None and st[2] != "Z":
            children.setdefault(st[0], []).append((pid, st[3]))
    found: dict[int, int] = {}
    todo = [root]
    while todo:
        for pid, start in children.get(todo.pop(), []):
            if pid not in found:
                found[pid] = start
                todo.append(pid)
    return found


def carrying(token: str) -> dict[int, int]:
    """pid -> start time of every living process whose environment holds TRACK_VAR=token."""
    needle = f"{TRACK_VAR}={token}".encode()
    found: dict[int, int] = {}
    me = os.getpid()
    for pid in _pids():
        if pid == me:
            continue
        try:
            with open(f"{PROC}/{pid}/environ", "rb") as fh:
                env = fh.read()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            st = _stat(pid)
            if st is not None and st[2] != "Z":
                found[pid] = st[3]
    return found


class ProcessTracker:
    """The processes of one workload: its descendants as sampled, plus those carrying its token."""

    def __init__(self, root: int, token: str | None) -> None:
        self.root = root
        self.token = token
        self.seen: dict[int, int] = {}
        self.enabled = supported()

    def sample(self) -> None:
        if self.enabled:
            self.seen.update(descendants(self.root))

    def alive(self) -> dict[int, int]:
        """The tracked processes still running (same pid and start time, not a zombie)."""
        if not self.enabled:
            return {}
        current = dict(self.seen)
        if self.token:
            current.update(carrying(self.token))
        self.seen.update(current)
        out = {}
        for pid, start in current.items():
            st = _stat(pid)
            if st is not None and st[3] == start and st[2] != "Z":
                out[pid] = start
        return out

    def signal(self, sig: int, pids: Iterable[int] | None = None) -> int:
        """Send sig to every tracked process still alive (and to the groups they lead); the count."""
        targets = self.alive() if pids is None else {p: self.seen[p] for p in pids if p in self.seen}
        own_group = os.getpgid(0)
        sent = 0
        for pid, start in targets.items():
            st = _stat(pid)
            if st is None or st[3] != start:
                continue
            try:
                os.kill(pid, sig)
                sent += 1
            except (ProcessLookupError, PermissionError):
                continue
            if st[1] == pid and pid != own_group:  # a group leader (a relaunched launcher): its group too
                try:
                    os.killpg(pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
        return sent

    def kill_all(self, grace_s: float = 0.0, wait_s: float = 5.0) -> list[int]:
        """SIGTERM (when grace_s > 0), then SIGKILL, whatever is left; the pids that survived both."""
        if grace_s > 0 and self.signal(signal.SIGTERM):
            end = time.monotonic() + grace_s
            while time.monotonic() < end and self.alive():
                time.sleep(0.1)
        self.signal(signal.SIGKILL)
        end = time.monotonic() + wait_s
        left = self.alive()
        while left and time.monotonic() < end:
            time.sleep(0.05)
            left = self.alive()
        return sorted(left)

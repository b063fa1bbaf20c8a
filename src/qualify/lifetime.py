"""Whatever a driver starts dies with it, even when the driver alone is killed with SIGKILL (Linux).

Prefect's ephemeral API server (a uvicorn subprocess), Ray's processes (GCS, raylet, the dashboard and
runtime-env agents, workers) and the workloads are started by libraries whose Popen calls qualify does not
control, and several of them outlive their parent: reparented to init, still listening on loopback, still
holding the driver's environment. PR_SET_PDEATHSIG cannot be set on another library's children, so a driver
calls `bind_children_to_this_process()` once, before it starts anything, and that starts a watcher:

* the driver's environment gets a fresh token (QUALIFY_LIFETIME); every process started afterwards inherits
  it, wherever it moves (a new session, a new parent);
* the watcher (a small child process with no secrets in its environment) records the driver's descendants
  every WATCH_INTERVAL_S, by pid and start time, so that a process that dropped the inherited environment is
  still known;
* when the driver is gone (the watcher's parent changed: killed, crashed, or exited), the watcher SIGKILLs
  every recorded process that still runs, every process carrying the token, and their descendants, until none
  is left, then exits.

A clean exit leaves nothing to kill; a leak is killed too. Not Linux: nothing is done (no /proc).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass

TOKEN_VARIABLE = "QUALIFY_LIFETIME"
WATCH_INTERVAL_S = 0.5  # a /proc scan costs ~20 ms on a loaded machine: ~4% of a core
_watcher: subprocess.Popen[bytes] | None = None


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    start: int  # clock ticks after boot: tells a process from a later one that reused its pid


def bind_children_to_this_process() -> int | None:
    """Start this process's watcher (once per process); returns its pid, None where there is no /proc."""
    global _watcher
    if _watcher is not None and _watcher.poll() is None:
        return _watcher.pid
    if not sys.platform.startswith("linux"):
        return None
    token = f"{os.getpid()}-{uuid.uuid4().hex}"
    os.environ[TOKEN_VARIABLE] = token  # inherited by everything started from now on
    # The watcher carries no secret: only what it needs to import this module.
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "PYTHONPATH", "LANG", "LC_ALL")}
    _watcher = subprocess.Popen([sys.executable, "-m", "qualify.lifetime", str(os.getpid()), token],
                                env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
    return _watcher.pid


# --------------------------------------------------------------------------- the watcher's side


def processes() -> dict[int, Proc]:
    out: dict[int, Proc] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if fields[0] in (b"Z", b"X"):
            continue
        out[int(name)] = Proc(int(name), int(fields[1]), int(fields[19]))
    return out


def descendants(roots: set[int], table: dict[int, Proc]) -> set[int]:
    children: dict[int, list[int]] = {}
    for proc in table.values():
        children.setdefault(proc.ppid, []).append(proc.pid)
    found: set[int] = set()
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def carrying(token: str, table: dict[int, Proc]) -> set[int]:
    needle = f"{TOKEN_VARIABLE}={token}".encode()
    found = set()
    for pid in table:
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                if needle in fh.read().split(b"\0"):
                    found.add(pid)
        except OSError:
            continue
    return found


def kill_run(recorded: dict[int, int], token: str, rounds: int = 20) -> None:
    """SIGKILL the recorded processes still running (same start time), the token's carriers and their
    descendants; again until a round finds none (a dying parent may start a child meanwhile)."""
    me = os.getpid()
    for _ in range(rounds):
        table = processes()
        targets = {pid for pid, start in recorded.items() if pid in table and table[pid].start == start}
        targets |= carrying(token, table)
        targets |= descendants(targets, table)
        targets.discard(me)
        if not targets:
            return
        for pid in targets:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.05)


def watch(driver: int, token: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C for the driver's terminal is not for the watcher
    recorded: dict[int, int] = {}
    me = os.getpid()
    while os.getppid() == driver:
        table = processes()
        for pid in descendants({driver}, table) - {me}:
            recorded.setdefault(pid, table[pid].start)
        time.sleep(WATCH_INTERVAL_S)
    kill_run(recorded, token)


if __name__ == "__main__":  # python -m qualify.lifetime DRIVER_PID TOKEN
    watch(int(sys.argv[1]), sys.argv[2])

"""A driver killed alone with SIGKILL takes everything it started with it (issue 25, qualify.lifetime):
Prefect's ephemeral API server, Ray's GCS, raylet, agents and workers, and the running workload. Only the
driver's pid is killed, never its process group, as `kill -9 PID` of a user or an OOM killer would.

A run's processes are the driver's descendants just before the kill plus every process carrying the test's
marker variable (inherited wherever a process moved: a new session, reparented to init)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest
from support.flows import REPO, cli_env, sleep_manifest

# About the ephemeral API server too: it must die with the driver (no shared server for this test).
# Shares the machine under -n 2: what it times (everything gone within 10 s of the kill) is the kernel's and the
# lifetime watcher's work, and held with two busy processes beside it.
pytestmark = [pytest.mark.slow, pytest.mark.ephemeral_prefect,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")]


def _marked(mark: str) -> set[int]:
    needle = f"QUALIFY_TEST_MARK={mark}".encode()
    found = set()
    for proc in psutil.process_iter():
        try:
            with open(f"/proc/{proc.pid}/environ", "rb") as fh:
                if needle in fh.read().split(b"\0") and proc.status() != psutil.STATUS_ZOMBIE:
                    found.add(proc.pid)
        except (OSError, psutil.Error):
            continue
    return found


def _run_of(driver: int, mark: str) -> set[int]:
    """The driver's descendants and every process carrying the mark (Ray's agents may not inherit it)."""
    try:
        descendants = {p.pid for p in psutil.Process(driver).children(recursive=True)}
    except psutil.Error:
        descendants = set()
    return (_marked(mark) | descendants) - {driver}


def _cmdlines(pids: set[int]) -> dict[int, str]:
    out = {}
    for pid in pids:
        try:
            out[pid] = " ".join(psutil.Process(pid).cmdline())[:160]
        except psutil.Error:
            continue
    return out


def _listeners(pids: set[int] | None = None) -> dict[tuple[str, int], int | None]:
    """Listening address -> the pid that holds it: every listener on the machine, or those of `pids`."""
    return {(c.laddr.ip, c.laddr.port): c.pid for c in psutil.net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN and (pids is None or c.pid in pids)}


def _still_held(addresses: dict[tuple[str, int], int | None], alive_at_kill: set[int]) -> dict[tuple[str, int], str]:
    """The run's listening addresses that a process alive at the kill still holds, each with its holder's pid and
    command line.
    The other test worker's processes bind ports all the time: one started after the kill may get a port the run
    let go (CI once saw "still listening" on one port after every process of the run was gone); it is not the run's."""
    return {address: f"pid {pid}: {_cmdlines({pid}).get(pid, '?') if pid else '?'}"
            for address, pid in _listeners().items()
            if address in addresses and (pid is None or pid in alive_at_kill)}


def _wait(predicate, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")


def test_kill_9_of_the_driver_alone_leaves_no_process_and_no_listener(tmp_path: Path) -> None:
    mark = uuid.uuid4().hex
    manifest = sleep_manifest(tmp_path / "m.yaml", [{"name": "nap", "kind": "sleep", "params": {"duration_s": 300}}],
                              timeout_s=600)
    driver = subprocess.Popen([sys.executable, "-m", "qualify", "run", str(manifest), "--db",
                               f"sqlite:///{tmp_path / 'q.db'}"], env=cli_env(tmp_path, QUALIFY_TEST_MARK=mark),
                              cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def running() -> dict[int, str] | None:  # Prefect's server, Ray, and the workload are all up
            lines = _cmdlines(_run_of(driver.pid, mark))
            text = "\n".join(lines.values())
            want = ("raylet", "ray::DashboardAgent", "ray::RuntimeEnvAgent", "uvicorn", "qualify.workloads.sleep")
            return lines if all(w in text for w in want) else None

        _wait(running, 300, "the run's Prefect server, Ray and workload")
        run = _run_of(driver.pid, mark)
        addresses = _listeners(run)
        names = _cmdlines(run)
        assert addresses, "the run listens somewhere (Prefect's API server at least)"
        alive_at_kill = set(psutil.pids())
        os.kill(driver.pid, signal.SIGKILL)  # the driver alone
        driver.wait(timeout=30)
        killed_at = time.monotonic()
        left: set[int] = set()
        held: dict[tuple[str, int], str] = {}
        while time.monotonic() - killed_at < 10:
            left = {p for p in run | _marked(mark) if psutil.pid_exists(p)
                    and psutil.Process(p).status() != psutil.STATUS_ZOMBIE}
            held = _still_held(addresses, alive_at_kill)
            if not left and not held:
                break
            time.sleep(0.25)
        leftovers = {pid: names.get(pid, "?") for pid in left}
        assert not left, f"left after 10 s: {leftovers}"
        assert not held, f"still listening after 10 s: {held}"
    finally:
        if driver.poll() is None:
            driver.kill()
        for pid in _marked(mark):  # whatever the code under test left
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def test_a_listener_counts_as_left_only_when_its_holder_was_alive_at_the_kill() -> None:
    import socket

    with socket.socket() as mine:
        mine.bind(("127.0.0.1", 0))
        mine.listen()
        address = ("127.0.0.1", mine.getsockname()[1])
        alive_at_kill = set(psutil.pids())  # this process was alive "at the kill": its listener is the run's
        assert address in _still_held({address: os.getpid()}, alive_at_kill)
        later = subprocess.Popen([sys.executable, "-c", "import socket, sys, time\n"
                                  "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
                                  "print(s.getsockname()[1], flush=True); time.sleep(60)"],
                                 stdout=subprocess.PIPE, text=True)
        try:
            # A process started after the kill, on a port the run once held: another test's, not left by the run.
            port = int(later.stdout.readline())
            assert _still_held({("127.0.0.1", port): 1}, alive_at_kill) == {}
            assert ("127.0.0.1", port) in _still_held({("127.0.0.1", port): 1}, alive_at_kill | {later.pid})
        finally:
            later.kill()
            later.wait()

"""The local Ray that `qualify run` starts while Prefect starts (qualify.execution.early_ray): the flow's Ray stage
claims it and it works from the main thread; it survives the moment its start returns (Ray's processes carry
PR_SET_PDEATHSIG, fired when the thread that started them ends); it listens on loopback only; it is shut down
(handed back, or never claimed) and leaves no process; a failed start is raised where it is claimed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.ray]

PROBE = r"""
import os, signal, subprocess, sys, threading, time
import psutil
from qualify.execution import early_ray
mode = sys.argv[1]
if mode == "fails":
    import qualify.execution.ray as qray
    def refuse(*_a, **_k):
        from qualify.errors import InfraError
        raise InfraError("no Ray here")
    qray.start_local_ray = refuse
from qualify_prefect.driver.prefect_launcher import _start_local_ray
early_ray.start_in_background(_start_local_ray)
early_ray.exit_on_sigterm()
print("SIGTERM", signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None))
if mode == "fails":
    from qualify.execution.ray import start_ray
    try:
        start_ray()
    except Exception as exc:
        print("RAISED", type(exc).__name__, exc)
    early_ray.stop()
    sys.exit(0)
if mode == "unclaimed":
    time.sleep(8)  # the start finishes meanwhile (or not): stop waits for it either way
    kids = psutil.Process().children(recursive=True)
    early_ray.stop()
else:
    from qualify.execution.ray import start_ray
    handle = start_ray()
    print("EARLY", handle.early, handle.started_here)
    import ray
    @ray.remote
    def ping():
        return os.getpid()
    time.sleep(2)  # well after the start returned: its processes must still be there
    print("PINGS", len(set(ray.get([ping.remote() for _ in range(8)]))) >= 1)
    kids = psutil.Process().children(recursive=True)
    ours = {p.pid for p in kids} | {os.getpid()}
    for c in psutil.net_connections("tcp"):
        if c.status == "LISTEN" and c.pid in ours:
            print("LISTEN", c.laddr.ip)
    handle.shutdown()
    early_ray.stop()
import ray
print("INITIALIZED", ray.is_initialized())
print("OWNER", any(t.name == "qualify-ray-owner" for t in threading.enumerate()))
time.sleep(1)
left = [p for p in kids if p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        and "qualify.lifetime" not in " ".join(p.cmdline())]
print("LEFT", [" ".join(p.cmdline())[:80] for p in left])
"""


def _probe(tmp_path: Path, mode: str) -> str:
    temp = tempfile.mkdtemp(prefix="qer-")  # Ray's socket paths must stay under 107 bytes: not pytest's tmp_path
    env = {**os.environ, "QUALIFY_RAY_TEMP": temp, "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("QUALIFY_RAY_ADDRESS", None)
    try:
        res = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=300,
                             env=env, cwd=tmp_path)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    # The launcher sets the SIGTERM handler, and auth on is Ray's default: neither notice is printed.
    assert "SIGTERM handler is not set" not in res.stderr and "Token authentication is enabled" not in res.stderr
    return res.stdout


def test_a_claimed_background_ray_works_on_loopback_and_is_shut_down(tmp_path: Path) -> None:
    out = _probe(tmp_path, "claimed")
    assert "SIGTERM True" in out and "EARLY True True" in out and "PINGS True" in out, out
    listening = {line.split()[1] for line in out.splitlines() if line.startswith("LISTEN")}
    assert listening and listening <= {"127.0.0.1", "::ffff:127.0.0.1"}, out
    assert "INITIALIZED False" in out and "OWNER False" in out and "LEFT []" in out, out


def test_an_unclaimed_background_ray_is_shut_down_by_the_launcher(tmp_path: Path) -> None:
    out = _probe(tmp_path, "unclaimed")
    assert "INITIALIZED False" in out and "OWNER False" in out and "LEFT []" in out, out


def test_a_failed_background_start_is_raised_where_it_is_claimed(tmp_path: Path) -> None:
    out = _probe(tmp_path, "fails")
    assert "RAISED InfraError no Ray here" in out, out

"""The standard-library helpers both sides share: the process-group killer and the merge."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from qualify.workloads.procs import kill_group


def _start(code: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def _gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state == "Z":  # dead, waiting for its new parent to reap it
            return True
        time.sleep(0.05)
    return False


def test_kill_group_lets_a_process_exit_on_sigterm():
    proc = _start("import signal, sys, time\n"
                  "signal.signal(signal.SIGTERM, lambda *a: sys.exit(3))\n"
                  "print('ready', flush=True)\ntime.sleep(60)")
    start = time.monotonic()
    kill_group(proc, grace_s=20, kill_wait_s=5)
    assert proc.returncode == 3 and time.monotonic() - start < 10


def test_kill_group_kills_what_ignores_sigterm_after_the_grace(tmp_path):
    # The leader ignores SIGTERM; its child too and outlives it unless the group gets SIGKILL.
    pidfile = tmp_path / "child.pid"
    proc = _start("import signal, subprocess, time\n"
                  "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                  f"c = subprocess.Popen(['sleep', '60'])\nopen({str(pidfile)!r}, 'w').write(str(c.pid))\n"
                  "print('ready', flush=True)\ntime.sleep(60)")
    child = int(pidfile.read_text())
    start = time.monotonic()
    kill_group(proc, grace_s=0.5, kill_wait_s=5)
    assert proc.returncode == -signal.SIGKILL and time.monotonic() - start >= 0.5
    assert _gone(child)


def test_kill_group_reaches_a_child_that_ignores_sigterm_after_the_leader_left(tmp_path):
    pidfile = tmp_path / "child.pid"
    proc = _start("import subprocess, time\n"
                  "c = subprocess.Popen(['sh', '-c', 'trap \"\" TERM; sleep 60 & wait'])\n"
                  f"open({str(pidfile)!r}, 'w').write(str(c.pid))\n"
                  "print('ready', flush=True)\ntime.sleep(60)")
    child = int(pidfile.read_text())
    kill_group(proc, grace_s=5, kill_wait_s=5)
    assert proc.returncode == -signal.SIGTERM
    assert _gone(child)


def test_kill_group_of_a_finished_process_is_quiet():
    proc = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    proc.wait()
    kill_group(proc)
    assert proc.returncode == 0


def test_probe_never_takes_the_driver_version_from_the_image_environment(monkeypatch, tmp_path):
    # Issue 11: no tool answers -> the driver is unknown, whatever ACCELERATOR_DRIVER_VERSION claims.
    import builtins

    from qualify.workloads import probe

    real_open = builtins.open

    def no_nvidia(path, *a, **kw):
        if str(path).startswith("/proc/driver/nvidia"):
            raise OSError("no such file")
        return real_open(path, *a, **kw)

    monkeypatch.setattr(builtins, "open", no_nvidia)
    monkeypatch.setattr(probe.shutil, "which", lambda name: None)
    monkeypatch.setenv("ACCELERATOR_DRIVER_VERSION", "999.99")
    assert probe.driver_version() is None
    facts = probe.handler({"params": {"torch": False}}, None)["environment"]["facts"]
    assert facts["driver"] is None

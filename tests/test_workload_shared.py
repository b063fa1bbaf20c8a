"""The standard-library helpers both sides share: the process-group killer and the merge."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from qualify.workloads.merge import deep_merge
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


def test_deep_merge_merges_nested_dicts_and_shares_nothing():
    base = {"zero_optimization": {"stage": 2, "overlap_comm": True}, "bf16": {"enabled": True}, "x": [1]}
    top = {"zero_optimization": {"stage": 3}, "bf16": False, "y": {"z": [2]}}
    out = deep_merge(base, top)
    assert out == {"zero_optimization": {"stage": 3, "overlap_comm": True}, "bf16": False, "x": [1],
                   "y": {"z": [2]}}
    out["zero_optimization"]["stage"] = 0
    out["x"].append(9)
    out["y"]["z"].append(9)
    assert base == {"zero_optimization": {"stage": 2, "overlap_comm": True}, "bf16": {"enabled": True}, "x": [1]}
    assert top == {"zero_optimization": {"stage": 3}, "bf16": False, "y": {"z": [2]}}


# ---------------------------------------------------------------- settings

def test_settings_defaults_from_an_empty_environment():
    import dataclasses

    import pytest

    from qualify.workloads.settings import WorkloadSettings

    s = WorkloadSettings.from_env({})
    home_cache = os.path.join(os.path.expanduser("~"), ".cache", "qualify")
    assert (s.cache_dir, s.models_dir, s.hostfile, s.visible_devices, s.rank_result_dir) == (
        home_cache, None, None, None, None)
    assert s.cache_env() == {"TORCH_EXTENSIONS_DIR": os.path.join(home_cache, "torch_extensions"),
                             "TORCHINDUCTOR_CACHE_DIR": os.path.join(home_cache, "inductor")}
    assert (s.launched, s.rank, s.local_rank, s.world_size, s.local_world_size) == (False, 0, 0, 1, 1)
    assert dict(s.rendezvous) == {}
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.rank = 1  # type: ignore[misc]


def test_settings_read_every_variable():
    import pytest

    from qualify.workloads.settings import WorkloadSettings

    env = {"QUALIFY_CACHE_DIR": "/c", "TORCH_EXTENSIONS_DIR": "/ext", "TORCHINDUCTOR_CACHE_DIR": "",
           "QUALIFY_MODELS_DIR": "/models", "QUALIFY_HOSTFILE": "/hosts", "RANK": "3", "LOCAL_RANK": "1",
           "WORLD_SIZE": "8", "MASTER_ADDR": "h0", "CUDA_VISIBLE_DEVICES": "0,1",
           "QUALIFY_RANK_RESULT_DIR": "/scratch/ranks", "UNRELATED": "x"}
    s = WorkloadSettings.from_env(env)
    assert (s.cache_dir, s.models_dir, s.hostfile) == ("/c", "/models", "/hosts")
    # An empty cache variable counts as unset.
    assert s.cache_env() == {"TORCH_EXTENSIONS_DIR": "/ext", "TORCHINDUCTOR_CACHE_DIR": "/c/inductor"}
    assert (s.launched, s.rank, s.local_rank, s.world_size, s.local_world_size) == (True, 3, 1, 8, 8)
    assert WorkloadSettings.from_env({**env, "LOCAL_WORLD_SIZE": "4"}).local_world_size == 4
    assert dict(s.rendezvous) == {"MASTER_ADDR": "h0", "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8"}
    assert (s.visible_devices, s.rank_result_dir) == ("0,1", "/scratch/ranks")
    assert not hasattr(s, "accelerator_driver_version")  # the image cannot claim its own driver
    assert WorkloadSettings.from_env({"QUALIFY_TRAIN_LAUNCHED": "1"}).launched
    assert not WorkloadSettings.from_env({"RANK": "0", "WORLD_SIZE": "1"}).launched
    with pytest.raises(ValueError, match="LOCAL_RANK: expected an integer, got 'a'"):
        WorkloadSettings.from_env({"LOCAL_RANK": "a"})


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

"""No hangs, no orphans (issue 13): a per-case timeout stops the whole tree of a workload, every wait
of the executor is bounded, a workload dies with its executor, and its temp files go.

The process checks look for a marker variable in /proc/*/environ: every process a case started
inherits it, wherever it moved (a new session, a new parent)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from qualify.executors import LocalExecutor
from qualify.executors.base import run_command
from qualify.executors.local import SCRATCH_PREFIX, remove_stale_scratch
from qualify.workloads import protocol

# alone: under -n 2 this module has the machine to itself (how fast a kill lands: tests/support/machine_share.py).
pytestmark = [pytest.mark.alone, pytest.mark.workload,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and PR_SET_PDEATHSIG")]


def marked(mark: str) -> list[int]:
    """Living processes whose environment holds QUALIFY_TEST_MARK=mark."""
    needle = f"QUALIFY_TEST_MARK={mark}".encode()
    found = []
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
        except OSError:
            continue
        found.append(int(name))
    return found


def wait_until(predicate, timeout_s: float, step_s: float = 0.1) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(step_s)
    return predicate()


def hang_case(mark: str) -> dict:
    """A real training case relaunched through torchrun whose two ranks hang deaf to SIGTERM."""
    return protocol.make_case("train/hang", "train",
                              {"model": "tiny-llama", "devices": 2, "launcher": "torchrun",
                               "inject": {"hang_after_launch_s": 300}},
                              env={"QUALIFY_TEST_MARK": mark})


def scratch_dirs() -> set[str]:
    return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith(f"{SCRATCH_PREFIX}{os.getpid()}-")}


# --------------------------------------------------------------------------- run_command


def test_timeout_kills_a_child_that_moved_to_another_session_and_ignores_sigterm() -> None:
    # The child holds the executor's pipes from a new session: a group kill misses it, and a
    # communicate() without a timeout waited for it (60 s here).
    mark = uuid.uuid4().hex
    argv = ["sh", "-c", "setsid sh -c 'trap \"\" TERM; sleep 60' & sleep 60"]
    start = time.monotonic()
    res = run_command(argv, "", 2, env={**os.environ, "QUALIFY_TEST_MARK": mark})
    elapsed = time.monotonic() - start
    assert res.timed_out and elapsed < 15, elapsed
    assert wait_until(lambda: not marked(mark), 3), f"left behind: {marked(mark)}"


def test_a_descendant_holding_the_output_after_a_normal_exit_is_killed() -> None:
    mark = uuid.uuid4().hex
    argv = ["sh", "-c", "setsid sleep 60 & echo the-document"]
    start = time.monotonic()
    res = run_command(argv, "", 120, env={**os.environ, "QUALIFY_TEST_MARK": mark})
    assert time.monotonic() - start < 15
    assert not res.timed_out and res.returncode == 0 and "the-document" in res.stdout
    assert wait_until(lambda: not marked(mark), 3), f"left behind: {marked(mark)}"


def test_stale_scratch_of_a_dead_executor_is_removed(tmp_path: Path) -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()  # a pid that is gone
    stale = tmp_path / f"{SCRATCH_PREFIX}{proc.pid}-abc"
    (stale / "sub").mkdir(parents=True)
    live = tmp_path / f"{SCRATCH_PREFIX}{os.getpid()}-def"
    live.mkdir()
    assert remove_stale_scratch(str(tmp_path)) == [str(stale)]
    assert not stale.exists() and live.exists()


# --------------------------------------------------------------------------- the training workload


def children(pid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                if name.isdigit() and int(fh.read().rsplit(b")", 1)[1].split()[1]) == pid:
                    out.append(int(name))
        except (OSError, ValueError, IndexError):
            continue
    return out


def test_hung_relaunched_training_is_killed_within_seconds_and_leaves_nothing() -> None:
    mark = uuid.uuid4().hex
    before = scratch_dirs()
    most = [0]
    done = threading.Event()

    def watch() -> None:  # torchrun and its two ranks carry the case's variables
        while not done.is_set():
            most[0] = max(most[0], len(marked(mark)))
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    start = time.monotonic()
    try:
        outcome = LocalExecutor().run(hang_case(mark), timeout_s=5)
    finally:
        elapsed = time.monotonic() - start
        done.set()
        watcher.join()
    doc = outcome.doc
    assert (doc["status"], doc["error_class"]) == ("error", "timeout"), doc
    assert most[0] >= 3, "the ranks never started: nothing was tested"
    # 5 s timeout + 5 s for the workload to stop after SIGTERM, then SIGKILL to everything.
    assert elapsed < 14, f"the executor returned after {elapsed:.1f} s"
    assert marked(mark) == [], "a process of the case is still running"
    assert scratch_dirs() == before  # the case's TMPDIR (and the case file torchrun got) is gone


def test_workload_and_ranks_die_with_a_killed_executor(tmp_path: Path) -> None:
    mark = uuid.uuid4().hex
    script = tmp_path / "executor.py"
    script.write_text(textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_no_orphans import hang_case
        from qualify.executors import LocalExecutor
        LocalExecutor().run(hang_case({mark!r}), timeout_s=300)
    """))
    executor = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env=os.environ.copy())
    try:
        # torchrun and its two ranks carry the case's variables (the workload sets them for its children).
        assert wait_until(lambda: len(marked(mark)) >= 3, 60), f"only {marked(mark)} started"
        workload = children(executor.pid)
        assert len(workload) == 1
        executor.kill()  # SIGKILL: the executor cannot clean up anything itself
        executor.wait(timeout=10)
        assert wait_until(lambda: not marked(mark), 10), f"outlived the executor: {marked(mark)}"
        assert wait_until(lambda: not os.path.exists(f"/proc/{workload[0]}"), 5), "the workload outlived it"
        # Its scratch folder stays behind (nobody was left to remove it): the next run sweeps it.
        removed = remove_stale_scratch()
        assert any(os.path.basename(r).startswith(f"{SCRATCH_PREFIX}{executor.pid}-") for r in removed), removed
    finally:
        if executor.poll() is None:
            executor.kill()
        for pid in marked(mark):  # never leave a hung rank on the machine, even when the test fails
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

"""The real flow (Prefect on the driver, a local Ray, the local executor) on sleep cases:
faults and retries, resume after the driver is killed, concurrent runs, bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from support.flows import REPO, cli_env, db_rows, results, run_qualify, sleep_manifest
from support.processes import carrying_mark, cmdline

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.prefect]


def test_faults_are_classified_retried_and_recorded(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'q.db'}"
    manifest = sleep_manifest(tmp_path / "m.yaml", [
        {"name": "nap", "kind": "sleep", "params": {"duration_s": 0.5}, "count": 2},
        # Kills the worker that runs it on its first attempt only: a lost worker, which a retry outlives.
        {"name": "flaky", "kind": "sleep", "params": {"duration_s": 0.2,
                                                      "kill_worker_once_marker": str(tmp_path / "flaky.marker")}},
        {"name": "segv", "kind": "sleep", "params": {"signal": "SEGV"}},
        {"name": "crash", "kind": "sleep", "params": {"exit_code": 3}},
        {"name": "hang", "kind": "sleep", "params": {"hang": True}},
        {"name": "lost", "kind": "sleep", "params": {"kill_self_after_s": 0.2}},
        {"name": "fails", "kind": "sleep", "params": {"duration_s": 0.1, "fail": True}},
    ], timeout_s=6, retries=1)
    mark = uuid.uuid4().hex  # this run's processes carry it: another test's sleep workloads may run beside (-n 2)
    res = run_qualify(["run", str(manifest), "--db", db, "--json"], tmp_path, QUALIFY_TEST_MARK=mark)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    outcome = json.loads(res.stdout)
    assert outcome["verdict"] == "FAIL"
    got = results(db, outcome["run_id"])
    assert set(got) == {"sleep/nap/0000", "sleep/nap/0001", "sleep/flaky", "sleep/crash", "sleep/hang",
                        "sleep/lost", "sleep/fails", "sleep/segv"}
    assert got["sleep/nap/0000"]["status"] == "passed" and got["sleep/nap/0000"]["attempts"] == 1
    assert (got["sleep/flaky"]["status"], got["sleep/flaky"]["attempts"]) == ("passed", 2)
    # A test failure is never retried; a crash of the image's workload neither.
    assert (got["sleep/crash"]["status"], got["sleep/crash"]["error_class"], got["sleep/crash"]["attempts"]) == (
        "error", "crash", 1)
    assert "exited with code 3" in got["sleep/crash"]["error"]
    assert (got["sleep/fails"]["status"], got["sleep/fails"]["attempts"]) == ("failed", 1)
    # Timeouts are not retried unless the manifest asks; a signal from the workload is its own fault.
    assert (got["sleep/hang"]["error_class"], got["sleep/hang"]["attempts"]) == ("timeout", 1)
    assert (got["sleep/lost"]["error_class"], got["sleep/lost"]["attempts"]) == ("oom", 1)
    assert (got["sleep/segv"]["error_class"], got["sleep/segv"]["attempts"]) == ("crash", 1)
    assert "SIGSEGV" in got["sleep/segv"]["error"]
    # The case that needed a retry is shown in the verdict's reasons.
    assert any(r["check"] == "retries" and r["case_id"] == "sleep/flaky" for r in outcome["reasons"])
    assert all(r["exec_s"] is not None for r in got.values())
    reasons = {(r["check"], r["status"]) for r in outcome["reasons"]}
    assert ("completeness", "FAIL") in reasons or any(s == "FAIL" for _, s in reasons)
    # The hung workload was killed with its process group: nothing is left behind.
    left = [pid for pid in carrying_mark(mark) if "qualify.workloads.sleep" in cmdline(pid)]
    assert left == [], left
    # One decision stored; stages timed.
    decisions = db_rows(db, "SELECT verdict FROM gate_decisions WHERE run_id = :r", r=outcome["run_id"])
    assert [d["verdict"] for d in decisions] == ["FAIL"]
    assert {"setup", "build", "verify", "cases", "gate", "report"} <= set(outcome["stage_seconds"])


def _candidate_attached(db: str) -> bool:
    try:
        return any(r["candidate_digest"] for r in db_rows(db, "SELECT candidate_digest FROM runs"))
    except Exception:  # noqa: BLE001 - the schema may not exist yet
        return False


def _wait_for(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def test_driver_killed_then_resumed_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'q.db'}"
    release = tmp_path / "release-slow"  # the slow cases hold until it exists: still running at the kill
    manifest = sleep_manifest(tmp_path / "m.yaml", [
        {"name": "quick", "kind": "sleep", "params": {"duration_s": 0.2}, "count": 2},
        {"name": "slow", "kind": "sleep", "params": {"duration_s": 0.2, "hold_until_file": str(release)},
         "count": 2},
    ], timeout_s=600)
    proc = subprocess.Popen([sys.executable, "-m", "qualify", "run", str(manifest), "--db", db],
                            env=cli_env(tmp_path), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        def quick_done() -> bool:
            try:
                return len(db_rows(db, "SELECT id FROM case_results")) >= 2
            except Exception:  # noqa: BLE001 - the schema may not exist yet
                return False

        _wait_for(quick_done, 240, "the quick cases to be recorded")
        first = {r["case_id"]: r["id"] for r in db_rows(db, "SELECT id, case_id FROM case_results")}
        os.killpg(proc.pid, signal.SIGKILL)  # the driver, its Ray and everything in its session
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    run_id = db_rows(db, "SELECT id, status FROM runs")[0]["id"]
    assert db_rows(db, "SELECT status FROM runs")[0]["status"] == "running"

    release.touch()
    resumed = run_qualify(["run", str(manifest), "--db", db, "--resume", str(run_id), "--json"], tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    outcome = json.loads(resumed.stdout)
    assert outcome["run_id"] == run_id and outcome["verdict"] == "PASS"
    rows = db_rows(db, "SELECT id, case_id FROM case_results WHERE run_id = :r", r=run_id)
    assert sorted(r["case_id"] for r in rows) == ["sleep/quick/0000", "sleep/quick/0001", "sleep/slow/0000",
                                                   "sleep/slow/0001"]
    # The results recorded before the kill are the same rows: nothing re-run, nothing duplicated.
    assert {r["case_id"]: r["id"] for r in rows if r["case_id"] in first} == first
    ran_again = {c["case_id"] for c in outcome["cases"]}
    assert ran_again == {"sleep/slow/0000", "sleep/slow/0001"}


def test_second_run_of_the_same_digest_is_refused(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'q.db'}"
    release = tmp_path / "release"  # the first run's case holds until the test is done with the second
    manifest = sleep_manifest(tmp_path / "m.yaml", [{"name": "slow", "kind": "sleep",
                                                     "params": {"duration_s": 0.1, "hold_until_file": str(release)}}],
                              timeout_s=600)
    first = subprocess.Popen([sys.executable, "-m", "qualify", "run", str(manifest), "--db", db],
                             env=cli_env(tmp_path), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, start_new_session=True)
    try:
        _wait_for(lambda: _candidate_attached(db), 240, "the first run to bind its candidate")
        (tmp_path / "second").mkdir()
        second = run_qualify(["run", str(manifest), "--db", db], tmp_path / "second")
        assert second.returncode == 2, second.stdout + second.stderr
        assert "is still running" in second.stderr and "--wait" in second.stderr
        assert "Traceback" not in second.stderr
        statuses = sorted(r["status"] for r in db_rows(db, "SELECT status FROM runs"))
        assert statuses == ["aborted", "running"]
        # The refused run wrote no result: nothing interleaved.
        assert db_rows(db, "SELECT run_id FROM case_results WHERE run_id != 1") == []
    finally:
        release.touch()
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=30)


def test_bad_manifest_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    manifest = tmp_path / "bad.yaml"
    manifest.write_text("release: {name: x}\ncustom_cases: []\n")
    res = run_qualify(["run", str(manifest), "--db", f"sqlite:///{tmp_path / 'q.db'}"], tmp_path)
    assert res.returncode == 2
    assert "release.repository" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "q.db").exists()
    assert not (tmp_path / "data").exists()


def test_wait_queues_behind_the_running_run_of_the_same_digest(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'q.db'}"
    release = tmp_path / "release"  # the first run's case holds until the second is seen waiting
    manifest = sleep_manifest(tmp_path / "m.yaml", [{"name": "slow", "kind": "sleep",
                                                     "params": {"duration_s": 0.1, "hold_until_file": str(release)}}],
                              timeout_s=600)
    first = subprocess.Popen([sys.executable, "-m", "qualify", "run", str(manifest), "--db", db],
                             env=cli_env(tmp_path), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    second = None
    try:
        _wait_for(lambda: _candidate_attached(db), 240, "the first run to bind its candidate")
        (tmp_path / "second").mkdir()
        second = subprocess.Popen([sys.executable, "-m", "qualify", "run", str(manifest), "--db", db, "--wait",
                                   "--json"], env=cli_env(tmp_path / "second"), cwd=REPO, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, start_new_session=True)
        # The second run exists and waits for the digest (it has no candidate of its own yet).
        _wait_for(lambda: len(db_rows(db, "SELECT id FROM runs")) == 2, 240, "the second run to open")
        release.touch()
        out, err = second.communicate(timeout=600)
        assert second.returncode == 0, out + err
        assert first.wait(timeout=300) == 0
    finally:
        release.touch()
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    runs = db_rows(db, "SELECT id, status, started_at, finished_at FROM runs ORDER BY id")
    assert [r["status"] for r in runs] == ["passed", "passed"]
    # The second run's case ran only after the first run had finished: nothing interleaved.
    recorded = {r["run_id"]: r["recorded_at"] for r in db_rows(db, "SELECT run_id, recorded_at FROM case_results")}
    assert str(recorded[2]) > str(runs[0]["finished_at"])


def test_a_killed_driver_no_longer_blocks_its_digest(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'q.db'}"
    never = tmp_path / "never-created"  # the case holds until the driver is killed
    slow = sleep_manifest(tmp_path / "slow.yaml", [{"name": "slow", "kind": "sleep",
                                                    "params": {"duration_s": 0.1, "hold_until_file": str(never)}}],
                          timeout_s=600)
    proc = subprocess.Popen([sys.executable, "-m", "qualify", "run", str(slow), "--db", db],
                            env=cli_env(tmp_path), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        _wait_for(lambda: _candidate_attached(db), 240, "the first run to bind its candidate")
        os.killpg(proc.pid, signal.SIGKILL)  # no chance to mark its run: it stays "running"
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    quick = sleep_manifest(tmp_path / "quick.yaml", [{"name": "nap", "kind": "sleep", "params": {"duration_s": 0.2}}])
    (tmp_path / "next").mkdir()
    res = run_qualify(["run", str(quick), "--db", db, "--json"], tmp_path / "next")
    assert res.returncode == 0, res.stdout + res.stderr
    runs = db_rows(db, "SELECT id, status, error FROM runs ORDER BY id")
    assert [r["status"] for r in runs] == ["aborted", "passed"]
    assert f"aborted by run {runs[1]['id']}" in runs[0]["error"] and "is gone" in runs[0]["error"]


def test_simultaneous_runs_of_one_digest_bind_once_and_leave_nothing_running(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'q.db'}"
    release = tmp_path / "release"  # the run that binds holds its case until the other two have been refused
    manifest = sleep_manifest(tmp_path / "m.yaml", [{"name": "nap", "kind": "sleep",
                                                     "params": {"duration_s": 0.1, "hold_until_file": str(release)}}],
                              timeout_s=600)
    run_qualify(["db", "upgrade", "--db", db], tmp_path)
    procs = []
    for k in range(3):
        (tmp_path / f"d{k}").mkdir()
        procs.append(subprocess.Popen([sys.executable, "-m", "qualify", "run", str(manifest), "--db", db],
                                      env=cli_env(tmp_path / f"d{k}"), cwd=REPO, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, start_new_session=True))
    try:
        _wait_for(lambda: sum(p.poll() is not None for p in procs) >= 2, 600, "two of the three runs to end")
    finally:
        release.touch()
    outs = [p.communicate(timeout=600) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 2, 2], [(p.returncode, o[1][-500:]) for p, o in zip(procs, outs)]
    for proc, (_stdout, stderr) in zip(procs, outs):
        assert "Traceback" not in stderr and "IntegrityError" not in stderr
        if proc.returncode == 2:
            assert "is still running" in stderr or "another run of digest" in stderr, stderr[-500:]
    runs = db_rows(db, "SELECT status, candidate_digest FROM runs")
    assert sorted(r["status"] for r in runs) == ["aborted", "aborted", "passed"]
    assert not [r for r in runs if r["status"] == "running"]

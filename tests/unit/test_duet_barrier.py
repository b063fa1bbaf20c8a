"""The workload side of duet (workloads/duet.py): the step barrier between the two sides, the case's duet
section, and the synthetic workload's timed steps. The two sides are two threads here (the unit tests start
no process); tests/integration/test_duet_e2e.py runs two real processes through Ray."""

from __future__ import annotations

import os
import random
import sys
import threading
import time
from pathlib import Path

import pytest

from qualify.workloads import duet, synthetic

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _threads_switch_often():
    """The two sides are threads of one process here, and a side's busy wait (its filler, pure Python, about 1 ms
    between polls) starves the other side of the GIL, both threads pinned to one core by the handler. Measured,
    the synthetic workload's 4-step duet: 8-30 s at the default 5 ms switch interval, 15-31 s at 1 ms, 0.01 s at
    0.1 ms. Real sides are two processes: no GIL between them, nothing to change in the product."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)
    yield
    sys.setswitchinterval(before)


def _side(directory: Path, side: int, steps: int, out: dict, jitter_s: float = 0.004) -> None:
    barrier = duet.StepBarrier(duet.DuetSpec(str(directory), side, (), timeout_s=30))
    rng = random.Random(side)
    try:
        for _ in range(steps):
            barrier.wait()
            time.sleep(rng.uniform(0, jitter_s))  # the sides' steps take different times
    finally:
        barrier.close()
    out[side] = barrier.report()


def test_both_sides_start_each_step_together(tmp_path: Path) -> None:
    duet.make_barrier_dir(str(tmp_path))
    out: dict = {}
    threads = [threading.Thread(target=_side, args=(tmp_path, s, 30, out, 0.004 * (1 + s))) for s in duet.SIDES]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    starts0, starts1 = out[0]["step_starts"], out[1]["step_starts"]
    assert len(starts0) == len(starts1) == 30
    # Without the barrier side 1 (twice the jitter) would drift ~60 ms behind by step 30.
    skew = [abs(a - b) for a, b in zip(starts0, starts1)]
    assert max(skew) < 0.05, skew
    assert out[0]["alone_from_step"] is None and out[1]["alone_from_step"] is None


def test_a_side_whose_peer_ended_finishes_alone_and_says_from_when(tmp_path: Path) -> None:
    duet.make_barrier_dir(str(tmp_path))
    barrier = duet.StepBarrier(duet.DuetSpec(str(tmp_path), 0, (), timeout_s=30))
    duet.peer_gone(str(tmp_path), 0)  # the driver: side 1's process has ended
    started = time.monotonic()
    for _ in range(3):
        barrier.wait()
    barrier.close()
    assert time.monotonic() - started < 5  # never waited for the timeout
    report = barrier.report()
    assert report["alone_from_step"] == 0 and report["alone_reason"] == "the peer ended" and report["steps"] == 3


def test_a_peer_that_never_arrives_ends_the_wait_after_the_timeout(tmp_path: Path) -> None:
    duet.make_barrier_dir(str(tmp_path))
    barrier = duet.StepBarrier(duet.DuetSpec(str(tmp_path), 1, (), timeout_s=0.2))
    barrier.wait()
    barrier.close()
    assert barrier.alone_from == 0 and "did not arrive" in (barrier.alone_reason or "")


def test_sides_at_different_steps_are_an_error(tmp_path: Path) -> None:
    duet.make_barrier_dir(str(tmp_path))
    barrier = duet.StepBarrier(duet.DuetSpec(str(tmp_path), 0, (), timeout_s=5))
    fd = os.open(tmp_path / "to0", os.O_RDWR)
    os.write(fd, (7).to_bytes(4, "big"))
    os.close(fd)
    with pytest.raises(duet.DuetError, match="step 7"):
        barrier.wait()
    barrier.close()


def _wait_for_late_peer(tmp_path: Path, filler) -> tuple[float, float, dict]:  # type: ignore[no-untyped-def]
    """Side 0 waits at step 0 for a peer that arrives 0.4 s late: (wall s, the s this thread was runnable, report).

    Runnable = its CPU time plus its run-queue wait (schedstat, where the kernel has it): a busy wait is runnable
    the whole time whatever else the machine runs (under load it waits for a CPU instead of running), an idle wait
    sleeps in select and is neither. CPU time alone would make the test depend on the machine's load."""
    tmp_path.mkdir()
    duet.make_barrier_dir(str(tmp_path))
    barrier = duet.StepBarrier(duet.DuetSpec(str(tmp_path), 0, (), timeout_s=30))
    peer = duet.StepBarrier(duet.DuetSpec(str(tmp_path), 1, (), timeout_s=30))
    late = threading.Timer(0.4, peer.wait)
    late.start()
    wall, cpu, runq = time.perf_counter(), time.thread_time(), duet.runq_wait_s()
    barrier.wait(filler)
    runq_after = duet.runq_wait_s()
    waited = runq_after - runq if runq is not None and runq_after is not None else 0.0
    wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu + waited
    barrier.done()
    late.join()
    report = barrier.report()
    barrier.close()
    peer.close()
    return wall, cpu, report


def test_a_side_that_waits_for_its_peer_keeps_its_core_busy(tmp_path: Path) -> None:
    # Busy: the filler runs while the peer is late, so the peer's step never runs beside an idle core.
    wall, runnable, report = _wait_for_late_peer(tmp_path / "busy",
                                                 lambda: synthetic._work(synthetic.FILLER_ITERATIONS))
    assert wall >= 0.35 and runnable > 0.5 * wall, (wall, runnable)
    assert report["busy_wait"] and report["filler_units"] > 10
    # Without a filler (a GPU side) the wait sleeps in select.
    wall, runnable, report = _wait_for_late_peer(tmp_path / "idle", None)
    assert wall >= 0.35 and runnable < 0.2 * wall, (wall, runnable)
    assert not report["busy_wait"] and report["filler_units"] == 0


def test_each_timed_step_records_how_long_it_waited_for_a_cpu(tmp_path: Path) -> None:
    if duet.runq_wait_s() is None:
        pytest.skip("this kernel has no /proc/thread-self/schedstat")
    out: dict = {}
    threads = [threading.Thread(target=_side, args=(tmp_path, s, 5, out)) for s in duet.SIDES]
    duet.make_barrier_dir(str(tmp_path))
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for side in duet.SIDES:
        waits = out[side]["runq_wait_s"]
        assert waits is not None and len(waits) == 5 and all(w >= 0 for w in waits)


def test_each_timed_step_records_the_cpu_its_process_other_threads_used(tmp_path: Path) -> None:
    # What bounds the run-queue wait a side's own threads can cause (execution/duet.held_step_times): a step in
    # which another thread of the process computes records that thread's CPU time; a quiet step records ~none.
    duet.make_barrier_dir(str(tmp_path))
    out: dict = {}
    peer = threading.Thread(target=_side, args=(tmp_path, 1, 2, out, 0.0))  # waits in select: no CPU of its own
    peer.start()
    barrier = duet.StepBarrier(duet.DuetSpec(str(tmp_path), 0, (), timeout_s=30))
    try:
        barrier.wait()
        spinner = threading.Thread(target=_spin_cpu, args=(0.05,))
        spinner.start()
        spinner.join()
        barrier.done()
        barrier.wait()
        time.sleep(0.05)
        barrier.done()
    finally:
        barrier.close()
        peer.join(30)
    other = barrier.report()["other_threads_cpu_s"]
    assert other is not None and len(other) == 2
    assert other[0] >= 0.045 and other[1] < 0.5 * other[0], other


def _spin_cpu(seconds: float) -> None:
    """Use this much CPU time of this thread (however long the machine makes it take)."""
    start = time.thread_time()
    while time.thread_time() - start < seconds:
        pass


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="trading cores needs two")
def test_a_side_trades_cores_with_its_peer_every_step(tmp_path: Path) -> None:
    duet.make_barrier_dir(str(tmp_path))
    own, peer = sorted(os.sched_getaffinity(0))[:2]
    before = os.sched_getaffinity(0)
    out: dict = {}
    t = threading.Thread(target=_side, args=(tmp_path, 1, 4, out, 0.0))
    t.start()
    seen = []
    try:
        barrier = duet.enter({"duet": {"dir": str(tmp_path), "side": 0, "cpus": [own], "peer_cpus": [peer],
                                       "timeout_s": 30}}, trade_cores=True)
        assert barrier is not None
        for _ in range(4):
            barrier.wait()
            seen.append(sorted(os.sched_getaffinity(0)))
            barrier.done()
        barrier.close()
    finally:
        os.sched_setaffinity(0, before)  # the barrier pinned this (test) process
        t.join(30)
    assert seen == [[own], [peer], [own], [peer]]
    assert barrier.report()["on_own_cpus"] == [True, False, True, False] and barrier.report()["traded_cores"]
    # Without trade_cores (a multi-rank side), or without the peer's set, the side stays on its own cores.
    assert not duet.StepBarrier(duet.DuetSpec(str(tmp_path), 0, (own,))).trade


@pytest.mark.parametrize("section, problem", [
    ("x", "expected an object"), ({"dir": "/d", "side": 2, "cpus": []}, "duet.side"),
    ({"dir": "/d", "side": 0, "cpus": [-1]}, "duet.cpus"), ({"side": 0, "cpus": [0]}, "duet.dir"),
    ({"dir": "/d", "side": 0, "cpus": [0], "timeout_s": 0}, "duet.timeout_s"),
    ({"dir": "/d", "side": 0, "cpus": [0], "peer_cpus": [0]}, "duet.peer_cpus"),
    ({"dir": "/d", "side": 0, "cpus": [0], "peer_cpus": [1, 2]}, "duet.peer_cpus"),
])
def test_a_bad_duet_section_is_named(section, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        duet.DuetSpec.from_case({"duet": section})
    assert duet.DuetSpec.from_case({}) is None


def test_the_synthetic_workload_times_real_steps_and_slowdown_is_more_work(monkeypatch: pytest.MonkeyPatch) -> None:
    # The slowdown is counted in work done, not in seconds: a step's time on this shared machine moves with the
    # neighbour (under `-n 2` a 2x-work median once came out under 1.2x the plain one).
    done: list[int] = []
    real_work = synthetic._work
    monkeypatch.setattr(synthetic, "_work", lambda n: (done.append(n), real_work(n))[1])

    def run(slowdown: float) -> tuple[dict, list[int]]:
        done.clear()
        case = {"params": {"samples": {}, "steps": 5, "step_work": 20000, "slowdown": slowdown}}
        return synthetic.handler(case, None), list(done)

    (plain, plain_work), (slowed, slowed_work) = run(0.0), run(1.0)
    assert len(plain["samples"]["step_time_s"]) == 5 and plain["metrics"]["steps_per_s"] > 0
    assert all(t > 0 for t in plain["samples"]["step_time_s"] + slowed["samples"]["step_time_s"])
    assert "duet" not in plain["environment"]
    # A warm-up and 5 timed steps, each of (1 + slowdown) times step_work iterations of real work (no sleep).
    assert plain_work == [20000] * 6 and slowed_work == [40000] * 6
    with pytest.raises(Exception, match="params.steps"):
        synthetic.handler({"params": {"samples": {}, "steps": 0}}, None)


def test_the_synthetic_workload_pins_and_meets_its_peer(tmp_path: Path) -> None:
    duet.make_barrier_dir(str(tmp_path))
    cpu = sorted(os.sched_getaffinity(0))[0]
    before = os.sched_getaffinity(0)
    out: dict = {}

    def peer() -> None:
        _side(tmp_path, 1, 4, out, 0.0)

    t = threading.Thread(target=peer)
    t.start()
    try:
        doc = synthetic.handler({"params": {"samples": {}, "steps": 4, "step_work": 1000},
                                 "duet": {"dir": str(tmp_path), "side": 0, "cpus": [cpu], "timeout_s": 30}}, None)
    finally:
        os.sched_setaffinity(0, before)  # the handler pinned this (test) process
        t.join(30)
    assert doc["environment"]["duet"]["cpus"] == [cpu] and doc["environment"]["duet"]["steps"] == 4
    assert out[1]["steps"] == 4

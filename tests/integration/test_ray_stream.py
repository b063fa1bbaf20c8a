"""A case's Ray stream is waited for in bounded polls (execution.ray.next_item): a streamed item that Ray loses
must end the wait, never hang the driver (CI hung in test_cluster_sim: every task FINISHED, 23 driver threads in
`ray.wait` on a first item that never came).

Real Ray runs here. Ray's loss itself cannot be produced on demand, so the lost-item tests hand next_item a stream
whose `_next_sync` never delivers (standing for Ray's bug), around real Ray object refs for the task's return and
its items."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytestmark = [pytest.mark.ray]


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    from qualify.execution.ray import start_ray

    temp = tempfile.mkdtemp(prefix="qs-")  # short: Ray's socket paths must stay under 108 bytes
    mp = pytest.MonkeyPatch()
    mp.setenv("QUALIFY_RAY_TEMP", temp)
    handle = start_ray(num_cpus=2)
    try:
        yield
    finally:
        handle.shutdown()
        mp.undo()
        shutil.rmtree(temp, ignore_errors=True)


def _result(status: str = "passed") -> Any:
    from qualify.execution.result import CaseRunResult

    return CaseRunResult(doc={"status": status}, exit_code=0, exec_s=1.0, queue_wait_s=0.0, node="n", node_id="i")


class StuckStream:
    """A stream whose next item never arrives (Ray lost it), around real refs: the task's own return object
    (`finished`: ready, or one that never is) and the refs `_get_next_ref_n` reads by place."""

    def __init__(self, finished: bool, later: Any | None) -> None:
        import ray

        self._generator_ref = ray.put(None) if finished else _never_ready()
        self._later = later
        self.polls = 0
        self.ended = False

    def _next_sync(self, timeout_s: float) -> Any:
        import ray

        if self.ended:
            raise StopIteration  # the test is done with it: the waiting thread ends before Ray is shut down
        self.polls += 1
        time.sleep(timeout_s)
        return ray.ObjectRef.nil()

    def _get_next_ref_n(self, n: int) -> list[Any]:
        import ray

        if self._later is None:
            raise ValueError("past the end of the stream")
        return [ray.ObjectRef.nil(), self._later][:n]


def _never_ready() -> Any:
    import ray

    @ray.remote(num_cpus=0)
    def forever() -> None:
        time.sleep(3600)

    return forever.remote()


def test_a_real_stream_gives_its_items_in_order_and_ends(local_ray: None) -> None:
    import ray

    from qualify.execution.ray import next_item

    @ray.remote(num_returns="streaming")
    def two() -> Iterator[Any]:
        from qualify.execution.result import CaseRunResult

        time.sleep(0.5)  # longer than a poll: the wait goes round at least once
        yield 1.5
        yield CaseRunResult(doc={"status": "passed"}, exit_code=0, exec_s=1.0, queue_wait_s=0.0, node="n", node_id="i")

    stream = two.remote()
    assert next_item(stream, poll_s=0.1, lost_after_s=5) == 1.5
    assert next_item(stream, poll_s=0.1, lost_after_s=5).doc == {"status": "passed"}
    with pytest.raises(StopIteration):
        next_item(stream, poll_s=0.1, lost_after_s=5)


def test_a_task_that_raises_surfaces_its_error(local_ray: None) -> None:
    import ray

    from qualify.execution.ray import next_item

    @ray.remote(num_returns="streaming", max_retries=0)
    def broken() -> Iterator[float]:
        yield 1.0
        raise RuntimeError("the workload broke")

    stream = broken.remote()
    assert next_item(stream, poll_s=0.1) == 1.0
    with pytest.raises(ray.exceptions.RayTaskError, match="the workload broke"):
        next_item(stream, poll_s=0.1)


def test_a_lost_item_after_the_task_finished_ends_the_wait(local_ray: None) -> None:
    from qualify.execution.ray import StreamItemLost, next_item

    stream = StuckStream(finished=True, later=None)
    began = time.monotonic()
    with pytest.raises(StreamItemLost, match="never reached the driver"):
        next_item(stream, poll_s=0.05, lost_after_s=0.5)
    assert 0.5 <= time.monotonic() - began < 30  # it waited the grace, then stopped (30: any load)


def test_a_lost_start_item_is_recovered_from_the_result_item(local_ray: None) -> None:
    import ray

    from qualify.execution.ray import _Recovered, next_item

    stream = StuckStream(finished=True, later=ray.put(_result("failed")))
    got = next_item(stream, poll_s=0.05, lost_after_s=0.2)
    assert isinstance(got, _Recovered) and got.result.doc == {"status": "failed"}


def test_a_task_still_running_is_waited_for_past_the_grace(local_ray: None) -> None:
    """The grace counts from the task's end: a long case (or one queued for hours) is never called lost."""
    import threading

    from qualify.execution.ray import next_item

    stream = StuckStream(finished=False, later=None)
    outcome: list[BaseException | Any] = []
    thread = threading.Thread(target=lambda: outcome.append(_catch(next_item, stream, poll_s=0.05, lost_after_s=0.1)),
                              daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while stream.polls < 20 and time.monotonic() < deadline:  # 20 polls: 10 times the grace
        time.sleep(0.05)
    try:
        assert stream.polls >= 20 and thread.is_alive() and not outcome
    finally:
        stream.ended = True
        thread.join(timeout=30)
    assert not thread.is_alive() and isinstance(outcome[0], StopIteration)


def _catch(fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - the test reads what ended the wait
        return exc


def test_a_lost_item_becomes_a_retryable_infra_result(local_ray: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """run_case_on_ray turns the loss into a result the attempts loop retries, naming what happened."""
    from qualify.execution import ray as ray_backend
    from qualify.executors import LocalExecutor
    from qualify.manifest import Resources

    def lost(stream: Any, **_kw: Any) -> Any:
        raise ray_backend.StreamItemLost("its task finished 15 s ago, and an item it yielded never reached the driver")

    monkeypatch.setattr(ray_backend, "next_item", lost)
    case = {"protocol": 1, "case_id": "synthetic/lost", "kind": "synthetic", "launches": 1, "timeout_s": 60,
            "params": {"samples": {}, "steps": 1, "step_work": 1000}, "env": {}}
    out = ray_backend.run_case_on_ray(LocalExecutor(), case, Resources(cpus=1), 60)
    assert out.retryable
    assert out.doc["status"] == "error" and out.doc["error_class"] == "infra"
    assert "never reached the driver" in out.doc["error"]


SHUTDOWN_PROBE = r"""
import sys, threading, time
from qualify.execution.ray import StreamItemLost, next_item, start_ray
handle = start_ray(num_cpus=1)
import ray

@ray.remote(num_returns="streaming")
def long_case():
    yield time.time()
    time.sleep(60)
    yield "never"

stream = long_case.remote()
print("STARTED", isinstance(next_item(stream, poll_s=0.2), float), flush=True)
ended = []

def wait() -> None:
    try:
        ended.append(next_item(stream, poll_s=0.2))
    except StreamItemLost as exc:
        ended.append(f"LOST {exc} retryable={exc.retryable}")

thread = threading.Thread(target=wait)  # not a daemon: as a case thread of the flow's pool
thread.start()
time.sleep(1.0)  # several polls in
handle.shutdown()  # an interrupted flow's cleanup, the thread still waiting
thread.join(timeout=30)
print("ENDED", ended, thread.is_alive(), flush=True)
time.sleep(1.0)  # had a poll run into the shutdown, Ray would have ended this process by now
print("ALIVE", flush=True)
handle = start_ray(num_cpus=1)  # a later run in the same process (a Prefect worker's next flow) polls its own Ray
print("AGAIN", isinstance(next_item(long_case.remote(), poll_s=0.2), float), flush=True)
handle.shutdown()
"""


def test_a_shutdown_while_a_case_waits_ends_the_wait_and_not_the_process(tmp_path: Any) -> None:
    """The flow's cleanup shuts Ray down while its case threads poll: a poll that ran into the shutdown would end
    the process (exit 1, as it ended a CI pytest worker); the gate makes the wait end with a named loss. The next
    Ray started in that process is polled again (the gate closes one session, not the process)."""
    import os
    import subprocess
    import sys

    from support.paths import REPO

    temp = tempfile.mkdtemp(prefix="qs-")
    try:
        res = subprocess.run([sys.executable, "-c", SHUTDOWN_PROBE], cwd=REPO, capture_output=True, text=True,
                             timeout=240, env={**os.environ, "QUALIFY_RAY_TEMP": temp})
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    assert "STARTED True" in res.stdout
    assert ("ENDED [\"LOST Ray was shut down before the case's result arrived retryable=False\"] False"
            in res.stdout), res.stdout
    assert "ALIVE" in res.stdout
    assert "AGAIN True" in res.stdout, res.stdout + res.stderr[-3000:]


def test_a_shutdown_loss_is_not_retried(local_ray: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A case whose wait ended because Ray was shut down is not retried: the retry's submission would start a
    Ray of its own in a process that is stopping."""
    from qualify.execution import ray as ray_backend
    from qualify.executors import LocalExecutor
    from qualify.manifest import Resources

    def shut(stream: Any, **_kw: Any) -> Any:
        raise ray_backend.StreamItemLost("Ray was shut down before the case's result arrived", retryable=False)

    monkeypatch.setattr(ray_backend, "next_item", shut)
    case = {"protocol": 1, "case_id": "synthetic/shut", "kind": "synthetic", "launches": 1, "timeout_s": 60,
            "params": {"samples": {}, "steps": 1, "step_work": 1000}, "env": {}}
    out = ray_backend.run_case_on_ray(LocalExecutor(), case, Resources(cpus=1), 60)
    assert not out.retryable and out.doc["error_class"] == "infra" and "shut down" in out.doc["error"]

"""The Ray backend: one Ray task per case, with the case's resources; plain data back.

No Prefect here (see docs/ARCHITECTURE.md): the driver's Prefect tasks submit these
Ray tasks and await them, so Ray workers need only Ray and the workload package.
Per-case timeouts are enforced inside the Ray task by the executor, never by Prefect,
and the queue wait (submitted -> started on a worker) is measured apart from execution.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import ray

from qualify.errors import InfraError
from qualify.execution import early_ray, launches, ray_auth, setup_overlap
from qualify.execution.node_facts import gpu_ids_of
from qualify.execution.result import CaseRunResult, node_fits, node_share
from qualify.executors import Executor
from qualify.manifest import Resources
from qualify import lifetime
from qualify.settings import Settings
from qualify.workloads import protocol

LOG = logging.getLogger("qualify.ray")
RAYLET_REGISTRATION_TIMED_OUT = "timed out during startup"  # ray/_private/node.py's message
QUALIFY_PACKAGE_DIR = Path(__file__).resolve().parents[1]  # the `qualify` package a remote cluster is sent


class DriverCalls:
    """The driver's case threads' polls of Ray, and the shutdown that must not run beside one.

    A thread that calls into Ray after ray.shutdown() ends the whole process (Ray: "The core worker has already
    been shutdown ... The process will exit", exit 1: CI lost a pytest worker so). An interrupted flow shuts Ray
    down while its case threads still wait; so a poll runs only while the gate is open, and close() waits for the
    polls under way (each at most STREAM_POLL_S) before the shutdown goes on. A closed gate makes a waiting case
    an infra result that names the shutdown, not retried (a retry would start a Ray of its own)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._active = 0
        self._closed: str | None = None  # the Ray session being shut down (its GCS address): another is open

    def open(self) -> None:
        with self._cond:
            self._closed = None

    def close(self, timeout_s: float = 10.0) -> None:
        with self._cond:
            self._closed = _session()
            self._cond.wait_for(lambda: self._active == 0, timeout=timeout_s)

    @contextlib.contextmanager
    def call(self) -> Iterator[None]:
        with self._cond:
            if not ray.is_initialized() or (self._closed is not None and self._closed == _session()):
                raise StreamItemLost("Ray was shut down before the case's result arrived", retryable=False)
            self._active += 1
        try:
            yield
        finally:
            with self._cond:
                self._active -= 1
                self._cond.notify_all()


def _session() -> str | None:
    try:
        return str(ray.get_runtime_context().gcs_address) if ray.is_initialized() else None
    except Exception:  # noqa: BLE001 - a context Ray cannot give: no session to tell apart
        return None


DRIVER_CALLS = DriverCalls()


@dataclass
class RayHandle:
    address: str | None
    started_here: bool
    early: bool = False  # started by early_ray's owner thread, which shuts it down
    shut_down: bool = False

    def shutdown(self) -> None:
        """Once: the flow shuts Ray down right after its cases, and again (a no-op) on its way out. A second
        close would ask Ray for its session while the owner thread shuts it down, and a Ray call after its
        shutdown ends the process (DriverCalls)."""
        if self.shut_down:
            return
        self.shut_down = True
        if self.early or self.started_here:
            DRIVER_CALLS.close()  # no case thread's poll runs into the shutdown
        if self.early:
            early_ray.hand_back()  # in the background: the launcher waits for it at its end
        elif self.started_here and ray.is_initialized():
            ray.shutdown()
            ray_auth.restore()  # a local Ray's token mode does not outlive it (execution/ray_auth.py)


def start_ray(address: str | None = None, num_cpus: int | None = None) -> RayHandle:
    """Join a cluster (address, or QUALIFY_RAY_ADDRESS) or start a local Ray sized to this machine."""
    settings = Settings.load()
    address = address or settings.ray_address or None
    DRIVER_CALLS.open()
    if address is None and num_cpus is None and early_ray.claim():  # started beside Prefect's start-up
        return RayHandle(None, started_here=True, early=True)
    if ray.is_initialized():
        return RayHandle(address, started_here=False)
    # Ray's token authentication stays as the user (or the joined cluster) configured it: never forced off.
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    lifetime.bind_children_to_this_process()  # Ray's processes die with this one, even on SIGKILL
    if address:
        # A remote cluster gets the workload package (and the executors) with the job.
        # An unreachable cluster is one line (issue 24.8): the core worker's own connect retries stay off
        # the console, and what ray.init raises becomes an InfraError naming the address.
        os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "error")
        _check_reachable(address)
        ray_auth.refresh()  # the mode the environment says, not one an earlier local Ray left cached
        try:
            ray.init(address=address, log_to_driver=True, ignore_reinit_error=True, configure_logging=False,
                     runtime_env={"py_modules": [str(QUALIFY_PACKAGE_DIR)]})
        except Exception as exc:  # noqa: BLE001 - ConnectionError, RuntimeError, ValueError: all the cluster's
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            raise InfraError(f"Ray at {address} is unreachable: {type(exc).__name__}: {first}") from None
        return RayHandle(address, started_here=True)
    start_local_ray(num_cpus, settings)
    return RayHandle(None, started_here=True)


def start_local_ray(num_cpus: int | None = None, settings: Settings | None = None) -> None:
    """A local Ray sized to this machine, listening on loopback only (start_ray, or early_ray's thread)."""
    settings = settings or Settings.load()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    lifetime.bind_children_to_this_process()  # Ray's processes die with this one, even on SIGKILL
    bind_local_cluster_to_loopback()
    temp = settings.ray_temp_dir or Path(tempfile.gettempdir()) / "qualify-ray"
    temp.mkdir(parents=True, exist_ok=True)
    ray_auth.remember()  # ray.init turns token authentication on for the process: put back at its shutdown
    try:
        for attempt in (1, 2):
            try:
                ray.init(num_cpus=num_cpus or os.cpu_count() or 1, num_gpus=0, include_dashboard=False,
                         _temp_dir=str(temp), log_to_driver=False, ignore_reinit_error=True,
                         configure_logging=False)
                return
            except Exception as exc:  # noqa: BLE001 - Ray raises a bare Exception for this
                if attempt == 2 or RAYLET_REGISTRATION_TIMED_OUT not in str(exc):
                    raise
                # Ray waits a fixed 30 s for the raylet to register with the GCS (ray/_private/node.py; no
                # setting): on a loaded 2-core machine it once took longer (CI beside image builds, 2026-12-07).
                # The first try's processes are stopped and Ray is started once more, as a person would.
                ray.shutdown()
                stopped = stop_descendants_under(temp)
                LOG.warning("Ray's raylet did not register within Ray's 30 s (a loaded machine): %d of its "
                            "processes stopped, starting Ray again", stopped)
    except BaseException:
        ray_auth.restore()
        raise



def stop_descendants_under(folder: Path) -> int:
    """SIGKILL this process's descendants whose command line names `folder` (a failed ray.init's GCS, raylet and
    agents: every one is given its session folder), and theirs; how many were stopped."""
    table = lifetime.processes()
    needle = str(folder).encode()
    named: set[int] = set()
    for pid in lifetime.descendants({os.getpid()}, table):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if needle in fh.read():
                    named.add(pid)
        except OSError:
            continue
    targets = named | lifetime.descendants(named, table)
    for pid in targets:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return len(targets)


def _check_reachable(address: str, timeout_s: float = 15.0) -> None:
    """A `host:port` or `ray://host:port` that accepts no connection is refused at once: ray.init would retry
    it for minutes, printing each retry."""
    host_port = address.removeprefix("ray://")
    if address == "auto" or "://" in host_port or ":" not in host_port:
        return
    host, _, port = host_port.rpartition(":")
    if not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise InfraError(f"Ray at {address} is unreachable: {exc.strerror or exc}") from None


def bind_local_cluster_to_loopback() -> None:
    """A cluster started by qualify listens on 127.0.0.1 only (GCS, raylet, workers, agents).

    Ray resolves "127.0.0.1" given as the node address to the machine's routable address
    (services.resolve_ip_for_localhost) and then binds its servers to every interface. Its single-machine
    mode (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, read by services.get_node_ip_address) uses the loopback
    address instead. The variable is set for the processes Ray starts, and the constant Ray already read
    at import is set for this one. A listener test (tests) catches a Ray upgrade that changes this.
    """
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False


def cluster_nodes() -> list[dict[str, float]]:
    """Each alive node's CPUs and GPUs (what a schedule's lower bound divides by)."""
    return [{"CPU": float(n.get("Resources", {}).get("CPU", 0.0)), "GPU": float(n.get("Resources", {}).get("GPU", 0.0))}
            for n in ray.nodes() if n.get("Alive")]


def ray_options(resources: Resources) -> dict[str, Any]:
    """Ray scheduling options for a case: one node's share (a multi-node case reserves one per node)."""
    return node_share(resources).ray_options()


def infeasible_reason(resources: Resources, nodes: list[dict[str, Any]] | None = None) -> str | None:
    """Why no node (or set of nodes) of the cluster can ever run this case; None when one can.

    Ray would otherwise keep an infeasible task pending forever: the driver must refuse it.
    """
    nodes = nodes if nodes is not None else [n for n in ray.nodes() if n.get("Alive")]
    wanted = node_share(resources).wanted()
    fitting = [n for n in nodes if node_fits(n, wanted)]
    if len(fitting) >= max(1, resources.nodes):
        return None
    wanted_txt = ", ".join(f"{k}={v:g}" for k, v in wanted.items())
    have = "; ".join(
        f"{n.get('NodeManagerAddress', '?')}: " + ", ".join(
            f"{k}={v:g}" for k, v in sorted(n.get("Resources", {}).items())
            if not k.startswith("node:") and k not in ("object_store_memory",))
        for n in nodes)
    return (f"no {'set of ' + str(resources.nodes) + ' nodes' if resources.nodes > 1 else 'node'} of the Ray "
            f"cluster can run this case: it needs {wanted_txt} per node; the cluster has {have or 'no nodes'}")


@ray.remote
def execute_case(executor: Executor, case_doc: dict[str, Any], timeout_s: float,
                 submitted_at: float) -> Iterator[float | CaseRunResult]:
    """Run one case on a Ray worker through the executor: its launches one after the other, each a fresh
    process (execution.launches), on this node, while this task holds the case's resources; plain data back.

    timeout_s bounds each launch (a case of 3 launches may take up to 3 timeouts)."""
    started = time.time()
    yield started  # the driver learns that the task runs: its queue wait ends here
    context = ray.get_runtime_context()
    gpu_ids = gpu_ids_of(context)
    outcomes = KeptOutcomes()

    def one_launch(doc: dict[str, Any]) -> tuple[dict[str, Any], float]:
        return outcomes.add(executor.run(doc, timeout_s=setup_overlap.launch_timeout(doc, timeout_s), gpu_ids=gpu_ids))

    merged, docs = launches.run_launches(case_doc, one_launch)
    yield _task_result(merged, outcomes.of(docs), started - submitted_at, context, gpu_ids, time.time() - started)


class KeptOutcomes:
    """The executor's outcomes of a case's launches, by their documents: with set-up overlap several launches run
    at once (threads), and one stopped at its gate runs but is not kept (execution/setup_overlap.py)."""

    def __init__(self) -> None:
        self._by_doc: dict[int, Any] = {}

    def add(self, outcome: Any) -> tuple[dict[str, Any], float]:
        self._by_doc[id(outcome.doc)] = outcome
        return outcome.doc, outcome.exec_s

    def of(self, docs: list[dict[str, Any]]) -> list[Any]:
        return [self._by_doc[id(d)] for d in docs]


@ray.remote
def execute_paired_case(executor: Executor, baseline: Executor, case_doc: dict[str, Any],
                        baseline_doc: dict[str, Any], timeout_s: float,
                        submitted_at: float) -> Iterator[float | CaseRunResult]:
    """A paired case (gate.regression.baseline: paired): the candidate's and the previous release's launches
    interleaved A B A B in this one task, which holds the case's resources on this node for both sides, so
    that both see the same machine state. The measurement time is at most twice the case's."""
    started = time.time()
    yield started  # the driver learns that the task runs: its queue wait ends here
    context = ray.get_runtime_context()
    gpu_ids = gpu_ids_of(context)
    outcomes = KeptOutcomes()

    def side(chosen: Executor, keep: bool):
        def one_launch(doc: dict[str, Any]) -> tuple[dict[str, Any], float]:
            outcome = chosen.run(doc, timeout_s=setup_overlap.launch_timeout(doc, timeout_s), gpu_ids=gpu_ids)
            return outcomes.add(outcome) if keep else (outcome.doc, outcome.exec_s)
        return one_launch

    kept: list[dict[str, Any]] = []
    merged = launches.run_paired(case_doc, baseline_doc, side(executor, True), side(baseline, False),
                                 baseline.describe(), kept=kept)
    yield _task_result(merged, outcomes.of(kept), started - submitted_at, context, gpu_ids, time.time() - started)


@ray.remote
def execute_duet_case(executor: Executor, baseline: Executor, case_doc: dict[str, Any], baseline_doc: dict[str, Any],
                      per_side: Resources, timeout_s: float, submitted_at: float,
                      policy: Any) -> Iterator[float | CaseRunResult]:
    """A duet case (gate.regression.baseline: duet, execution.duet): this task holds both sides' resources; the
    candidate's and the previous release's launches run at the same time, each on its own cores and GPUs."""
    from qualify.execution import duet

    started = time.time()
    yield started  # the driver learns that the task runs: its queue wait ends here
    context = ray.get_runtime_context()
    gpu_ids = gpu_ids_of(context)
    merged, outcomes = duet.measure(executor, baseline, case_doc, baseline_doc, cpus_per_side=per_side.cpus,
                                    gpus_per_side=per_side.gpus, gpu_ids=gpu_ids, timeout_s=timeout_s,
                                    policy=policy)
    yield _task_result(merged, outcomes, started - submitted_at, context, gpu_ids, time.time() - started)


def _task_result(merged: dict[str, Any], outcomes: list[Any], queue_wait_s: float, context: Any,
                 gpu_ids: list[str], held_s: float) -> CaseRunResult:
    """The Ray task's answer: the merged document, how long the case held its resources (`held_s`, the task's wall
    time: both sides of a paired or duet case and launches that overlapped their set-up counted once, as the plan
    and the makespan's lower bound read it), the last launch's exit."""
    last = outcomes[-1]
    return CaseRunResult(doc=merged, exit_code=last.exit_code, exec_s=held_s,
                         queue_wait_s=max(0.0, queue_wait_s), node=socket.gethostname(),
                         node_id=context.get_node_id(), gpu_ids=gpu_ids, retryable=last.retryable,
                         command=last.command)


def _multinode_launches(executor: Executor, case_doc: dict[str, Any], resources: Resources,
                        timeout_s: float, on_started: Callable[[], None] | None = None) -> CaseRunResult:
    from qualify.execution.multinode import run_multinode_case  # imports Ray's placement-group API: only when used

    results: list[CaseRunResult] = []

    def one_launch(doc: dict[str, Any]) -> tuple[dict[str, Any], float]:
        result = run_multinode_case(executor, doc, resources, timeout_s, on_started=on_started if not results else None)
        results.append(result)
        return result.doc, result.exec_s or 0.0

    merged, _docs = launches.run_launches(case_doc, one_launch)
    last = results[-1]
    return CaseRunResult(doc=merged, exit_code=last.exit_code, exec_s=sum(r.exec_s or 0.0 for r in results),
                         queue_wait_s=results[0].queue_wait_s, node=last.node, node_id=last.node_id,
                         gpu_ids=last.gpu_ids, retryable=last.retryable, command=last.command)


# How often a driver thread waiting on a case's stream looks up from it, and how long after the task finished it
# still waits for an item. Ray (2.60) has lost a streamed item on a busy machine: the task FINISHED, the driver's
# wait on its first item never returned (tests/integration/test_cluster_sim.py hung in CI until its timeout).
STREAM_POLL_S = 1.0
STREAM_LOST_AFTER_S = 15.0


class StreamItemLost(Exception):
    """The case's Ray task finished, but an item it yielded never reached the driver (retryable); or Ray was shut
    down while the driver waited (not retryable: a retry would start Ray again in a process that is stopping)."""

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


@dataclass(frozen=True)
class _Recovered:
    result: CaseRunResult  # the first item (the start time) was lost, the second (the result) was not


def next_item(stream: Any, *, poll_s: float | None = None, lost_after_s: float | None = None) -> Any:
    """The stream's next item, waited for in bounded polls: never a wait that a lost item makes endless.

    While the task runs (or queues), the wait goes on, however long. Once the task has finished (its generator's
    own return object is ready), the item has `lost_after_s` more to arrive; then the start item's loss is
    recovered from the result item when that one arrived, else StreamItemLost (the caller's retryable infra
    result). A task that raised surfaces here as Ray raises it; an ended stream raises StopIteration."""
    poll_s = STREAM_POLL_S if poll_s is None else poll_s
    lost_after_s = STREAM_LOST_AFTER_S if lost_after_s is None else lost_after_s
    finished_at: float | None = None
    while True:
        with DRIVER_CALLS.call():
            ref = stream._next_sync(timeout_s=poll_s)
            if not ref.is_nil():
                return ray.get(ref)
            done, _ = ray.wait([stream._generator_ref], timeout=0, fetch_local=False)
        if not done:
            continue  # queued or running: its items are still to come
        finished_at = finished_at if finished_at is not None else time.monotonic()
        if time.monotonic() - finished_at < lost_after_s:
            continue
        with DRIVER_CALLS.call():
            recovered = _item_after_the_missing_one(stream, poll_s)
        if recovered is not None:
            return _Recovered(recovered)
        # Seen: a worker whose report of the item the driver refused ("Failed to report streaming generator
        # return ... InvalidAuthToken" in the worker's log: the two disagreed on Ray's authentication).
        raise StreamItemLost(f"its task finished {lost_after_s:.0f} s ago, and an item it yielded never reached "
                             "the driver (lost or refused on the way: the Ray workers' logs say which)")


def _item_after_the_missing_one(stream: Any, timeout_s: float) -> CaseRunResult | None:
    """When the start item was lost, the result item may not have been: read it by its place in the stream."""
    try:
        later = stream._get_next_ref_n(2)[1]
        ready, _ = ray.wait([later], timeout=timeout_s, fetch_local=True)
        value = ray.get(later, timeout=timeout_s) if ready else None
    except Exception:  # noqa: BLE001 - past the stream's end, or lost too: nothing to recover
        return None
    return value if isinstance(value, CaseRunResult) else None


def run_case_on_ray(executor: Executor, case_doc: dict[str, Any], resources: Resources,
                    timeout_s: float, *, baseline: Executor | None = None,
                    baseline_doc: dict[str, Any] | None = None, duet: Any = None,
                    on_started: Callable[[], None] | None = None,
                    on_submitted: Callable[[], None] | None = None) -> CaseRunResult:
    """Submit one case (its launches, qualify.launches) and wait for it; a lost worker or node becomes an
    `infra` result, not an exception. With a baseline executor the case is paired (execute_paired_case).

    `nodes > 1`: each launch is one execution.multinode launch over N nodes (its own placement group), the launches
    one after the other from here (pairing is refused for such a case: the pipeline never asks it). With a
    baseline and a duet policy the case runs in duet (execution.duet), in one task holding both sides.

    `on_submitted` is called once the task is handed to Ray (the flow submits cases one after the other, in the
    planner's order). `on_started` is called once the Ray task runs (Ray queues it until its resources are free): each task first
    yields its start time (a streaming generator), then its result, so that the driver can tell queued from running.
    """
    if resources.nodes > 1:
        if on_submitted is not None:
            on_submitted()  # its placement group is asked for next
        return _multinode_launches(executor, case_doc, resources, timeout_s, on_started)
    submitted = time.time()
    options = {**ray_options(resources), "num_returns": "streaming"}
    if baseline is not None and duet is not None:  # duet: an execution.duet.DuetPolicy; the task holds both sides
        from qualify.execution.duet import doubled

        stream = execute_duet_case.options(**ray_options(doubled(resources)), num_returns="streaming").remote(
            executor, baseline, case_doc, baseline_doc or case_doc, resources, timeout_s, submitted, duet)
    elif baseline is not None:
        stream = execute_paired_case.options(**options).remote(executor, baseline, case_doc,
                                                               baseline_doc or case_doc, timeout_s, submitted)
    else:
        stream = execute_case.options(**options).remote(executor, case_doc, timeout_s, submitted)
    if on_submitted is not None:
        on_submitted()
    try:
        first = next_item(stream)  # the start time: the task runs now (a task that died first raises here)
        if on_started is not None:
            on_started()
        return first.result if isinstance(first, _Recovered) else next_item(stream)
    except StreamItemLost as lost:
        doc = protocol.make_result(case_doc, "error", error_class="infra", error=f"Ray could not run the case: {lost}")
        return CaseRunResult.failed(doc, retryable=lost.retryable, exec_s=time.time() - submitted)
    except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError,
            ray.exceptions.RaySystemError, ray.exceptions.ObjectLostError,
            ray.exceptions.TaskUnschedulableError, ray.exceptions.RayTaskError) as exc:
        message = f"Ray could not run the case: {type(exc).__name__}: {str(exc).splitlines()[0][:500]}"
        doc = protocol.make_result(case_doc, "error", error_class="infra", error=message)
        return CaseRunResult.failed(doc, retryable=True, exec_s=time.time() - submitted)
    except StopIteration:  # the task's stream ended before its result: lost, as a crashed worker is
        doc = protocol.make_result(case_doc, "error", error_class="infra",
                                   error="Ray could not run the case: its task ended without a result")
        return CaseRunResult.failed(doc, retryable=True, exec_s=time.time() - submitted)

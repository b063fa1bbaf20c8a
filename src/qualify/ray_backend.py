"""The Ray backend: one Ray task per case, with the case's resources; plain data back.

No Prefect here (see docs/ARCHITECTURE.md): the driver's Prefect tasks submit these
Ray tasks and await them, so Ray workers need only Ray and the workload package.
Per-case timeouts are enforced inside the Ray task by the executor, never by Prefect,
and the queue wait (submitted -> started on a worker) is measured apart from execution.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import ray

from qualify import launches
from qualify.executors import Executor
from qualify.manifest import Resources
from qualify.settings import Settings
from qualify.workloads import protocol

QUALIFY_PACKAGE_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class RayHandle:
    address: str | None
    started_here: bool

    def shutdown(self) -> None:
        if self.started_here and ray.is_initialized():
            ray.shutdown()


def start_ray(address: str | None = None, num_cpus: int | None = None) -> RayHandle:
    """Join a cluster (address, or QUALIFY_RAY_ADDRESS) or start a local Ray sized to this machine."""
    settings = Settings.load()
    address = address or settings.ray_address or None
    if ray.is_initialized():
        return RayHandle(address, started_here=False)
    # Ray's token authentication stays as the user (or the joined cluster) configured it: never forced off.
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if address:
        # A remote cluster gets the workload package (and the executors) with the job.
        ray.init(address=address, log_to_driver=True, ignore_reinit_error=True,
                 runtime_env={"py_modules": [str(QUALIFY_PACKAGE_DIR)]})
        return RayHandle(address, started_here=True)
    bind_local_cluster_to_loopback()
    temp = settings.ray_temp_dir or Path(tempfile.gettempdir()) / "qualify-ray"
    temp.mkdir(parents=True, exist_ok=True)
    ray.init(num_cpus=num_cpus or os.cpu_count() or 1, num_gpus=0, include_dashboard=False,
             _temp_dir=str(temp), log_to_driver=False, ignore_reinit_error=True,
             configure_logging=False)
    return RayHandle(None, started_here=True)


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


def ray_options(resources: Resources) -> dict[str, Any]:
    """Ray scheduling options for a case: CPUs, GPUs, custom resources, accelerator type."""
    nodes = max(1, resources.nodes)
    options: dict[str, Any] = {
        # One node's share: a multi-node case reserves one such bundle per node (ray_multinode).
        "num_cpus": resources.cpus / nodes,
        "num_gpus": resources.gpus / nodes,
        "max_retries": 0,  # retries are the driver's decision (infrastructure failures only)
    }
    if resources.custom:
        options["resources"] = {k: v / nodes for k, v in resources.custom.items()}
    if resources.accelerator_type:
        options["accelerator_type"] = resources.accelerator_type
    if resources.memory_gb:
        options["memory"] = int(resources.memory_gb * 2**30 / nodes)
    return options


def infeasible_reason(resources: Resources, nodes: list[dict[str, Any]] | None = None) -> str | None:
    """Why no node (or set of nodes) of the cluster can ever run this case; None when one can.

    Ray would otherwise keep an infeasible task pending forever: the driver must refuse it.
    """
    nodes = nodes if nodes is not None else [n for n in ray.nodes() if n.get("Alive")]
    need = dict(ray_options(resources))
    wanted: dict[str, float] = {"CPU": need["num_cpus"], "GPU": need["num_gpus"]}
    wanted.update(need.get("resources", {}))
    if resources.accelerator_type:
        wanted[f"accelerator_type:{resources.accelerator_type}"] = 0.001
    if resources.memory_gb:
        wanted["memory"] = need["memory"]
    fitting = [n for n in nodes
               if all(n.get("Resources", {}).get(k, 0.0) >= v for k, v in wanted.items() if v > 0)]
    if len(fitting) >= max(1, resources.nodes):
        return None
    wanted_txt = ", ".join(f"{k}={v:g}" for k, v in wanted.items() if v > 0)
    have = "; ".join(
        f"{n.get('NodeManagerAddress', '?')}: " + ", ".join(
            f"{k}={v:g}" for k, v in sorted(n.get("Resources", {}).items())
            if not k.startswith("node:") and k not in ("object_store_memory",))
        for n in nodes)
    return (f"no {'set of ' + str(resources.nodes) + ' nodes' if resources.nodes > 1 else 'node'} of the Ray "
            f"cluster can run this case: it needs {wanted_txt} per node; the cluster has {have or 'no nodes'}")


@dataclass(frozen=True)
class RayCaseResult:
    """What a Ray task brings back from one case: the result document and where/how long it ran."""

    doc: dict[str, Any]  # a valid result document, always
    exit_code: int | None
    exec_s: float | None
    queue_wait_s: float | None
    node: str | None
    node_id: str | None
    gpu_ids: Sequence[str] = ()
    retryable: bool = False
    command: Sequence[str] = field(default_factory=list)

    @classmethod
    def failed(cls, doc: dict[str, Any], *, retryable: bool, exec_s: float = 0.0) -> "RayCaseResult":
        """A result synthesised on the driver (the case never ran, or its worker was lost)."""
        return cls(doc=doc, exit_code=None, exec_s=exec_s, queue_wait_s=None, node=None, node_id=None,
                   retryable=retryable)


@ray.remote
def execute_case(executor: Executor, case_doc: dict[str, Any], timeout_s: float,
                 submitted_at: float) -> RayCaseResult:
    """Run one case on a Ray worker through the executor: its launches one after the other, each a fresh
    process (qualify.launches), on this node, while this task holds the case's resources; plain data back.

    timeout_s bounds each launch (a case of 3 launches may take up to 3 timeouts)."""
    started = time.time()
    context = ray.get_runtime_context()
    gpu_ids = _gpu_ids(context)
    outcomes: list[Any] = []

    def one_launch(doc: dict[str, Any]) -> tuple[dict[str, Any], float]:
        outcome = executor.run(doc, timeout_s=timeout_s, gpu_ids=gpu_ids)
        outcomes.append(outcome)
        return outcome.doc, outcome.exec_s

    merged, _docs = launches.run_launches(case_doc, one_launch)
    return _task_result(merged, outcomes, started - submitted_at, context, gpu_ids)


@ray.remote
def execute_paired_case(executor: Executor, baseline: Executor, case_doc: dict[str, Any],
                        baseline_doc: dict[str, Any], timeout_s: float, submitted_at: float) -> RayCaseResult:
    """A paired case (gate.regression.baseline: paired): the candidate's and the previous release's launches
    interleaved A B A B in this one task, which holds the case's resources on this node for both sides, so
    that both see the same machine state. The measurement time is at most twice the case's."""
    started = time.time()
    context = ray.get_runtime_context()
    gpu_ids = _gpu_ids(context)
    outcomes: list[Any] = []

    def side(chosen: Executor, keep: bool):
        def one_launch(doc: dict[str, Any]) -> tuple[dict[str, Any], float]:
            outcome = chosen.run(doc, timeout_s=timeout_s, gpu_ids=gpu_ids)
            if keep:
                outcomes.append(outcome)
            return outcome.doc, outcome.exec_s
        return one_launch

    merged = launches.run_paired(case_doc, baseline_doc, side(executor, True), side(baseline, False),
                                 baseline.describe())
    return _task_result(merged, outcomes, started - submitted_at, context, gpu_ids)


@ray.remote
def execute_duet_case(executor: Executor, baseline: Executor, case_doc: dict[str, Any], baseline_doc: dict[str, Any],
                      per_side: Resources, timeout_s: float, submitted_at: float, policy: Any) -> RayCaseResult:
    """A duet case (gate.regression.baseline: duet, qualify.duet): this task holds both sides' resources; the
    candidate's and the previous release's launches run at the same time, each on its own cores and GPUs."""
    from qualify import duet

    started = time.time()
    context = ray.get_runtime_context()
    gpu_ids = _gpu_ids(context)
    merged, outcomes = duet.measure(executor, baseline, case_doc, baseline_doc, cpus_per_side=per_side.cpus,
                                    gpus_per_side=per_side.gpus, gpu_ids=gpu_ids, timeout_s=timeout_s,
                                    policy=policy)
    return _task_result(merged, outcomes, started - submitted_at, context, gpu_ids)


def _task_result(merged: dict[str, Any], outcomes: list[Any], queue_wait_s: float, context: Any,
                 gpu_ids: list[str]) -> RayCaseResult:
    """The Ray task's answer: the merged document, the candidate's launches' time, the last launch's exit."""
    last = outcomes[-1]
    return RayCaseResult(doc=merged, exit_code=last.exit_code, exec_s=sum(o.exec_s for o in outcomes),
                         queue_wait_s=max(0.0, queue_wait_s), node=socket.gethostname(),
                         node_id=context.get_node_id(), gpu_ids=gpu_ids, retryable=last.retryable,
                         command=last.command)


def _multinode_launches(executor: Executor, case_doc: dict[str, Any], resources: Resources,
                        timeout_s: float) -> RayCaseResult:
    from qualify.ray_multinode import run_multinode_case

    results: list[RayCaseResult] = []

    def one_launch(doc: dict[str, Any]) -> tuple[dict[str, Any], float]:
        result = RayCaseResult(**run_multinode_case(executor, doc, resources, timeout_s).fields())
        results.append(result)
        return result.doc, result.exec_s or 0.0

    merged, _docs = launches.run_launches(case_doc, one_launch)
    last = results[-1]
    return RayCaseResult(doc=merged, exit_code=last.exit_code, exec_s=sum(r.exec_s or 0.0 for r in results),
                         queue_wait_s=results[0].queue_wait_s, node=last.node, node_id=last.node_id,
                         gpu_ids=last.gpu_ids, retryable=last.retryable, command=last.command)


def _gpu_ids(context: Any) -> list[str]:
    try:
        return [str(x) for x in context.get_accelerator_ids().get("GPU", [])]
    except Exception:  # noqa: BLE001 - older Ray: fall back to the GPU ids API
        return [str(x) for x in ray.get_gpu_ids()]


def run_case_on_ray(executor: Executor, case_doc: dict[str, Any], resources: Resources,
                    timeout_s: float, *, baseline: Executor | None = None,
                    baseline_doc: dict[str, Any] | None = None, duet: Any = None) -> RayCaseResult:
    """Submit one case (its launches, qualify.launches) and wait for it; a lost worker or node becomes an
    `infra` result, not an exception. With a baseline executor the case is paired (execute_paired_case).

    `nodes > 1`: each launch is one ray_multinode launch over N nodes (its own placement group), the launches
    one after the other from here (pairing is refused for such a case: the pipeline never asks it). With a
    baseline and a duet policy the case runs in duet (qualify.duet), in one task holding both sides.
    """
    if resources.nodes > 1:
        return _multinode_launches(executor, case_doc, resources, timeout_s)
    submitted = time.time()
    options = ray_options(resources)
    if baseline is not None and duet is not None:  # duet: a qualify.duet.DuetPolicy; the task holds both sides
        from qualify.duet import doubled

        ref = execute_duet_case.options(**ray_options(doubled(resources))).remote(
            executor, baseline, case_doc, baseline_doc or case_doc, resources, timeout_s, submitted, duet)
    elif baseline is not None:
        ref = execute_paired_case.options(**options).remote(executor, baseline, case_doc,
                                                            baseline_doc or case_doc, timeout_s, submitted)
    else:
        ref = execute_case.options(**options).remote(executor, case_doc, timeout_s, submitted)
    try:
        return ray.get(ref)
    except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError,
            ray.exceptions.RaySystemError, ray.exceptions.ObjectLostError,
            ray.exceptions.TaskUnschedulableError, ray.exceptions.RayTaskError) as exc:
        message = f"Ray could not run the case: {type(exc).__name__}: {str(exc).splitlines()[0][:500]}"
        doc = protocol.make_result(case_doc, "error", error_class="infra", error=message)
        return RayCaseResult.failed(doc, retryable=True, exec_s=time.time() - submitted)

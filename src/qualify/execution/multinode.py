"""Multi-node cases on Ray: one launch of a `nodes: N` case spread over N Ray nodes.

`execution.ray.run_case_on_ray` hands a case with `resources.nodes > 1` to `run_multinode_case`,
so that one call stays one launch of the case whatever its node count:

1. A placement group with one bundle per node (STRICT_SPREAD: N distinct Ray nodes), each
   bundle the case's per-node share of its resources (the same share `ray_options` asks for).
2. A zero-CPU task in bundle 0 picks the rendezvous: the address Ray reports for that node
   (127.0.0.1 for a cluster started on one machine with --node-ip-address=127.0.0.1) and a port
   free on it. (Free when picked: a race with another process is possible, as with any
   launcher's free-port choice; the launch then fails as a crash, never silently.)
3. One Ray task per bundle runs the executor with the case document plus that node's
   `node_rank`, `nodes`, `master_addr` and `master_port`; the training workload starts
   `torchrun --nnodes N --node-rank k --master-addr A --master-port P` there and merges its own
   ranks' documents (workloads/train/ranks.py). The task also reads the node's accelerator
   driver on the host side (node_facts), outside the candidate.
4. The nodes' documents are merged again (`merge_node_docs`): the case passes only when every
   node passed and the ranks form the whole world, one block per node; otherwise the failing
   rank's class wins (nan_loss, oom over the crash or timeout it caused on the other nodes).
5. The placement group is removed whatever happened; that also ends any task still in it.

Per-case timeouts stay the executors' (inside each node task); the driver only waits a margin
longer, for a node that is lost rather than slow.
"""

from __future__ import annotations

import copy
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from qualify.execution import node_facts
from qualify.execution.node_facts import gpu_ids_of
from qualify.execution.result import CaseRunResult, bundle_task_options, node_share
from qualify.executors import Executor
from qualify.manifest import Resources
from qualify.workloads import protocol, rank_figures
from qualify.workloads.train.ranks import RANK_FAILURE_ORDER, free_port

MULTINODE_KINDS = ("train",)  # workloads that know node_rank / master_addr
DRIVER_MARGIN_S = 120.0  # past the executors' own timeout (they kill and report within ~20 s)
PG_READY_MIN_S = 600.0  # how long the nodes may stay busy with other cases before this one is infra


@dataclass(frozen=True)
class NodeRun:
    """What one node's task brings back: the node's document (merged over its ranks) and where it ran."""

    node_rank: int
    doc: dict[str, Any]
    exit_code: int | None
    exec_s: float | None
    started_at: float | None
    host: str | None
    node_id: str | None
    address: str | None
    gpu_ids: Sequence[str] = ()
    command: Sequence[str] = ()
    facts: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- pure parts


def node_bundle(resources: Resources) -> dict[str, float]:
    """One node's share of the case as a placement-group bundle (the share `ray_options` asks for)."""
    return node_share(resources).bundle()


def multinode_problem(case_doc: dict[str, Any], executor: Executor) -> str | None:
    """Why this case cannot be launched over several nodes (a bad case, not an infrastructure error)."""
    kind = case_doc.get("kind")
    if kind not in MULTINODE_KINDS:
        return (f"resources.nodes > 1 is supported for {', '.join(MULTINODE_KINDS)} cases only; "
                f"a {kind!r} workload knows no node rank")
    launcher = (case_doc.get("params") or {}).get("launcher", "auto")
    if launcher not in ("auto", "torchrun"):
        return (f"launcher {launcher!r} cannot run one node of a multi-node case under Ray (the deepspeed "
                "runner reaches the other nodes itself over ssh): use launcher auto or torchrun")
    if getattr(executor, "network", None) == "none":
        return ("a multi-node case needs the container to reach the other nodes: set "
                "execution.container.network to host (it runs with --network none)")
    return None


def node_case_doc(case_doc: dict[str, Any], *, node_rank: int, nodes: int, address: str,
                  port: int) -> dict[str, Any]:
    """The case document one node runs: the case plus its place in the launch."""
    doc = copy.deepcopy(case_doc)
    doc["params"] = {**(doc.get("params") or {}), "nodes": nodes, "node_rank": node_rank,
                     "master_addr": address, "master_port": port}
    return doc


def _class_order(error_class: str | None) -> int:
    return RANK_FAILURE_ORDER.index(error_class) if error_class in RANK_FAILURE_ORDER else len(RANK_FAILURE_ORDER)


def _node_ranks(run: NodeRun) -> list[int]:
    ranks = (run.doc.get("environment") or {}).get("ranks") or {}
    return sorted(int(r) for r in ranks)


def node_summary(run: NodeRun) -> dict[str, Any]:
    """Which ranks ran on which Ray node, and how that node's launch ended."""
    return {"node_rank": run.node_rank, "ray_node_id": run.node_id, "host": run.host, "address": run.address,
            "ranks": _node_ranks(run), "status": run.doc.get("status"), "error_class": run.doc.get("error_class"),
            "exit_code": run.exit_code, "exec_s": run.exec_s, "gpu_ids": list(run.gpu_ids),
            "driver": run.facts.get("driver"), "driver_source": run.facts.get("driver_source")}


def world_problem(runs: Sequence[NodeRun], devices: int) -> str | None:
    """What is wrong with the world the nodes formed (None when it is whole: N distinct Ray nodes,
    node k ran ranks k*devices .. (k+1)*devices-1, every rank reported world size N*devices)."""
    world = len(runs) * devices
    ids = [r.node_id for r in runs]
    if len(set(ids)) != len(ids):
        return f"the nodes' tasks did not run on distinct Ray nodes: {ids}"
    for run in runs:
        expected = list(range(run.node_rank * devices, (run.node_rank + 1) * devices))
        if _node_ranks(run) != expected:
            return f"node {run.node_rank} ran ranks {_node_ranks(run)}, expected {expected}"
        reported = (run.doc.get("environment") or {}).get("world_size")
        if reported != world:
            return f"node {run.node_rank} reported world size {reported}, expected {world}"
    return None


def merge_node_docs(case_doc: dict[str, Any], runs: Sequence[NodeRun], *, devices: int,
                    rendezvous: str | None) -> dict[str, Any]:
    """One result document from the nodes' documents (each already merged over its own ranks)."""
    runs = sorted(runs, key=lambda r: r.node_rank)
    failing = sorted((r for r in runs if r.doc.get("status") != "passed"),
                     key=lambda r: (_class_order(r.doc.get("error_class")), r.node_rank))
    base = failing[0] if failing else runs[0]
    doc = copy.deepcopy(base.doc)
    env = doc.setdefault("environment", {})
    env["ranks"] = {k: v for r in runs for k, v in ((r.doc.get("environment") or {}).get("ranks") or {}).items()}
    env["nodes"] = [node_summary(r) for r in runs]
    env["rendezvous"] = rendezvous
    doc["duration_s"] = max((r.doc.get("duration_s") or 0.0) for r in runs)
    if failing:
        others = [f"node {r.node_rank}: {r.doc.get('error_class')}" for r in failing[1:]]
        doc["error"] = (f"node {base.node_rank} ({base.host}): {base.doc.get('error')}"
                        + (f" (then {', '.join(others)})" if others else ""))
        return doc
    problem = world_problem(runs, devices)
    if problem:
        doc.update(status="error", error_class="crash", error=problem)
    elif len(runs) > 1:  # every node's figures, not node 0's (qualify.workloads.rank_figures)
        doc = rank_figures.combine({r.node_rank: r.doc for r in runs}, doc)
    return doc


def _lost_node(case_doc: dict[str, Any], node_rank: int, exc: BaseException) -> NodeRun:
    message = f"node {node_rank}: Ray lost its task: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
    doc = protocol.make_result(case_doc, "error", error_class="infra", error=message)
    return NodeRun(node_rank, doc, None, None, None, None, None, None)


def _straggler(case_doc: dict[str, Any], node_rank: int, waited_s: float) -> NodeRun:
    message = (f"node {node_rank}: no answer {waited_s:.0f} s after the launch, past the case timeout; "
               "its task was ended with the placement group")
    doc = protocol.make_result(case_doc, "error", error_class="timeout", error=message)
    return NodeRun(node_rank, doc, None, None, None, None, None, None)


# --------------------------------------------------------------------------- Ray tasks


@ray.remote(num_cpus=0, max_retries=0)
def _pick_rendezvous() -> tuple[str, int]:
    """The address Ray reports for this node and a port free on it (bound there, not on every interface)."""
    address = ray.util.get_node_ip_address()
    return address, free_port(address)


@ray.remote
def _run_node(executor: Executor, node_rank: int, case_doc: dict[str, Any], timeout_s: float) -> NodeRun:
    started = time.time()
    context = ray.get_runtime_context()
    gpu_ids = gpu_ids_of(context)
    outcome = executor.run(case_doc, timeout_s=timeout_s, gpu_ids=gpu_ids)
    return NodeRun(node_rank, outcome.doc, outcome.exit_code, outcome.exec_s, started, socket.gethostname(),
                   context.get_node_id(), ray.util.get_node_ip_address(), gpu_ids, list(outcome.command),
                   node_facts.driver_facts())


# --------------------------------------------------------------------------- one launch


def _refused(case_doc: dict[str, Any], error_class: str, message: str, *, retryable: bool,
             started: float) -> CaseRunResult:
    doc = protocol.make_result(case_doc, "error", error_class=error_class, error=message)
    return CaseRunResult(doc, None, time.time() - started, None, None, None, retryable=retryable)


def _gather(case_doc: dict[str, Any], refs: list[ray.ObjectRef], deadline_s: float) -> list[NodeRun]:
    """Every node's run; a lost task is an infra run, one still running at the deadline a timeout run."""
    start = time.monotonic()
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=deadline_s)
    runs: list[NodeRun] = []
    for rank, ref in enumerate(refs):
        if ref not in ready:
            runs.append(_straggler(case_doc, rank, time.monotonic() - start))
            continue
        try:
            runs.append(ray.get(ref))
        except (ray.exceptions.RayError, OSError) as exc:
            runs.append(_lost_node(case_doc, rank, exc))
    return runs


def _launch(executor: Executor, case_doc: dict[str, Any], resources: Resources, timeout_s: float,
            pg: PlacementGroup, submitted: float) -> CaseRunResult:
    nodes = resources.nodes
    bundle = node_bundle(resources)
    in_bundle = [PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=k) for k in range(nodes)]
    address, port = ray.get(_pick_rendezvous.options(scheduling_strategy=in_bundle[0]).remote(), timeout=120)
    refs = [_run_node.options(scheduling_strategy=in_bundle[k], **bundle_task_options(bundle)).remote(
                executor, k, node_case_doc(case_doc, node_rank=k, nodes=nodes, address=address, port=port),
                timeout_s)
            for k in range(nodes)]
    runs = _gather(case_doc, refs, timeout_s + DRIVER_MARGIN_S)
    devices = int((case_doc.get("params") or {}).get("devices", 1))
    doc = merge_node_docs(case_doc, runs, devices=devices, rendezvous=f"{address}:{port}")
    first = runs[0]
    started = [r.started_at for r in runs if r.started_at is not None]
    exits = [r.exit_code for r in runs]
    return CaseRunResult(
        doc=doc,
        exit_code=None if None in exits else next((c for c in exits if c != 0), 0),
        exec_s=max((r.exec_s or 0.0) for r in runs),
        queue_wait_s=max(0.0, max(started) - submitted) if started else None,
        node=first.host, node_id=first.node_id,
        gpu_ids=[f"node{r.node_rank}:{g}" for r in runs for g in r.gpu_ids],
        retryable=doc.get("error_class") == "infra",
        command=tuple(first.command))


def run_multinode_case(executor: Executor, case_doc: dict[str, Any], resources: Resources,
                       timeout_s: float, on_started: Callable[[], None] | None = None) -> CaseRunResult:
    """One launch of a multi-node case (see the module docstring); always a result, never an exception.
    `on_started`: called once the placement group holds every node (the case's queue wait ends there)."""
    submitted = time.time()
    problem = multinode_problem(case_doc, executor)
    if problem:
        return _refused(case_doc, "bad_case", problem, retryable=False, started=submitted)
    pg: PlacementGroup | None = None
    try:
        pg = placement_group([node_bundle(resources)] * resources.nodes, strategy="STRICT_SPREAD")
        wait_s = max(PG_READY_MIN_S, timeout_s)
        try:
            ray.get(pg.ready(), timeout=wait_s)
        except ray.exceptions.GetTimeoutError:
            return _refused(case_doc, "infra", f"the cluster did not give {resources.nodes} distinct nodes with "
                            f"{node_bundle(resources)} each within {wait_s:.0f} s", retryable=True,
                            started=submitted)
        if on_started is not None:
            on_started()
        return _launch(executor, case_doc, resources, timeout_s, pg, submitted)
    except ray.exceptions.RayError as exc:
        return _refused(case_doc, "infra", f"Ray could not launch the case on {resources.nodes} nodes: "
                        f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}", retryable=True,
                        started=submitted)
    finally:
        if pg is not None:
            _remove(pg)


def _remove(pg: PlacementGroup) -> None:
    """Give the nodes back (ends any task still in the group); a Ray that is gone has nothing to give back."""
    try:
        remove_placement_group(pg)
    except Exception:  # noqa: BLE001 - never mask the case's own result with a cleanup error
        pass

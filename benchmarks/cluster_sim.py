"""A release's matrix on a simulated GPU cluster: how close the flow's scheduling gets to the lower bound.

Real Ray nodes on this machine (tests/support/ray_cluster.py: ray.cluster_utils on 127.0.0.1) declare the
cluster's shape: N nodes, each with G GPUs, C CPUs and the manifest's accelerator type. Every case of the
manifest keeps its real resources and becomes a sleep of its planned duration (qualify.plan's estimate, or its
history) times --scale. The cases are handed to Ray as the flow hands them (flows/qualify_release._run_cases):
in the planner's order (qualify.plan.submission_order, the order `qualify plan` schedules), one at a time, each
once the previous one is submitted (--release started: once it runs, so that Ray cannot start a later case
first). A single-node
case goes through execution.ray.run_case_on_ray with the local executor (the Ray options of its resources,
the streaming start signal); a multi-node case reserves its nodes with the same STRICT_SPREAD placement group
as execution/multinode.py (its gang of sleeps, one per node: the sleep workload knows no rendezvous).

Prints each case's planned and achieved start and end, then one line: the achieved makespan against the
planned one and the lower bound max(longest case, sum of resource-seconds / capacity), all in planned seconds.

    PYTHONPATH=src:tests .venv/bin/python benchmarks/cluster_sim.py releases/training-xpu-pytorch-25.05.yaml \
        --nodes 4 --gpus-per-node 8 --cpus-per-node 64 --scale 0.01
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))


@dataclass(frozen=True)
class CaseTiming:
    case_id: str
    planned_start_s: float
    planned_end_s: float
    start_s: float  # since the first submission, in real seconds
    end_s: float
    nodes: tuple[str, ...]  # the Ray nodes it ran on


@dataclass(frozen=True)
class Simulation:
    scale: float
    planned_makespan_s: float  # in planned seconds
    lower_bound_s: float
    achieved_s: float  # real seconds / scale
    cases: list[CaseTiming]

    @property
    def ratio(self) -> float:
        return self.achieved_s / self.lower_bound_s

    def line(self) -> str:
        return (f"achieved makespan {self.achieved_s:.0f} s (planned {self.planned_makespan_s:.0f} s), lower bound "
                f"{self.lower_bound_s:.0f} s: achieved/bound {self.ratio:.3f}, planned/bound "
                f"{self.planned_makespan_s / self.lower_bound_s:.3f} (scale {self.scale:g}: {len(self.cases)} cases "
                f"in {self.achieved_s * self.scale:.1f} real seconds)")


def _sleep_doc(case: Any, seconds: float) -> dict[str, Any]:
    from qualify.workloads import protocol

    return protocol.make_case(case.case_id, "sleep", {"duration_s": seconds}, timeout_s=max(60.0, 10 * seconds))


def simulate(manifest: Path, nodes: int, gpus_per_node: int, cpus_per_node: int, scale: float,
             log_dir: Path, release: str = "submitted") -> Simulation:
    from qualify.manifest.cases import expand
    from qualify.manifest.load import load_manifest
    from qualify.plan import ClusterShape, demand_of, lower_bound, pairing_of, schedule, submission_order
    from support.ray_cluster import CLIENT_ENV, loopback_cluster

    release_manifest = load_manifest(manifest).release  # not `release`: that is the hand-over mode below
    cases = expand(release_manifest)
    shape = ClusterShape(nodes, gpus_per_node, cpus_per_node)
    # As `qualify plan` plans them: a reference (or paired) case's two sides one after the other, a duet's at once.
    demands = {c.case_id: demand_of(c, None, pairing_of(release_manifest, c, shape)) for c in cases}
    plan = schedule(demands.values(), shape)
    if plan.refused:
        raise SystemExit(f"the plan refuses cases: {plan.refused}")
    bound = lower_bound(list(demands.values()), shape)
    planned = {p.demand.case_id: p for p in plan.cases}
    types = sorted({c.resources.accelerator_type for c in cases if c.resources.accelerator_type})
    node_args = {"num_cpus": cpus_per_node, "num_gpus": gpus_per_node,
                 "resources": {f"accelerator_type:{t}": 1 for t in types}}
    os.environ.update(CLIENT_ENV)
    with loopback_cluster(log_dir / "cluster.log", node_args, [node_args] * (nodes - 1)) as cluster:
        import ray

        from qualify.execution.ray import bind_local_cluster_to_loopback

        bind_local_cluster_to_loopback()
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        try:
            timings = _run(submission_order(cases, None, release_manifest), demands, planned, scale, release)
        finally:
            ray.shutdown()
    first = min(t[0] for t in timings.values())
    cases_out = [CaseTiming(cid, planned[cid].start_s, planned[cid].end_s, (s - first) / scale, (e - first) / scale,
                            n) for cid, (s, e, n) in timings.items()]
    achieved = max(c.end_s for c in cases_out)
    return Simulation(scale, plan.makespan_s, bound, achieved, sorted(cases_out, key=lambda c: c.start_s))


def held_span(before_submission: float, outcome: Any, noticed_start: float, noticed_end: float) -> tuple[float, float]:
    """When a case held its resources, on the worker's clock (every node is on this machine): the submission plus the
    queue wait the task measured from it, then plus the task's own wall time. The driver notices a start and an end
    later, each by its own latency: a case's end was once noticed after its successor on the same GPUs had started
    (CI, under load). A result made on the driver (never ran, or lost) has no worker times: the noticed ones."""
    if outcome.queue_wait_s is None or outcome.exec_s is None:
        return noticed_start, noticed_end
    start = before_submission + outcome.queue_wait_s
    return start, start + outcome.exec_s


def _run(order: list[Any], demands: dict[str, Any], planned: dict[str, Any], scale: float,
         release: str) -> dict[str, tuple[float, float, tuple[str, ...]]]:
    """Hand the cases to Ray one at a time in `order`, the next once this one is `release` ("submitted" or
    "started"); returns case id -> (start, end, node ids), wall clock."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from qualify.execution.multinode import node_bundle
    from qualify.execution.ray import run_case_on_ray
    from qualify.executors import LocalExecutor

    @ray.remote(max_retries=0)
    def gang_member(seconds: float) -> tuple[float, float, str]:
        start = time.time()
        time.sleep(seconds)
        return start, time.time(), ray.get_runtime_context().get_node_id()

    results: dict[str, tuple[float, float, tuple[str, ...]]] = {}
    errors: list[str] = []
    executor = LocalExecutor()

    def one(case: Any, handed: threading.Event) -> None:
        seconds = demands[case.case_id].duration_s * scale
        try:
            if case.resources.nodes > 1:
                pg = placement_group([node_bundle(case.resources)] * case.resources.nodes, strategy="STRICT_SPREAD")
                if release == "submitted":
                    handed.set()
                ray.get(pg.ready())
                handed.set()  # its nodes are held: it runs
                try:
                    refs = [gang_member.options(num_cpus=0, scheduling_strategy=PlacementGroupSchedulingStrategy(
                        pg, placement_group_bundle_index=k)).remote(seconds) for k in range(case.resources.nodes)]
                    spans = ray.get(refs)
                finally:
                    remove_placement_group(pg)
                results[case.case_id] = (min(s for s, _, _ in spans), max(e for _, e, _ in spans),
                                         tuple(n for _, _, n in spans))
                return
            started: list[float] = []

            def on_started() -> None:
                started.append(time.time())
                handed.set()

            for _attempt in range(2):  # a retryable infra result (a lost worker or item) runs again, as the flow's
                before_submission = time.time()
                outcome = run_case_on_ray(executor, _sleep_doc(case, seconds), case.resources,
                                          timeout_s=10 * seconds + 60, on_started=on_started,
                                          on_submitted=handed.set if release == "submitted" else None)
                if not outcome.retryable:
                    break
            if outcome.doc.get("status") != "passed":
                errors.append(f"{case.case_id}: {outcome.doc.get('error')}")
            end = time.time()
            span = held_span(before_submission, outcome, started[0] if started else end, end)
            results[case.case_id] = (*span, (str(outcome.node_id),))
        except Exception as exc:  # noqa: BLE001 - reported with the case, the simulation goes on
            errors.append(f"{case.case_id}: {type(exc).__name__}: {exc}")
        finally:
            handed.set()

    threads = []
    for case in order:  # as the flow's turnstile: the next case is handed to Ray once this one is
        handed = threading.Event()
        thread = threading.Thread(target=one, args=(case, handed), daemon=True)
        thread.start()
        threads.append(thread)
        handed.wait()
    for thread in threads:
        thread.join()
    if errors:
        raise RuntimeError("; ".join(errors))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("manifest", type=Path)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--cpus-per-node", type=int, default=64)
    parser.add_argument("--scale", type=float, default=0.01, help="real seconds per planned second")
    parser.add_argument("--release", choices=("submitted", "started"), default="submitted",
                        help="hand the next case to Ray once this one is submitted, or once it started")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="qsim-") as tmp:
        sim = simulate(args.manifest, args.nodes, args.gpus_per_node, args.cpus_per_node, args.scale, Path(tmp),
                       args.release)
    if args.json:
        print(json.dumps({"line": sim.line(), "ratio": sim.ratio, "cases": [c.__dict__ for c in sim.cases]}))
        return 0
    for c in sim.cases:
        print(f"{c.case_id:45s} planned {c.planned_start_s:6.0f} .. {c.planned_end_s:6.0f} s   achieved "
              f"{c.start_s:6.0f} .. {c.end_s:6.0f} s")
    print(sim.line())
    return 0


if __name__ == "__main__":
    sys.exit(main())

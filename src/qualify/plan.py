"""A schedule of a release's cases on a cluster, and the lower bound it is held against.

Durations come from earlier results of the same case (median execution seconds of its passed results)
or, where there are none, from an estimate built from the case's own parameters (`estimate_duration`,
said as such in the plan). Cases are placed longest first (LPT list scheduling) with backfill: whenever
resources free up, the queue is scanned in order and every case that fits starts, on the nodes that fit
it most tightly (best fit, so that an 8-GPU gang is not blocked by scattered 1-GPU cases). A gang
(`nodes: N`) needs N distinct nodes, each with its per-node share free at once, as Ray's STRICT_SPREAD
placement group does.

The lower bound no schedule can beat: max(longest case, for each resource Σ amount·seconds ÷ capacity).
A gang shape that no node can hold (16 GPUs on one 8-GPU node) is refused with the shape that would fit.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Iterable, Literal, Mapping, Sequence

from qualify.manifest import ReleaseManifest, is_reference_case
from qualify.manifest.cases import Case


@dataclass(frozen=True)
class ClusterShape:
    nodes: int
    gpus_per_node: float
    cpus_per_node: float

    def capacity(self) -> dict[str, float]:
        return {"GPU": self.nodes * self.gpus_per_node, "CPU": self.nodes * self.cpus_per_node}


@dataclass(frozen=True)
class CaseDemand:
    """What one case asks of the cluster for how long."""

    case_id: str
    duration_s: float
    source: str  # "history" (median of earlier results) or "estimate"
    nodes: int
    gpus_per_node: float
    cpus_per_node: float

    def resource_seconds(self) -> dict[str, float]:
        return {"GPU": self.nodes * self.gpus_per_node * self.duration_s,
                "CPU": self.nodes * self.cpus_per_node * self.duration_s}


@dataclass(frozen=True)
class PlannedCase:
    demand: CaseDemand
    order: int  # submission order (longest first)
    start_s: float
    end_s: float
    node_indices: tuple[int, ...]


@dataclass(frozen=True)
class Plan:
    shape: ClusterShape
    cases: tuple[PlannedCase, ...]
    refused: tuple[tuple[str, str], ...]  # (case id, why no node shape can hold it)
    makespan_s: float
    lower_bound_s: float

    @property
    def ratio(self) -> float | None:
        return self.makespan_s / self.lower_bound_s if self.lower_bound_s > 0 else None


def estimate_duration(case: Case) -> float:
    """Seconds a case is expected to take when no earlier result says: a deliberately rough model from the
    case's own parameters (each launch pays a fixed start, then its timed work), capped by its timeouts."""
    params = case.params
    launches = max(1, case.launches)
    if case.kind == "sleep":
        per_launch = float(params.get("duration_s", 1.0)) + 2.0
    elif case.kind == "train":
        steps = int(params.get("warmup_steps") or 0) + int(params.get("steps") or 10) * int(params.get("repeats") or 1)
        per_launch = 90.0 + 2.0 * steps  # process, model build and engine init, then ~2 s a step at scale
    elif case.kind == "infer":
        tokens = (int(params.get("num_prompts") or 64) * int(params.get("max_new_tokens") or 64)
                  * int(params.get("repeats") or 1))
        per_launch = 120.0 + tokens / 2000.0  # model load, then ~2,000 generated tokens/s
    else:
        per_launch = 10.0
    return min(per_launch, float(case.timeout_s)) * launches


Pairing = Literal["alone", "paired", "duet"]


def pairing_of(release: ReleaseManifest, case: Case, shape: ClusterShape | None = None) -> Pairing:
    """How a case shares its node with the other side of its comparison (the previous release's image, or
    gate.reference's): paired runs both sides' launches one after the other (twice the launches), a duet holds
    both sides at once (twice the resources; where no node of the shape can hold that, it falls back to paired,
    as the runner does). Alone: no comparison re-measures anything beside it."""
    rule = release.gate.regression_for(case)
    if not rule.enabled or not rule.metrics_for(case.kind) or case.resources.nodes > 1:
        return "alone"
    if not is_reference_case(case) and not (rule.baseline in ("paired", "duet") and release.release.previous_tag):
        return "alone"
    if rule.baseline == "duet":
        if shape is None or (2 * case.resources.gpus <= shape.gpus_per_node
                             and 2 * case.resources.cpus <= shape.cpus_per_node):
            return "duet"
        return "paired"
    return "paired" if rule.baseline == "paired" else "alone"


def demand_of(case: Case, history_s: Mapping[str, float] | None = None, pairing: Pairing = "alone") -> CaseDemand:
    """What the case asks: its measured duration (which already includes its other side), else the estimate, twice
    for a paired case; twice the per-node resources for a duet, whose one task holds both sides."""
    nodes = max(1, case.resources.nodes)
    known = (history_s or {}).get(case.case_id)
    sides = 2 if pairing == "duet" else 1
    return CaseDemand(case_id=case.case_id,
                      duration_s=known if known is not None else
                      estimate_duration(case) * (2 if pairing == "paired" else 1),
                      source="history" if known is not None else "estimate", nodes=nodes,
                      gpus_per_node=sides * case.resources.gpus / nodes,
                      cpus_per_node=sides * case.resources.cpus / nodes)


def shape_problem(demand: CaseDemand, shape: ClusterShape) -> str | None:
    """Why no placement of this gang can exist on the cluster, with the shape that would fit; None when one can."""
    if demand.nodes > shape.nodes:
        return f"needs {demand.nodes} nodes; the cluster has {shape.nodes}"
    if demand.gpus_per_node > shape.gpus_per_node or demand.cpus_per_node > shape.cpus_per_node:
        total_gpus, total_cpus = demand.gpus_per_node * demand.nodes, demand.cpus_per_node * demand.nodes
        fit = max(math.ceil(total_gpus / shape.gpus_per_node) if shape.gpus_per_node else 1,
                  math.ceil(total_cpus / shape.cpus_per_node) if shape.cpus_per_node else 1)
        hint = (f"; as nodes: {fit} it needs {total_gpus / fit:g} GPUs and {total_cpus / fit:g} CPUs per node"
                if fit <= shape.nodes else f"; even spread it needs {fit} nodes")
        return (f"needs {demand.gpus_per_node:g} GPUs and {demand.cpus_per_node:g} CPUs on each of "
                f"{demand.nodes} node(s); a node has {shape.gpus_per_node:g} GPUs and {shape.cpus_per_node:g} CPUs"
                + hint)
    return None


def lower_bound(demands: Sequence[CaseDemand], shape: ClusterShape) -> float:
    """max(longest case, Σ resource·seconds ÷ capacity for each resource)."""
    if not demands:
        return 0.0
    capacity = shape.capacity()
    bound = max(d.duration_s for d in demands)
    for resource, cap in capacity.items():
        if cap > 0:
            bound = max(bound, sum(d.resource_seconds()[resource] for d in demands) / cap)
    return bound


@dataclass
class _Node:
    gpus: float
    cpus: float


@dataclass(order=True)
class _Running:
    end_s: float
    order: int
    demand: CaseDemand = field(compare=False)
    nodes: tuple[int, ...] = field(compare=False)


def _place(demand: CaseDemand, free: list[_Node]) -> tuple[int, ...] | None:
    """The nodes this gang would take now (tightest fit first), or None when it does not fit."""
    fitting = [i for i, n in enumerate(free)
               if n.gpus >= demand.gpus_per_node - 1e-9 and n.cpus >= demand.cpus_per_node - 1e-9]
    if len(fitting) < demand.nodes:
        return None
    fitting.sort(key=lambda i: (free[i].gpus - demand.gpus_per_node, free[i].cpus - demand.cpus_per_node, i))
    return tuple(sorted(fitting[:demand.nodes]))


def schedule(demands: Iterable[CaseDemand], shape: ClusterShape) -> Plan:
    """Longest first with backfill (see the module docstring)."""
    placeable: list[CaseDemand] = []
    refused: list[tuple[str, str]] = []
    for demand in demands:
        problem = shape_problem(demand, shape)
        if problem:
            refused.append((demand.case_id, problem))
        else:
            placeable.append(demand)
    queue = sorted(placeable, key=queue_key)
    order = {d.case_id: k for k, d in enumerate(queue)}
    free = [_Node(shape.gpus_per_node, shape.cpus_per_node) for _ in range(shape.nodes)]
    running: list[_Running] = []
    planned: list[PlannedCase] = []
    now = 0.0
    while queue or running:
        waiting: list[CaseDemand] = []
        for demand in queue:
            nodes = _place(demand, free)
            if nodes is None:
                waiting.append(demand)
                continue
            for i in nodes:
                free[i].gpus -= demand.gpus_per_node
                free[i].cpus -= demand.cpus_per_node
            heapq.heappush(running, _Running(now + demand.duration_s, order[demand.case_id], demand, nodes))
            planned.append(PlannedCase(demand, order[demand.case_id], now, now + demand.duration_s, nodes))
        queue = waiting
        if not running:
            break  # nothing runs and nothing fits: cannot happen after shape_problem, kept as a guard
        done = heapq.heappop(running)
        now = done.end_s
        finished = [done]
        while running and running[0].end_s <= now:  # exactly: a tolerance freed a case still running
            finished.append(heapq.heappop(running))
        for item in finished:
            for i in item.nodes:
                free[i].gpus += item.demand.gpus_per_node
                free[i].cpus += item.demand.cpus_per_node
    makespan = max((p.end_s for p in planned), default=0.0)
    return Plan(shape=shape, cases=tuple(sorted(planned, key=lambda p: p.order)), refused=tuple(refused),
                makespan_s=makespan, lower_bound_s=lower_bound(placeable, shape))


def queue_key(demand: CaseDemand) -> tuple[float, float, float, str]:
    """Longest first; among equals the bigger gang first (GPUs, then CPUs: it is the harder one to fit later),
    then by case id."""
    return (-demand.duration_s, -demand.nodes * demand.gpus_per_node, -demand.nodes * demand.cpus_per_node,
            demand.case_id)


def submission_order(cases: Sequence[Case], history_s: Mapping[str, float] | None = None,
                     release: ReleaseManifest | None = None) -> list[Case]:
    """The order the flow hands the cases to Ray: the plan's own (queue_key: longest first by history, else the
    estimate, paired and duet cases as they will run; among equals the bigger gang), so that a long case never
    starts last behind short ones and the run follows the schedule `qualify plan` printed."""
    def demand(case: Case) -> CaseDemand:
        return demand_of(case, history_s, pairing_of(release, case) if release is not None else "alone")

    return sorted(cases, key=lambda c: queue_key(demand(c)))

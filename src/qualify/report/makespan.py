"""A run's achieved makespan against the lower bound of the cluster it ran on, as `qualify plan` bounds a plan.

lower bound = max(longest case, Σ resource·seconds ÷ the cluster's capacity, for CPUs and GPUs), with each case's
measured execution seconds (its launches, a paired or duet case's baseline side included) and its manifest
resources; the achieved makespan is the cases stage's wall time. A ratio near 1 says the cluster was kept busy;
a large one, that cases waited while resources were free (or that the cluster was bigger than the matrix needed:
the bound is then the longest case).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Collection, Mapping, Sequence

from qualify.numbers import finite
from qualify.report.efficiency import LaunchTime, launch_time


@dataclass(frozen=True)
class MakespanView:
    achieved_s: float
    lower_bound_s: float
    nodes: int
    cpus: float
    gpus: float
    cases: int

    @property
    def ratio(self) -> float | None:
        return self.achieved_s / self.lower_bound_s if self.lower_bound_s > 0 else None

    def line(self) -> str:
        ratio = f"{self.ratio:.2f}" if self.ratio is not None else "n/a"
        return (f"schedule: cases stage {self.achieved_s:.1f} s against a lower bound of {self.lower_bound_s:.1f} s "
                f"({self.cases} cases on {self.nodes} node{'s' if self.nodes != 1 else ''}, {self.cpus:g} CPUs, "
                f"{self.gpus:g} GPUs): ratio {ratio}")

    def as_dict(self) -> dict[str, Any]:
        return {"achieved_s": self.achieved_s, "lower_bound_s": self.lower_bound_s, "ratio": self.ratio,
                "nodes": self.nodes, "cpus": self.cpus, "gpus": self.gpus, "cases": self.cases, "line": self.line()}


def run_time(run: Any, results: Sequence[Any], cases: Sequence[Any]) -> tuple[LaunchTime, MakespanView | None]:
    """The run's launch seconds and efficiency, and its schedule line, from its stored results (the one place
    `qualify run`'s outcome and the run views compute them)."""
    stages = run.stage_seconds or {}
    # A case that ran in duet held both sides' resources for its time (what it really ran: its result says).
    duets = {r.case_id for r in results if isinstance(r.environment, Mapping)
             and isinstance(r.environment.get("duet"), Mapping) and r.environment["duet"].get("mode") == "duet"}
    return (launch_time((r.environment for r in results), stages),
            makespan_view(cases, {r.case_id: r.exec_s for r in results}, run.cluster, stages, duets=duets))


def makespan_view(cases: Sequence[Any], exec_s: Mapping[str, Any], cluster: Mapping[str, Any] | None,
                  stage_seconds: Mapping[str, Any], duets: Collection[str] = ()) -> MakespanView | None:
    """`cases`: the run's manifest cases (qualify.manifest.cases.Case); `exec_s`: case id -> measured seconds;
    `cluster`: the run's recorded nodes. None when the run recorded no cluster, no cases stage or no case time."""
    from qualify.plan import ClusterShape, demand_of, lower_bound

    achieved = finite((stage_seconds or {}).get("cases"))
    nodes = [n for n in ((cluster or {}).get("nodes") or []) if isinstance(n, Mapping)]
    if achieved is None or not nodes:
        return None
    measured = {case_id: s for case_id, s in ((k, finite(v)) for k, v in exec_s.items()) if s is not None}
    # The plan's own demand, with the measured seconds as its history.
    demands = [demand_of(case, measured, "duet" if case.case_id in duets else "alone")
               for case in cases if case.case_id in measured]
    if not demands:
        return None
    cpus = sum(finite(node.get("CPU")) or 0.0 for node in nodes)
    gpus = sum(finite(node.get("GPU")) or 0.0 for node in nodes)
    shape = ClusterShape(len(nodes), gpus / len(nodes), cpus / len(nodes))  # the same capacity in aggregate
    return MakespanView(achieved, lower_bound(demands, shape), len(nodes), cpus, gpus, len(demands))

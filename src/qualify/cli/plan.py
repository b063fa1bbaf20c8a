"""`qualify plan`: the release's cases scheduled on a cluster shape, against the lower bound."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer

from qualify.cli.common import JsonOption, load, open_db, say
from qualify.errors import BadInput
from qualify.manifest.cases import expand
from qualify.plan import ClusterShape, Plan, demand_of, pairing_of, schedule
from qualify.store import repo


def _plan_dict(plan: Plan, pairing: dict[str, str]) -> dict[str, Any]:
    return {
        "cluster": {"nodes": plan.shape.nodes, "gpus_per_node": plan.shape.gpus_per_node,
                    "cpus_per_node": plan.shape.cpus_per_node},
        "makespan_s": plan.makespan_s, "lower_bound_s": plan.lower_bound_s, "ratio": plan.ratio,
        "cases": [{"order": p.order, "case_id": p.demand.case_id, "duration_s": p.demand.duration_s,
                   "duration_from": p.demand.source, "nodes": list(p.node_indices), "start_s": p.start_s,
                   "end_s": p.end_s, "gpus_per_node": p.demand.gpus_per_node,
                   "cpus_per_node": p.demand.cpus_per_node, "pairing": pairing.get(p.demand.case_id, "alone")}
                  for p in plan.cases],
        "refused": [{"case_id": case_id, "reason": reason} for case_id, reason in plan.refused],
    }


def plan(manifest: Path = typer.Argument(..., help="release manifest"),
         nodes: int = typer.Option(..., "--nodes", min=1, help="nodes in the cluster"),
         gpus_per_node: float = typer.Option(0, "--gpus-per-node", min=0, help="GPUs on each node"),
         cpus_per_node: float = typer.Option(..., "--cpus-per-node", min=0, help="CPUs on each node"),
         db: Optional[str] = typer.Option(None, "--db", help="take durations from earlier results in this "
                                          "database (default: estimates from the cases' parameters)"),
         as_json: bool = JsonOption) -> None:
    """Plan the cases longest first on NODES x (GPUS, CPUS); print the order, the makespan and the lower bound.

    Example: qualify plan releases/training-xpu-pytorch-25.05.yaml --nodes 4 --gpus-per-node 8 --cpus-per-node 64
    """
    loaded = load(manifest)
    cases = expand(loaded.release)
    history: dict[str, float] = {}
    if db:
        with open_db(db, migrate=False)() as session:
            history = repo.recent_exec_seconds(session, loaded.release.release.repository,
                                               [c.case_id for c in cases])
    shape = ClusterShape(nodes=nodes, gpus_per_node=gpus_per_node, cpus_per_node=cpus_per_node)
    pairing = {c.case_id: pairing_of(loaded.release, c, shape) for c in cases}
    result = schedule([demand_of(c, history, pairing[c.case_id]) for c in cases], shape)
    if as_json:
        say(json.dumps(_plan_dict(result, pairing), indent=2))
    else:
        for p in result.cases:
            side = {"paired": ", paired", "duet": ", duet"}.get(pairing[p.demand.case_id], "")
            say(f"{p.order + 1:>3}  {p.demand.case_id:<40}  {p.demand.duration_s:>9.0f} s ({p.demand.source}{side})"
                f"  nodes {','.join(map(str, p.node_indices)):<8}  {p.start_s:>9.0f} .. {p.end_s:.0f} s")
        for case_id, reason in result.refused:
            say(f"  -  {case_id:<40}  refused: {reason}")
        ratio = f"{result.ratio:.3f}" if result.ratio is not None else "n/a"
        say(f"makespan {result.makespan_s:.0f} s, lower bound {result.lower_bound_s:.0f} s, ratio {ratio}")
    if result.refused:
        raise BadInput(f"{len(result.refused)} case(s) cannot be placed on {nodes} node(s) of {gpus_per_node:g} GPUs "
                       f"and {cpus_per_node:g} CPUs: " + "; ".join(f"{c}: {r}" for c, r in result.refused))

"""Images pulled once per node, before the cases (issue 28): the first case on a node no longer pays the pull
(tens of GB for a real training image) inside its own timeout, and a registry that cannot serve the image is an
infrastructure failure of the run, said once, instead of every case's.

The nodes: every alive node that can hold at least one of the run's cases (one node's share of its resources,
execution/result.node_share). On each, a Ray task pinned to that node (NodeAffinitySchedulingStrategy, not soft)
and asking for no CPU (the pull must not wait behind the cases, and it runs before them anyway) runs the
executor's pull by digest. The pulls of all nodes run at once; the stage's wall time and each node's seconds are
recorded with the run (runs.cluster["pulls"]). The local executor runs no image: nothing is pulled.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Iterable, Mapping, Sequence

import ray

from qualify.errors import InfraError
from qualify.execution.result import node_fits, node_share
from qualify.manifest import Resources

PULL_TIMEOUT_S = 3600.0  # a real training image is tens of GB; a pull that never ends still ends here


class PullFailed(InfraError):
    """The image could not be pulled on a node that will run cases: infrastructure (exit 3), not the candidate's
    fault; no case ran. Carries every node's pull, the failed ones too, for the run's record."""

    def __init__(self, message: str, pulls: Sequence["NodePull"] = ()) -> None:
        super().__init__(message)
        self.pulls = list(pulls)


@dataclass(frozen=True)
class NodePull:
    """One node's pull of one image."""

    node_id: str
    address: str
    image: str
    seconds: float
    ok: bool
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def nodes_for(resources: Iterable[Resources], nodes: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The alive nodes that can hold one node's share of at least one case (those that will run cases)."""
    wanted = [node_share(r).wanted() for r in resources]
    return [n for n in nodes if n.get("Alive") and any(node_fits(n, want) for want in wanted)]


def _pull_here(executor: Any, timeout_s: float) -> tuple[float, int | None, bool, str]:
    result = executor.pull(timeout_s)
    tail = (result.stderr or result.start_error or "").strip().splitlines()
    return result.seconds, result.returncode, result.timed_out, (tail[-1] if tail else "")[:500]


def pull_on_nodes(executor: Any, resources: Iterable[Resources], timeout_s: float = PULL_TIMEOUT_S,
                  nodes: Sequence[Mapping[str, Any]] | None = None) -> list[NodePull]:
    """Pull the executor's image on every node that will run cases, all at once; raises PullFailed naming each node
    where it failed (after every pull ended, so that the record is whole). `executor` has pull(timeout_s) ->
    CommandResult and an `image` (executors/container.ContainerExecutor)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    targets = nodes_for(list(resources), ray.nodes() if nodes is None else nodes)
    remote = ray.remote(num_cpus=0, max_retries=0)(_pull_here)
    refs = [remote.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=n["NodeID"], soft=False))
            .remote(executor, timeout_s) for n in targets]
    pulls: list[NodePull] = []
    for node, ref in zip(targets, refs):
        address = str(node.get("NodeManagerAddress") or "?")
        try:
            seconds, code, timed_out, last = ray.get(ref, timeout=timeout_s + 60)
        except Exception as exc:  # noqa: BLE001 - the node or its worker died: said per node, below
            pulls.append(NodePull(node["NodeID"], address, executor.image, 0.0, False,
                                  f"the pull's Ray task failed: {type(exc).__name__}: {str(exc)[:300]}"))
            continue
        error = None
        if timed_out:
            error = f"no pull within {timeout_s:g} s"
        elif code != 0:
            error = f"exit {code}: {last or 'no message'}"
        pulls.append(NodePull(node["NodeID"], address, executor.image, float(seconds), error is None, error))
    failed = [p for p in pulls if not p.ok]
    if failed:
        raise PullFailed(f"image {executor.image} could not be pulled on {len(failed)} of {len(pulls)} node(s) "
                         "that would run cases: " + "; ".join(f"{p.address}: {p.error}" for p in failed), pulls)
    return pulls

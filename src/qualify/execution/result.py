"""What one case run brings back, and one node's share of a case's resources.

`CaseRunResult` is the one result type of the execution path: a single-node Ray task, one launch of a
multi-node case and a result synthesised on the driver (the case never ran) all return it, so nothing
converts between look-alike copies. `NodeShare` is the one place that divides a case's resources by
its node count; the Ray task options, the feasibility check and the placement-group bundle all derive
from it. Neither imports Ray: the driver's retry loop and the unit tests use them without a cluster.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from qualify.manifest import Resources

# Ray's own amount for an `accelerator_type:<name>` marker resource (a node declares 1.0 of it; a task that
# asks for the type asks for this much, so any number of tasks fit).
ACCELERATOR_MARKER = 0.001


@dataclass(frozen=True)
class CaseRunResult:
    """A case's (or one launch's) result document and where and how long it ran."""

    doc: dict[str, Any]  # a valid result document, always
    exit_code: int | None
    exec_s: float | None
    queue_wait_s: float | None
    node: str | None
    node_id: str | None
    gpu_ids: Sequence[str] = ()
    retryable: bool = False
    command: Sequence[str] = field(default_factory=tuple)

    @classmethod
    def failed(cls, doc: dict[str, Any], *, retryable: bool, exec_s: float = 0.0) -> "CaseRunResult":
        """A result made on the driver (the case never ran, or its worker was lost)."""
        return cls(doc=doc, exit_code=None, exec_s=exec_s, queue_wait_s=None, node=None, node_id=None,
                   retryable=retryable)


@dataclass(frozen=True)
class NodeShare:
    """One node's share of a case: the totals divided by `nodes` (a multi-node case reserves one per node)."""

    cpus: float
    gpus: float
    custom: dict[str, float]
    accelerator_type: str | None
    memory_bytes: int | None

    def ray_options(self) -> dict[str, Any]:
        """Ray task options asking for exactly this share."""
        options: dict[str, Any] = {
            "num_cpus": self.cpus,
            "num_gpus": self.gpus,
            "max_retries": 0,  # retries are the driver's decision (infrastructure failures only)
        }
        if self.custom:
            options["resources"] = dict(self.custom)
        if self.accelerator_type:
            options["accelerator_type"] = self.accelerator_type
        if self.memory_bytes:
            options["memory"] = self.memory_bytes
        return options

    def wanted(self) -> dict[str, float]:
        """The share as node resources (what a node must have; the names Ray reports in `ray.nodes()`)."""
        wanted: dict[str, float] = {"CPU": self.cpus, "GPU": self.gpus, **self.custom}
        if self.accelerator_type:
            wanted[f"accelerator_type:{self.accelerator_type}"] = ACCELERATOR_MARKER
        if self.memory_bytes:
            wanted["memory"] = float(self.memory_bytes)
        return {k: v for k, v in wanted.items() if v > 0}

    def bundle(self) -> dict[str, float]:
        """The share as a placement-group bundle (Ray refuses an empty one; a zero-CPU case still needs a node)."""
        return self.wanted() or {"CPU": ACCELERATOR_MARKER}


def node_fits(node: Mapping[str, Any], wanted: Mapping[str, float]) -> bool:
    """Whether a node of `ray.nodes()` has every resource of one node's share (NodeShare.wanted())."""
    have = node.get("Resources") or {}
    return all(float(have.get(k, 0.0)) >= v for k, v in wanted.items())


def node_share(resources: Resources) -> NodeShare:
    nodes = max(1, resources.nodes)
    return NodeShare(
        cpus=resources.cpus / nodes,
        gpus=resources.gpus / nodes,
        custom={k: v / nodes for k, v in resources.custom.items()},
        accelerator_type=resources.accelerator_type,
        memory_bytes=int(resources.memory_gb * 2**30 / nodes) if resources.memory_gb else None,
    )


def bundle_task_options(bundle: dict[str, float]) -> dict[str, Any]:
    """Ray task options asking for exactly one bundle's resources (a task placed in that bundle)."""
    options: dict[str, Any] = {"num_cpus": bundle.get("CPU", 0.0), "num_gpus": bundle.get("GPU", 0.0),
                               "max_retries": 0}
    if "memory" in bundle:
        options["memory"] = int(bundle["memory"])
    custom = {k: v for k, v in bundle.items() if k not in ("CPU", "GPU", "memory")}
    if custom:
        options["resources"] = custom
    return options

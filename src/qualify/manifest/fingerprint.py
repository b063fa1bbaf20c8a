"""What makes two results comparable: the case's measurement parameters and where it ran.

A result is compared with a baseline result only when their fingerprints match (compare like
with like): hardware (device, world size), case parameters (sequence length, micro-batch, ZeRO stage,
...), engine and dtype. Parameters that change what is checked but not what is measured
(probes, the agreement minimum) are left out, so adding a probe does not orphan the history.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    from qualify.manifest.cases import Case

# Case parameters that do not change the measured figures (the synthetic workload's `samples`, `fail`
# and `signal` ARE its measurements and faults, not settings of a measurement).
# `slowdown` (tests, benchmarks) stands for a slower candidate image: a result with it is compared with its
# baseline like any other, which is the point.
NOT_MEASUREMENT = frozenset({"probes", "min_agreement", "min_token_agreement", "samples", "launch_samples",
                             "fail", "signal", "slowdown"})


def result_fingerprint(kind: str, params: Mapping[str, Any], environment: Mapping[str, Any],
                       resources: Mapping[str, Any] | None = None, launches: int = 1) -> dict[str, Any]:
    """A flat, JSON-safe dict: one entry per comparable field."""
    facts = environment.get("facts") if isinstance(environment.get("facts"), Mapping) else {}
    device = environment.get("device_name") or environment.get("accelerator") or facts.get("device_name")
    world = environment.get("world_size") or facts.get("device_count")
    fp: dict[str, Any] = {"kind": kind, "device": device, "world_size": world,
                          "engine": params.get("engine"), "dtype": environment.get("dtype") or params.get("dtype"),
                          # How the samples were taken: launch-level samples are compared with their like only.
                          "launches": launches}
    for key in sorted(params):
        if key not in NOT_MEASUREMENT:
            fp[f"params.{key}"] = json.loads(json.dumps(params[key], sort_keys=True, default=str))
    for key, value in sorted((resources or {}).items()):
        fp[f"resources.{key}"] = value
    return fp


def differences(candidate: Mapping[str, Any] | None, baseline: Mapping[str, Any] | None) -> list[str]:
    """Fields whose values differ, as 'field: baseline -> candidate'; a missing fingerprint is one difference."""
    if not candidate or not baseline:
        which = "candidate" if not candidate else "baseline"
        return [f"the {which} result has no fingerprint (recorded before qualify stored them)"]
    out = []
    for key in sorted(set(candidate) | set(baseline)):
        if candidate.get(key) != baseline.get(key):
            out.append(f"{key}: {baseline.get(key)!r} -> {candidate.get(key)!r}")
    return out


def of_case(case: "Case", environment: Mapping[str, Any]) -> dict[str, Any]:
    """The fingerprint of a case's result, from the case and the environment its workload reported."""
    fp = result_fingerprint(case.kind, dict(case.params), environment,
                            case.resources.model_dump(mode="json", exclude_defaults=True), case.launches)
    if case.image:  # a case in another image of the release is compared with its like (the release's own: none)
        fp["image"] = case.image
    overlap = environment.get("setup_overlap")
    if isinstance(overlap, Mapping) and overlap.get("used"):
        # Launches measured one at a time after a shared set-up are compared with their like only (like `launches`);
        # a case that ran one launch after the other keeps the fingerprint it always had.
        fp["setup_overlap"] = overlap.get("batch")
    return fp

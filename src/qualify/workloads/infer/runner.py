"""The inference workload's case handler: parse the params, run the case's engine, judge.

Parameters: see params.InferParams; engines: see engines/__init__.py (the registry).

Verdict of a case (judge()), on the case's own measurements only:

* status "failed", error_class "quantization_not_applied" - the scheme is not "none" and the
                                                 weights it quantizes did not shrink as it must
                                                 (weight_bytes_ratio above the scheme's bound in
                                                 params.MAX_WEIGHT_BYTES_RATIO), or none of them
                                                 is a quantized tensor
* status "failed", error_class "low_agreement" - token_agreement < min_token_agreement
                                                 (default 0.5: a broken model, not a small
                                                 regression; the gate compares the figures
                                                 with the previous release)
  When both apply, error_class is the first and error lists both. Only a case's first launch evaluates
  the agreement (first_launch): the later launches time the engine.
* status "error": bad_case (invalid params), load_failed, crash, oom, timeout (protocol).

Probes (prefix_cache, max_model_len, degenerate) never change the status: each is reported in
`probes` as passed/failed/skipped/error (probes.py) and the gate judges it as its own check,
so that a failed or errored probe is a waivable probe finding, not a failed case.

Standard library and qualify.workloads only (an engine imports torch and the rest).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from qualify.workloads import duet, protocol
from qualify.workloads.infer.engines import DUET_ENGINES, get_engine
from qualify.workloads.infer.params import MAX_WEIGHT_BYTES_RATIO, InferParams, parse_params

FAILURE_ORDER = ("quantization_not_applied", "low_agreement")


def quantization_problem(p: InferParams, metrics: dict[str, Any]) -> str | None:
    """Why the case's weights are not quantized as its scheme says, or None.

    Only where the case read its weights back (weight_bytes_ratio measured): the vllm engine
    with a checkpoint it cannot read leaves the figures null and says why in its environment.
    """
    bound = MAX_WEIGHT_BYTES_RATIO.get(p.scheme)
    if bound is None:
        return None
    ratio = metrics.get("weight_bytes_ratio")
    quantized = metrics.get("quantized_weights")
    if quantized == 0:
        return (f"no weight is a quantized tensor of scheme {p.scheme} "
                f"(0 of {metrics.get('linear_weights')} linear weights)")
    if ratio is not None and ratio > bound:
        return (f"the quantized layers' weights are {ratio:.3f} of the reference's bytes, scheme {p.scheme} "
                f"must bring them to <= {bound:g} ({quantized} of {metrics.get('linear_weights')} linear weights "
                f"quantized)")
    return None


def judge(p: InferParams, metrics: dict[str, Any], probes: dict[str, dict[str, Any]] | None = None
          ) -> tuple[str, str | None, str | None]:
    """(status, error_class, error) of a case that ran to the end. `probes` is accepted and ignored:
    a probe never decides the case (see the module docstring)."""
    failures: list[tuple[str, str]] = []
    problem = quantization_problem(p, metrics)
    if problem:
        failures.append(("quantization_not_applied", problem))
    agreement = metrics.get("token_agreement")
    if agreement is not None and agreement < p.min_token_agreement:
        failures.append(("low_agreement", f"token_agreement {agreement:.4f} < min_token_agreement "
                                          f"{p.min_token_agreement:g}"))
    if not failures:
        return "passed", None, None
    failures.sort(key=lambda f: FAILURE_ORDER.index(f[0]))
    return "failed", failures[0][0], "; ".join(f"{cls}: {msg}" for cls, msg in failures)


# The probes a later launch repeats: the degenerate-output check reads that launch's own served tokens. The
# prefix-cache and max_model_len probes are deterministic on the same weights and data, like the agreement, so
# the case's first launch runs them and the later ones only time the engine.
EVERY_LAUNCH_PROBES = ("degenerate",)


def first_launch(case: dict[str, Any]) -> bool:
    """Whether this run is the case's first launch (or the case has no launches): only it evaluates the
    agreement, which is deterministic on the same weights and data, so the later launches only time."""
    launch = case.get("launch")
    index = launch.get("index", 0) if isinstance(launch, dict) else 0
    return not isinstance(index, int) or index == 0


def handler(case: dict[str, Any], log: logging.Logger) -> dict[str, Any]:
    p = parse_params(case.get("params") or {})
    first = first_launch(case)
    p = dataclasses.replace(p, evaluate_agreement=first,
                            probes=p.probes if first else tuple(x for x in p.probes if x in EVERY_LAUNCH_PROBES))
    report = _run_engine(case, p, log)
    status, error_class, error = judge(p, report["metrics"], report["probes"])
    if error:
        log.error("%s", error)
    environment = protocol.environment_base()
    environment.update(report["environment"])
    return {"status": status, "error_class": error_class, "error": error, "metrics": report["metrics"],
            "samples": report["samples"], "probes": report["probes"], "environment": environment}


def _run_engine(case: dict[str, Any], p: InferParams, log: logging.Logger) -> dict[str, Any]:
    """The case's engine; in a duet launch (a `duet` section) with the step barrier, pinned to the side's cores
    first (workloads/duet.py). Only an engine in DUET_ENGINES times its requests at a barrier: the driver measures
    any other one paired (execution/duet.unsupported_reason), so a duet section here for it is a bad case."""
    if case.get("duet") is None:
        return get_engine(p.engine).run(p, log)
    if p.engine not in DUET_ENGINES:
        raise protocol.BadCase(f"duet: the {p.engine} engine has no step both sides could start together")
    engine = get_engine(p.engine)
    try:
        barrier = duet.enter(case, trade_cores=True)  # one process serves every request: it may trade cores
    except (ValueError, OSError) as exc:
        raise protocol.BadCase(f"duet: {exc}") from None
    assert barrier is not None
    try:
        return engine.run(p, log, barrier=barrier)  # type: ignore[call-arg]
    finally:
        barrier.close()


def main(argv: list[str] | None = None) -> int:
    return protocol.run_workload("infer", handler, argv)


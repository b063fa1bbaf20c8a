"""The inference workload's case handler: parse the params, run the case's engine, judge.

Parameters: see params.InferParams; engines: see engines/__init__.py (the registry).

Verdict of a case (judge()):

* status "failed", error_class "oom"           - the max_model_len probe ran out of memory
* status "failed", error_class "garbled"       - the prefix_cache probe saw different tokens
                                                 with and without the reused prefix cache
* status "failed", error_class "degenerate"    - empty outputs, ids outside the vocabulary,
                                                 non-finite logits or long runs of one token
* status "failed", error_class "low_agreement" - token_agreement < min_token_agreement
                                                 (default 0.5: a broken model, not a small
                                                 regression; the gate compares the figures
                                                 with the previous release)
  When several apply, error_class is the first in that order and error lists them all.
* status "error": bad_case (invalid params), load_failed, crash, oom, timeout (protocol).

Standard library and qualify.workloads only (an engine imports torch and the rest).
"""

from __future__ import annotations

import logging
from typing import Any

from qualify.workloads import protocol
from qualify.workloads.infer.engines import get_engine
from qualify.workloads.infer.params import InferParams, parse_params

FAILURE_ORDER = ("oom", "crash", "garbled", "degenerate", "low_agreement")


def judge(p: InferParams, metrics: dict[str, Any], probes: dict[str, dict[str, Any]]
          ) -> tuple[str, str | None, str | None]:
    """(status, error_class, error) of a case that ran to the end."""
    failures: list[tuple[str, str]] = []
    mml = probes.get("max_model_len")
    if mml and mml.get("status") == "failed":
        failures.append((mml.get("error_class") or "oom", f"max_model_len probe: {mml.get('detail')}"))
    pc = probes.get("prefix_cache")
    if pc and pc.get("status") == "failed":
        failures.append(("garbled", f"prefix_cache probe: {pc.get('detail')}"))
    dg = probes.get("degenerate")
    if dg and dg.get("status") == "failed":
        failures.append(("degenerate", f"degenerate probe: {dg.get('detail')}"))
    agreement = metrics.get("token_agreement")
    if agreement is not None and agreement < p.min_token_agreement:
        failures.append(("low_agreement", f"token_agreement {agreement:.4f} < min_token_agreement "
                                          f"{p.min_token_agreement:g}"))
    if not failures:
        return "passed", None, None
    failures.sort(key=lambda f: FAILURE_ORDER.index(f[0]))
    return "failed", failures[0][0], "; ".join(f"{cls}: {msg}" for cls, msg in failures)


def handler(case: dict[str, Any], log: logging.Logger) -> dict[str, Any]:
    p = parse_params(case.get("params") or {})
    report = get_engine(p.engine).run(p, log)
    status, error_class, error = judge(p, report["metrics"], report["probes"])
    if error:
        log.error("%s", error)
    environment = protocol.environment_base()
    environment.update(report["environment"])
    return {"status": status, "error_class": error_class, "error": error, "metrics": report["metrics"],
            "samples": report["samples"], "probes": report["probes"], "environment": environment}


def main(argv: list[str] | None = None) -> int:
    return protocol.run_workload("infer", handler, argv)


"""Known-issue probes of the inference workload: pure judgement functions.

The release note's known issues become probes:

* prefix_cache  - "vLLM images may produce garbled output ... disable prefix caching":
                  the same greedy requests sharing a long prefix, computed with the
                  shared prefix's KV cache reused and fresh from scratch (in another
                  order), must give identical tokens. A divergence is forgiven only where
                  the fresh run's top-2 logit margin was below a tie tolerance (numerical
                  noise between two kernels, not garbling). Failure -> error_class garbled.
* max_model_len - "--max-model-len must be less than 80k, otherwise an OOM error": one
                  request at the configured maximum length must run. Failure -> oom.
* degenerate    - outputs that are empty, contain ids outside the vocabulary, come from
                  non-finite logits, or hold a run of one token longer than max_repeat_run.

The engines compute the token lists; these functions only judge them (plain Python).

A probe never changes its case's status (the case passes or fails on its own measurements):
each probe is reported as passed, failed, skipped or error, and the gate judges it as its own
check. A skip that an explicit setting asked for (prefix caching disabled) carries
"by_setting": true; any other skip has no such flag. A probe that raises is "error" with the
exception's text (run_probe).
"""

from __future__ import annotations

import logging
import traceback
from typing import Any, Callable, Mapping, Sequence


def probe(status: str, detail: str, **extra: Any) -> dict[str, Any]:
    return {"status": status, "detail": detail, **extra}


def skipped(detail: str, *, by_setting: bool = False) -> dict[str, Any]:
    """A probe that did not run; by_setting only when an explicit setting turned it off."""
    return probe("skipped", detail, by_setting=True) if by_setting else probe("skipped", detail)


def errored(exc: BaseException) -> dict[str, Any]:
    text = f"{type(exc).__name__}: {exc}"
    return probe("error", f"the probe raised {text[:500]}", error=text[:2000])


def run_probe(name: str, fn: Callable[[], dict[str, Any]], log: logging.Logger | None = None) -> dict[str, Any]:
    """fn()'s probe result, or status "error" with the exception text when it raises."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - a probe's error is reported, never the case's
        (log or logging.getLogger(__name__)).error("probe %s raised %s: %s\n%s", name, type(exc).__name__, exc,
                                                    traceback.format_exc(limit=6))
        return errored(exc)


ProbeStep = Callable[[], dict[str, Any]]


def run_requested(requested: Sequence[str], steps: Mapping[str, ProbeStep | dict[str, Any]],
                  log: logging.Logger | None = None) -> dict[str, dict[str, Any]]:
    """The engines' one probe dispatch: each requested probe that the engine offers, in the engine's order (a
    later probe may read what an earlier one produced), run through run_probe; a dict instead of a callable is
    an outcome decided up front (a skip). A probe is never a reason for the case's status."""
    results: dict[str, dict[str, Any]] = {}
    for name, step in steps.items():
        if name in requested:
            results[name] = step if isinstance(step, dict) else run_probe(name, step, log)
    return results


def longest_run(tokens: Sequence[int]) -> int:
    best = run = 0
    prev = None
    for tok in tokens:
        run = run + 1 if tok == prev else 1
        prev = tok
        best = max(best, run)
    return best


def check_degenerate(sequences: Sequence[Sequence[int]], vocab_size: int, max_repeat_run: int,
                     nonfinite_steps: int = 0) -> dict[str, Any]:
    """Judge generated token sequences (one per request)."""
    problems: list[str] = []
    empty = sum(1 for s in sequences if len(s) == 0)
    if not sequences:
        problems.append("no outputs at all")
    if empty:
        problems.append(f"{empty} empty output(s)")
    bad_ids = sorted({int(t) for s in sequences for t in s if not 0 <= int(t) < vocab_size})
    if bad_ids:
        problems.append(f"token ids outside the vocabulary [0, {vocab_size}): {bad_ids[:5]}")
    runs = [longest_run(s) for s in sequences]
    worst = max(runs, default=0)
    if worst > max_repeat_run:
        n = sum(1 for r in runs if r > max_repeat_run)
        problems.append(f"{n} output(s) repeat one token {worst} times in a row (bound {max_repeat_run})")
    if nonfinite_steps:
        problems.append(f"{nonfinite_steps} decode step(s) had non-finite logits")
    if problems:
        return probe("failed", "; ".join(problems), longest_run=worst)
    return probe("passed", f"{len(sequences)} outputs, longest run {worst} <= {max_repeat_run}, ids in vocabulary",
                 longest_run=worst)


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    if len(a) != len(b):
        return min(len(a), len(b))
    return None


def compare_prefix_runs(fresh: Sequence[Sequence[int]], cached: Sequence[Sequence[int]],
                        fresh_margins: Sequence[Sequence[float]] | None, tie_tol: float,
                        label: str = "") -> dict[str, Any]:
    """Judge the prefix-cache probe: request i computed fresh vs with the cached prefix."""
    if len(fresh) != len(cached):
        return probe("failed", f"{len(fresh)} fresh vs {len(cached)} cached outputs")
    garbled: list[str] = []
    ties = 0
    for i, (f, c) in enumerate(zip(fresh, cached)):
        pos = first_divergence(f, c)
        if pos is None:
            continue
        margin = None
        if fresh_margins is not None and pos < len(fresh_margins[i]):
            margin = fresh_margins[i][pos]
        if margin is not None and margin < tie_tol and len(f) == len(c):
            ties += 1  # a near tie flipped by kernel noise; later tokens legitimately differ
            continue
        garbled.append(f"request {i} diverges at output token {pos}"
                       + (f" (top-2 margin {margin:.3g} >= tie tolerance {tie_tol:g})" if margin is not None else ""))
    prefix = f"{label}: " if label else ""
    if garbled:
        return probe("failed", prefix + "garbled output with the prefix cache: " + "; ".join(garbled[:4]),
                     garbled_requests=len(garbled), tie_divergences=ties)
    return probe("passed", prefix + f"{len(fresh)} requests identical with and without the cached prefix"
                 + (f" ({ties} divergence(s) at near ties)" if ties else ""),
                 garbled_requests=0, tie_divergences=ties)

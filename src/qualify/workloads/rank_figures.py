"""A multi-rank (or multi-node) case's figures from every rank, not rank 0's (issue 24.7). Standard library only.

- memory: the worst rank (a memory threshold must see the rank that came closest to the limit);
- throughput: the world's. Every rank reports tokens/s of the whole world's step (tokens_per_step counts all
  ranks), timed by its own clock; synchronous data parallelism runs at the slowest rank's pace, so the world's
  figure is the smallest (and the step time the longest), and its MFU and TFLOP/s go with it;
- evidence (compiled graphs, checkpointed layers): checked on every rank, so the merged figure is the least a
  rank showed (a rank that ran eager makes the variant unproven).
Each figure's per-rank values are kept in the environment (`rank_figures`).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

WORST_METRICS = ("peak_memory_bytes", "setup_peak_memory_bytes")
SLOWEST_METRICS = ("tokens_per_s", "tokens_per_s_per_device", "tflops_per_device", "mfu")
LONGEST_METRICS = ("step_time_s_median", "step_time_s_p90", "first_step_time_s", "compile_time_s")
WORST_ENV = ("activation_memory_bytes", "activation_peak_bytes")
EVIDENCE_ENV = ("compile_graphs", "checkpointed_layers")


def _num(value: Any) -> float | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _pick(values: Mapping[str, Any], choose: Callable[..., Any], *, all_needed: bool) -> Any:
    present = [v for v in (_num(x) for x in values.values()) if v is not None]
    if not present or (all_needed and len(present) < len(values)):
        return None
    return choose(present)


def combine(docs: Mapping[Any, dict[str, Any]], base: dict[str, Any]) -> dict[str, Any]:
    """`base` (a copy of one rank's passed document) with its figures replaced by the world's, from `docs`
    (rank or node -> passed document). A figure no document reports is left as it is."""
    out = dict(base)
    metrics, env = dict(base.get("metrics") or {}), dict(base.get("environment") or {})
    table: dict[str, dict[str, Any]] = dict(env.get("rank_figures") or {})

    def merge(where: str, keys: tuple[str, ...], choose: Callable[..., Any], all_needed: bool) -> None:
        target = metrics if where == "metrics" else env
        for key in keys:
            values = {str(k): (d.get(where) or {}).get(key) for k, d in docs.items()}
            if all(v is None for v in values.values()):
                continue
            # A document merged over its own ranks already carries its ranks' values: keep the finest.
            per_rank: dict[str, Any] = {}
            for k, d in docs.items():
                inner = ((d.get("environment") or {}).get("rank_figures") or {}).get(key)
                per_rank.update(inner if isinstance(inner, dict) else {str(k): values[str(k)]})
            table[key] = per_rank
            target[key] = _pick(values, choose, all_needed=all_needed)

    merge("metrics", WORST_METRICS, max, all_needed=False)
    merge("metrics", SLOWEST_METRICS, min, all_needed=True)
    merge("metrics", LONGEST_METRICS, max, all_needed=True)
    merge("environment", WORST_ENV, max, all_needed=False)
    merge("environment", EVIDENCE_ENV, min, all_needed=True)
    slowest = min(docs, key=lambda k: _num((docs[k].get("metrics") or {}).get("tokens_per_s")) or float("inf"))
    if _num((docs[slowest].get("metrics") or {}).get("tokens_per_s")) is not None:
        out["samples"] = dict(docs[slowest].get("samples") or {})  # the series the world's figure comes from
        env["throughput_rank"] = str(slowest)
    env["rank_figures"] = table
    out["metrics"], out["environment"] = metrics, env
    return out

"""Noise of the training workload's throughput, the gate's A/A false-alarm rate, and compile/eager, in one run.

    python benchmarks/train_noise.py [--runs N] [--model tiny-llama] [--threads T]
                                     [--steps S --warmup W --repeats R] [--compile-runs M] [--dtype D]

Each run is one independent launch (a fresh process, as the executor starts it). Printed: the
launch-level CV (across launches) next to the within-launch CV (across the repeats of one launch),
and the gate's false-FAIL rate on A/A comparisons (the same code against itself) by its non-inferiority rule
(qualify.gate.stats.compare_history, max_regression 5%, alpha 0.05, no run-to-run part: all launches
here ran in one window): *repeats as units*, one launch against another with each launch's R repeats
as the units (what issue 12 removed); *launches as units*, 3 launches against 3 other launches. The A/A
comparisons are every ordered pair of launches and every ordered pair of disjoint 3-launch groups
(capped); they share launches, so the rates are estimates, not independent trials.

Runs the tiny preset's default case N times as subprocesses (exactly as the
executor does), interleaved with M runs of the same case with compile=true, and
prints: tokens/s of each run with its within-run CV (across repeats), the CV across
runs, and the compile/eager throughput ratio (medians of runs made in this same
window, so that machine load hits both alike). The load average before and after
each run is printed: the machine is shared. Last line: a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from qualify.gate import stats  # noqa: E402
from qualify.workloads import protocol  # noqa: E402


def cv(xs: list[float]) -> float | None:
    return statistics.stdev(xs) / statistics.fmean(xs) if len(xs) > 1 else None


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def run_once(params: dict, timeout: float) -> dict:
    case = protocol.make_case("bench/train-noise", "train", params)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump(case, fh)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"), env.get("PYTHONPATH")]))
    try:
        out = subprocess.run([sys.executable, "-m", "qualify.workloads.train", "--case", fh.name],
                             capture_output=True, text=True, timeout=timeout, env=env)
    finally:
        os.unlink(fh.name)
    return protocol.parse_result_output(out.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=12, help="eager launches of the default case")
    ap.add_argument("--compile-runs", type=int, default=0, help="compile=true launches (0: none)")
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--threads", type=int, help="num_threads (default: the workload's default)")
    ap.add_argument("--steps", type=int, help="override the default steps per repeat")
    ap.add_argument("--warmup", type=int, help="override the default warm-up steps")
    ap.add_argument("--repeats", type=int, help="override the default repeats")
    ap.add_argument("--dtype", choices=("bf16", "fp32"), help="override the default dtype (bf16 is emulated on "
                    "CPUs without bf16 matmuls: slow)")
    ap.add_argument("--timeout", type=float, default=900)
    args = ap.parse_args()

    base: dict = {"model": args.model}
    for key, value in (("num_threads", args.threads), ("steps", args.steps),
                       ("warmup_steps", args.warmup), ("repeats", args.repeats), ("dtype", args.dtype)):
        if value is not None:
            base[key] = value
    # Spread the compile runs evenly through the eager ones.
    after = {round((i + 1) * args.runs / (args.compile_runs + 1)) for i in range(args.compile_runs)}
    plan = []
    for k in range(args.runs + 1):
        if k:
            plan.append("eager")
        plan += ["compile"] * (k in after)
    plan += ["compile"] * (args.compile_runs - plan.count("compile"))
    print(f"case params: {json.dumps(base)}; plan: {' '.join(plan)}; cores {os.cpu_count()}, "
          f"affinity {len(os.sched_getaffinity(0))}")
    print(f"{'run':>3} {'variant':8} {'tokens/s':>10} {'cv in run':>9} {'step p10..p90 s':>17} "
          f"{'compile s':>9} {'threads':>7} {'load before':>12} {'load after':>11}")
    results: dict[str, list[dict]] = {"eager": [], "compile": []}
    t0 = time.monotonic()
    for i, variant in enumerate(plan):
        load_before = os.getloadavg()[0]
        doc = run_once({**base, "compile": variant == "compile"}, args.timeout)
        load_after = os.getloadavg()[0]
        m = doc.get("metrics") or {}
        if doc.get("status") != "passed":
            print(f"{i:>3} {variant:8} {doc.get('status')} {doc.get('error_class')}: {doc.get('error')}")
            continue
        row = {"tokens_per_s": m["tokens_per_s"], "cv": m.get("cv_tokens_per_s"),
               "repeats": list((doc.get("samples") or {}).get("tokens_per_s") or []),
               "load_before": load_before, "load_after": load_after,
               "threads": (doc.get("environment") or {}).get("threads")}
        results[variant].append(row)
        print(f"{i:>3} {variant:8} {m['tokens_per_s']:>10.1f} {pct(m.get('cv_tokens_per_s')):>9} "
              f"{m['step_time_s_p10']:>8.4f}..{m['step_time_s_p90']:<8.4f} "
              f"{m.get('compile_time_s') or 0:>9.2f} {row['threads']:>7} {load_before:>12.2f} "
              f"{load_after:>11.2f}")
    eager = [r["tokens_per_s"] for r in results["eager"]]
    comp = [r["tokens_per_s"] for r in results["compile"]]
    within = [r["cv"] for r in results["eager"] if r["cv"] is not None]
    summary = {
        "model": args.model, "params": base, "runs": len(eager),
        "eager_tokens_per_s_median": statistics.median(eager) if eager else None,
        "cv_across_runs": cv(eager),
        "cv_within_run_median": statistics.median(within) if within else None,
        "cv_within_run_max": max(within) if within else None,
        "compile_tokens_per_s_median": statistics.median(comp) if comp else None,
        "compile_over_eager": (statistics.median(comp) / statistics.median(eager)
                               if comp and eager else None),
        "load_avg_min": min((r["load_before"] for v in results.values() for r in v), default=None),
        "load_avg_max": max((r["load_after"] for v in results.values() for r in v), default=None),
        "wall_s": time.monotonic() - t0,
    }
    print(f"eager tokens/s median {summary['eager_tokens_per_s_median']}, "
          f"CV across runs {pct(summary['cv_across_runs'])}, CV within runs median "
          f"{pct(summary['cv_within_run_median'])} (max {pct(summary['cv_within_run_max'])}); "
          f"compile/eager {summary['compile_over_eager']}; load {summary['load_avg_min']}.."
          f"{summary['load_avg_max']}")
    summary.update(false_alarms(results["eager"]))
    print(f"A/A false FAILs (non-inferiority rule): repeats as units (one launch, its "
          f"{base.get('repeats', 'default')} repeats) {summary['aa_before_flagged']}/{summary['aa_before_pairs']} = "
          f"{pct(summary['aa_before_rate'])}; launches as units (3 a side) "
          f"{summary['aa_after_flagged']}/{summary['aa_after_pairs']} = {pct(summary['aa_after_rate'])}")
    print(json.dumps(summary))
    return 0


def false_alarms(rows: list[dict], group: int = 3, cap: int = 5000) -> dict:
    """The gate's A/A false FAILs on these launches, with a launch's repeats or the launches as the units."""
    import itertools
    import random

    from qualify.gate.noninferiority import Decision, RunVariation

    def fails(cand: list[float], base: list[float]) -> bool:
        n = len(cand)
        return stats.compare_history(cand, base, "higher", variation=RunVariation(0.0, 1e9), max_regression=0.05,
                                     alpha=0.05, min_samples=min(n, 20), max_launches=min(n, 20)
                                     ).decision is Decision.FAIL

    before = [(a, b) for a, b in itertools.permutations(range(len(rows)), 2)]
    flagged_before = sum(fails(rows[a]["repeats"], rows[b]["repeats"]) for a, b in before)
    figures = [r["tokens_per_s"] for r in rows]
    pairs = [(a, b) for a in itertools.combinations(range(len(rows)), group)
             for b in itertools.combinations(range(len(rows)), group) if not set(a) & set(b)]
    random.Random(0).shuffle(pairs)
    pairs = pairs[:cap]
    flagged_after = sum(fails([figures[i] for i in b], [figures[i] for i in a]) for a, b in pairs)
    return {"aa_before_pairs": len(before), "aa_before_flagged": flagged_before,
            "aa_before_rate": flagged_before / len(before) if before else None,
            "aa_after_pairs": len(pairs), "aa_after_flagged": flagged_after,
            "aa_after_rate": flagged_after / len(pairs) if pairs else None}


if __name__ == "__main__":
    sys.exit(main())

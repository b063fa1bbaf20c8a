"""Set-up together, measurement in turn (issue 27): what it saves, and whether it moves the figures.

    .venv/bin/python benchmarks/setup_overlap.py [--manifest releases/cpu-smoke.yaml] [--case train/tiny-llama/base]
                                                  [--reps 8] [--overlap 2,3]

Runs one case's launches (the local executor, no Ray or Prefect: the launch runner itself) with set-up overlap and
without it, interleaved (A B B A ...: a drift of the machine falls on both), and prints per mode the case's wall
seconds (median), its measurement efficiency (timed seconds over the wall), and the throughput of every launch.
The last line is the bias check: the ratio of the two modes' median launch throughput with a 95% interval from the
per-repetition ratios (a t interval on their logs). An interval that excludes 1 would mean that parking a launch at
its gate and measuring it after the others' set-up changes what it measures.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def case_document(manifest: Path, case_id: str) -> dict[str, Any]:
    from qualify.manifest.cases import expand
    from qualify.manifest.load import load_manifest

    for case in expand(load_manifest(manifest).release):
        if case.case_id == case_id:
            return case.document()
    raise SystemExit(f"no case {case_id} in {manifest}")


def run_case(doc: dict[str, Any], overlap: int) -> tuple[float, float, list[float], str]:
    from qualify.execution import launches, setup_overlap
    from qualify.executors.local import LocalExecutor

    executor = LocalExecutor()
    doc = {k: v for k, v in doc.items() if k != "setup_overlap"}
    if overlap > 1:
        doc["setup_overlap"] = overlap

    def one(d: dict[str, Any]) -> tuple[dict[str, Any], float]:
        outcome = executor.run(d, timeout_s=setup_overlap.launch_timeout(d, float(d.get("timeout_s") or 900)))
        return outcome.doc, outcome.exec_s

    start = time.monotonic()
    merged, _docs = launches.run_launches(doc, one)
    wall = time.monotonic() - start
    if merged.get("status") != "passed":
        raise SystemExit(f"the case did not pass: {merged.get('error')}")
    metric = "tokens_per_s" if doc["kind"] == "train" else "output_tokens_per_s"
    measure = (merged["environment"].get("phases") or {}).get("measure", 0.0)
    return wall, measure, list(merged["samples"][f"per_launch.{metric}"]), metric


def t95(df: int) -> float:
    from scipy.stats import t

    return float(t.ppf(0.975, df))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--manifest", type=Path, default=REPO / "releases" / "cpu-smoke.yaml")
    ap.add_argument("--case", default="train/tiny-llama/base")
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--overlap", default="2", help="comma-separated batch sizes to compare with sequential launches")
    args = ap.parse_args()
    doc = case_document(args.manifest, args.case)
    modes = {"sequential": 1, **{f"overlap {n}": int(n) for n in args.overlap.split(",")}}
    walls: dict[str, list[float]] = {m: [] for m in modes}
    measures: dict[str, list[float]] = {m: [] for m in modes}
    rates: dict[str, list[list[float]]] = {m: [] for m in modes}
    metric = ""
    for rep in range(args.reps):
        order = list(modes) if rep % 2 == 0 else list(reversed(modes))
        for mode in order:
            wall, measure, per_launch, metric = run_case(doc, modes[mode])
            walls[mode].append(wall)
            measures[mode].append(measure)
            rates[mode].append(per_launch)
            print(f"rep {rep + 1} {mode:<10} wall {wall:6.1f} s  measure {measure:5.2f} s  {metric} "
                  + " ".join(f"{r:.0f}" for r in per_launch), flush=True)
    seq = "sequential"
    for mode in modes:
        w = statistics.median(walls[mode])
        print(f"{mode}: case wall median {w:.1f} s, measurement efficiency {statistics.median(measures[mode]) / w:.2f}, "
              f"{metric} median {statistics.median([r for rs in rates[mode] for r in rs]):.0f}")
    for ovl in [m for m in modes if m != seq]:
        logs = [math.log(statistics.median(o) / statistics.median(s)) for s, o in zip(rates[seq], rates[ovl])]
        mean = statistics.fmean(logs)
        half = t95(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs)) if len(logs) > 1 else float("inf")
        print(f"{args.case} {ovl}: wall {statistics.median(walls[ovl]):.1f} s vs {statistics.median(walls[seq]):.1f} s "
              f"sequential (x{statistics.median(walls[ovl]) / statistics.median(walls[seq]):.2f}); {metric} "
              f"{ovl} / sequential {math.exp(mean):.3f} [95% {math.exp(mean - half):.3f}, {math.exp(mean + half):.3f}] "
              f"over {len(logs)} repetitions")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Throughput and agreement of every torchao scheme on a CPU preset, in one run.

    .venv/bin/python benchmarks/infer_schemes.py [--model tiny-qwen3] [--threads 1] [--rounds 2]

Runs the real workload (`python -m qualify.workloads.infer`, transformers engine) once
per scheme and round, rounds interleaved (none, w8a16, w8a8, w4a16, none, ...) so that
machine noise hits every scheme alike; prints output tokens/s (median over all repeats
of all rounds, with the spread) and its ratio to the unquantized reference, and the
agreement figures (token agreement, top-k overlap, KL(ref || quant), perplexity delta),
which are deterministic. Throughput on 2 shared cores varies by about +-20% between
identical runs (MACHINE-NOTES): read the ratios, not the absolute figures. Each round is one
independent launch per scheme: the table gives the launch-level CV (of the launches' own figures,
what the gate tests) next to the within-launch CV (of one launch's repeats, median over launches).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from qualify.workloads import protocol  # noqa: E402
from qualify.workloads.infer.params import TORCHAO_SCHEMES as SCHEMES  # noqa: E402


def run_case(params: dict) -> dict:
    case = protocol.make_case(f"bench/infer/{params['model']}/{params['scheme']}", "infer", params)
    proc = subprocess.run([sys.executable, "-m", "qualify.workloads.infer"], input=json.dumps(case),
                          capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    doc = protocol.parse_result_output(proc.stdout)
    if doc["status"] != "passed":
        raise SystemExit(f"{params['scheme']}: {doc['status']} {doc['error_class']}: {doc['error']}")
    return doc


def cv(values: list[float]) -> float | None:
    return statistics.stdev(values) / statistics.fmean(values) if len(values) > 1 else None


def fmt(x, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-qwen3")
    ap.add_argument("--schemes", default=",".join(SCHEMES))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args(argv)
    schemes = args.schemes.split(",")

    rates: dict[str, list[float]] = {s: [] for s in schemes}
    per_launch: dict[str, list[float]] = {s: [] for s in schemes}
    within: dict[str, list[float]] = {s: [] for s in schemes}
    last: dict[str, dict] = {}
    for rnd in range(args.rounds):
        for scheme in schemes:
            doc = run_case({"model": args.model, "scheme": scheme, "num_threads": args.threads,
                            "repeats": args.repeats, "num_prompts": args.num_prompts,
                            "max_new_tokens": args.max_new_tokens, "probes": []})
            rates[scheme] += doc["samples"]["output_tokens_per_s"]
            per_launch[scheme].append(doc["metrics"]["output_tokens_per_s"])
            if len(doc["samples"]["output_tokens_per_s"]) > 1:
                within[scheme].append(cv(doc["samples"]["output_tokens_per_s"]))
            last[scheme] = doc
            print(f"round {rnd + 1}/{args.rounds} {scheme}: {doc['metrics']['output_tokens_per_s']:.1f} tok/s",
                  file=sys.stderr)

    ref_rate = statistics.median(rates["none"]) if rates.get("none") else None
    env = next(iter(last.values()))["environment"]
    print(f"model {args.model} | {env['device_name']} | threads {args.threads} | torch {env['torch']} | "
          f"torchao {env['torchao']} | transformers {env['transformers']} | rounds {args.rounds} x repeats "
          f"{args.repeats} x {args.num_prompts} prompts x {args.max_new_tokens} new tokens")
    header = (f"{'scheme':7} {'tok/s':>7} {'spread':>7} {'cv lau':>7} {'cv in':>6} {'x ref':>6} {'tpot ms':>8} {'agree':>7} {'top5':>7} "
              f"{'KL':>9} {'ppl':>7} {'dppl':>8} {'MB':>6} {'x ref':>6}")
    print(header)
    print("-" * len(header))
    table = {}
    for scheme in schemes:
        m = last[scheme]["metrics"]
        med = statistics.median(rates[scheme])
        spread = (max(rates[scheme]) - min(rates[scheme])) / med
        row = {
            "output_tokens_per_s": med, "spread": spread,
            "cv_between_launches": cv(per_launch[scheme]),
            "cv_within_launch": statistics.median(within[scheme]) if within[scheme] else None,
            "throughput_ratio": med / ref_rate if ref_rate else None,
            "tpot_s_p50": m["tpot_s_p50"], "token_agreement": m["token_agreement"],
            "topk_overlap": m["topk_overlap"], "kl_div_mean": m["kl_div_mean"], "perplexity": m["perplexity"],
            "perplexity_delta": m["perplexity_delta"], "weight_bytes": m["weight_bytes"],
            "weight_ratio": m["weight_bytes"] / m["weight_bytes_ref"],
        }
        table[scheme] = row
        print(f"{scheme:7} {med:7.1f} {spread:7.0%} {fmt(row['cv_between_launches'], '7.1%')} "
              f"{fmt(row['cv_within_launch'], '6.1%')} {fmt(row['throughput_ratio'], '6.2f')} "
              f"{row['tpot_s_p50'] * 1e3:8.2f} {row['token_agreement']:7.4f} {row['topk_overlap']:7.4f} "
              f"{row['kl_div_mean']:9.2e} {row['perplexity']:7.4f} {row['perplexity_delta']:+8.4f} "
              f"{row['weight_bytes'] / 2**20:6.2f} {row['weight_ratio']:6.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "environment": env, "schemes": table}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Error rates of the agreement check (qualify.gate.agreement) with within-sequence correlation, by simulation.

    PYTHONPATH=src .venv/bin/python benchmarks/agreement_coverage.py [--reps 2000] [--seed 1]

Data as the workload reports it: m sequences of n positions (default 160 x 64 = 10,240, the smoke's), each
position's flag "the quantized model's argmax agrees with the reference's". Two ways of making positions of
one sequence depend on each other:
  * beta:   each sequence has its own agreement rate, Beta-distributed around p with intra-sequence
            correlation rho (rho 0: independent positions);
  * bursts: disagreements come in runs: a two-state Markov chain along the sequence with stationary
            disagreement 1 - p and a disagreement followed by another with probability `stick`.

Printed, per scenario:
  1. minimum check at the boundary (true agreement = the minimum): the false-PASS rate (should be <= alpha
     = 5%), for the sequence-level interval and, for contrast, for the same Wilson interval treating the
     positions as independent;
  2. the PASS / FAIL / INCOMPLETE shares when the truth is 1 point above / below the minimum, at 10,240
     positions and at the 256 positions of the old smoke (4 x 64);
  3. paired comparison with the previous release (clustered McNemar, margin 1 point): false-PASS at a true
     drop of exactly the margin, PASS rate with no change, FAIL rate at a 3-point drop.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from qualify.gate import agreement as ag  # noqa: E402


def flags_beta(rng: np.random.Generator, p: float, rho: float, m: int, n: int) -> np.ndarray:
    """m x n agreement flags; per-sequence rates Beta(p k, (1-p) k), k = 1/rho - 1 (rho 0: all p)."""
    if rho <= 0:
        rates = np.full(m, p)
    else:
        k = 1 / rho - 1
        rates = rng.beta(p * k, (1 - p) * k, size=m)
    return rng.random((m, n)) < rates[:, None]


def flags_bursts(rng: np.random.Generator, p: float, stick: float, m: int, n: int) -> np.ndarray:
    """m x n flags from a two-state chain: P(wrong | wrong) = stick, stationary P(wrong) = 1 - p."""
    q = 1 - p
    enter = q * (1 - stick) / p  # P(wrong | right), so that the stationary share of wrong is q
    wrong = np.empty((m, n), dtype=bool)
    wrong[:, 0] = rng.random(m) < q
    u = rng.random((m, n))
    for t in range(1, n):
        wrong[:, t] = np.where(wrong[:, t - 1], u[:, t] < stick, u[:, t] < enter)
    return ~wrong


def make(rng, kind: str, p: float, dep: float, m: int, n: int) -> np.ndarray:
    return flags_beta(rng, p, dep, m, n) if kind == "beta" else flags_bursts(rng, p, dep, m, n)


def naive_decision(flags: np.ndarray, minimum: float) -> ag.Call:
    """The same Wilson interval with every position an independent trial (what the check must not do)."""
    iv = ag.interval_for_agreement([int(x) for x in flags.reshape(-1)], [1] * flags.size)  # a "sequence" each
    return ag.decide_against_minimum(iv, minimum)


def minimum_rates(rng, kind: str, p: float, dep: float, minimum: float, m: int, n: int, reps: int,
                  naive: bool = False) -> dict[str, float]:
    calls = {c: 0 for c in ag.Call}
    naive_pass = 0
    for _ in range(reps):
        f = make(rng, kind, p, dep, m, n)
        iv = ag.interval_for_agreement(f.sum(1).tolist(), [n] * m)
        calls[ag.decide_against_minimum(iv, minimum)] += 1
        if naive:
            naive_pass += naive_decision(f, minimum) is ag.Call.PASS
    out = {c.value: calls[c] / reps for c in ag.Call}
    if naive:
        out["naive_PASS"] = naive_pass / reps
    return out


def paired_rates(rng, kind: str, p_base: float, drop: float, dep: float, margin: float, m: int, n: int,
                 reps: int) -> dict[str, float]:
    """The candidate keeps the baseline's flags except that a share of its agreeing positions (clustered as the
    data are) turns wrong, and a smaller share of its wrong ones turns right: net change -drop."""
    gain = 0.002  # some positions get better (real kernels move both ways)
    calls = {c: 0 for c in ag.Call}
    for _ in range(reps):
        base = make(rng, kind, p_base, dep, m, n)
        lose_share = (drop + gain * (1 - p_base)) / p_base
        lose = make(rng, kind, 1 - lose_share, dep, m, n) == 0  # clustered "turns wrong" marks
        fix = rng.random((m, n)) < gain
        cand = base.copy()
        cand[base & lose] = False
        cand[~base & fix] = True
        cmp = ag.compare_paired(cand.tolist(), base.tolist())
        calls[cmp.decide(margin)] += 1
    return {c.value: calls[c] / reps for c in ag.Call}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sequences", type=int, default=160)
    ap.add_argument("--length", type=int, default=64)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    m, n, reps = args.sequences, args.length, args.reps
    print(f"# {m} sequences x {n} positions = {m * n:,}; {reps} simulated results per row; alpha {ag.ALPHA} one-sided")
    print("\n## 1. minimum check at the boundary (true agreement = minimum): false-PASS rate")
    print(f"{'data':8} {'dependence':>10} {'minimum':>8} {'PASS':>7} {'INCOMPLETE':>11} {'FAIL':>7} {'naive PASS':>11}")
    for kind, deps in (("beta", (0.0, 0.02, 0.1, 0.3)), ("bursts", (0.3, 0.7))):
        for dep in deps:
            for minimum in (0.99, 0.9):
                r = minimum_rates(rng, kind, minimum, dep, minimum, m, n, reps, naive=True)
                print(f"{kind:8} {dep:10.2f} {minimum:8.2f} {r['PASS']:7.3f} {r['UNDECIDED']:11.3f} {r['FAIL']:7.3f} "
                      f"{r['naive_PASS']:11.3f}")
    print("\n## 2. one point either side of the minimum 0.99 (beta, rho 0.02)")
    print(f"{'positions':>9} {'truth':>6} {'PASS':>7} {'INCOMPLETE':>11} {'FAIL':>7}")
    for mm in (m, 4):
        for truth in (0.999, 0.98):
            r = minimum_rates(rng, "beta", truth, 0.02, 0.99, mm, n, reps)
            print(f"{mm * n:9,} {truth:6.3f} {r['PASS']:7.3f} {r['UNDECIDED']:11.3f} {r['FAIL']:7.3f}")
    print("\n## 3. paired with the previous release (baseline agreement 0.97, margin 1 point)")
    print(f"{'data':8} {'dependence':>10} {'true drop':>9} {'PASS':>7} {'INCOMPLETE':>11} {'FAIL':>7}")
    paired_reps = max(50, reps // 4)
    for kind, dep in (("beta", 0.0), ("beta", 0.1), ("bursts", 0.7)):
        for drop in (0.0, 0.01, 0.03):
            r = paired_rates(rng, kind, 0.97, drop, dep, 0.01, m, n, paired_reps)
            print(f"{kind:8} {dep:10.2f} {drop:9.3f} {r['PASS']:7.3f} {r['UNDECIDED']:11.3f} {r['FAIL']:7.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

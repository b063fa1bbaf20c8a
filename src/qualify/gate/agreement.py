"""Statistics of the agreement check: a sequence-level interval for token agreement, and the paired
(per-position) comparison of a candidate's agreement with the previous release's.

Why sequences: the positions of one evaluation sequence share their context (the same text, the same
model state), so their agreement flags are correlated; treating 10,000 positions of 160 sequences as
10,000 independent trials understates the uncertainty by the design effect (measured here: 1.0-1.6 on
the tiny presets, far more for a kernel that breaks whole sequences). The sequence is the sampling unit.

Interval for the agreement p (interval_for_agreement):
  * p = sum(a_i) / sum(n_i) over sequences i (a_i agreeing positions of n_i): a ratio estimator;
  * its cluster-robust (linearization) variance v = m / (m - 1) * sum((a_i - p n_i)^2) / N^2
    (Cochran, Sampling Techniques, 3rd ed. 1977, section 6.4; m sequences, N positions);
  * the Kish design effect d = v / (p (1 - p) / N), truncated below at 1 (Korn & Graubard 1998,
    "Confidence intervals for proportions with small expected number of positive counts estimated from
    survey data", Survey Methodology 24:193-201), gives the effective sample size N / d;
  * the Wilson score interval (Wilson 1927, JASA 22:209-212) at that effective size, with the
    t quantile on m - 1 degrees of freedom in place of z: the combination Dean & Pagano (2015,
    "Evaluating confidence interval methods for binomial proportions in clustered surveys", J. Survey
    Stat. Methodol. 3:484-503) found to hold its coverage for clustered binary data. Wilson, unlike the
    plain Wald interval, stays honest at p = 1 (all positions agree: the bound is N/(N + t^2), not 1).
  One-sided confidence 1 - alpha at each end (alpha 0.05: the two ends form a 90% interval).

Decision (decide_against_minimum), the rule every gate comparison follows: PASS only when the lower
bound clears the minimum, FAIL when the upper bound is below it, else INCOMPLETE (undecided is never PASS).

Paired comparison with the previous release (compare_paired), the same positions on both sides:
  * per sequence, d_i = (positions only the candidate agrees on) - (positions only the baseline agrees
    on), the discordant counts of McNemar's table; D = sum(d_i) / N is the change in agreement;
  * the clustered McNemar statistic of Durkalski, Palesch, Lipsitz & Rust (2003, "Analysis of clustered
    matched-pair data", Statistics in Medicine 22:2417-2428), X = sum(d_i) / sqrt(sum(d_i^2)),
    one-sided p = Phi(X) for a drop (reported);
  * the decision rests on the interval D +- t_{m-1} * SE, SE^2 the larger of the cluster-robust
    variance m / (m - 1) * sum((d_i - D n_i)^2) / N^2 and the independent-positions variance of the
    Agresti-Min adjusted table (Agresti & Min 2005, "Simple improved confidence intervals for comparing
    matched proportions", Statistics in Medicine 24:729-740: half a count added to each cell, so that
    no discordance at all still leaves an interval): PASS when D's lower bound is >= -max_drop
    (non-inferiority shown), FAIL when its upper bound is below -max_drop, else INCOMPLETE.

benchmarks/agreement_coverage.py simulates both under within-sequence correlation; tests/unit/
test_gate_agreement.py pins the formulas. Measured (160 x 64 positions, 1,000 results a row), false-PASS at a
true agreement equal to the minimum: 3.4-5.0% with independent positions or intra-sequence correlation 0.02
or disagreements in short bursts; 5-7% at correlation 0.1 or long bursts; 12% at 0.99 with correlation 0.3
(per-sequence rates Beta(2.3, 0.02): nearly all sequences perfect, a rare one badly off, which 160 sequences
often miss entirely). Counting positions as independent: 12-39% in the same correlated settings. The paired
check: no change PASSes always, a 3-point drop FAILs always, a drop of exactly the margin PASSes 2.4% (independent),
7% (bursts) and 14% (correlation 0.1) of the time. A skewness correction (Johnson 1978) and Clopper-Pearson
in place of Wilson were tried and moved these by under a point.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Sequence

from qualify.gate.quantiles import normal_cdf, t_quantile


ALPHA = 0.05  # one-sided, at each end of an interval


class Call(StrEnum):
    PASS = "PASS"
    FAIL = "FAIL"
    UNDECIDED = "UNDECIDED"


@dataclass(frozen=True)
class AgreementInterval:
    """Token agreement over m sequences (N positions) with its one-sided bounds at 1 - alpha each."""

    value: float
    low: float
    high: float
    sequences: int
    positions: int
    design_effect: float
    alpha: float

    @property
    def confidence(self) -> float:
        """The two-sided confidence of [low, high]."""
        return 1 - 2 * self.alpha

    def figures(self) -> dict[str, float | int]:
        return {"value": self.value, "low": self.low, "high": self.high, "sequences": self.sequences,
                "positions": self.positions, "design_effect": self.design_effect, "confidence": self.confidence,
                "method": "wilson_effective_n_clustered"}


def _check_counts(agree: Sequence[float], positions: Sequence[float]) -> None:
    if len(agree) != len(positions):
        raise ValueError(f"{len(agree)} agreement counts for {len(positions)} sequences")
    for a, n in zip(agree, positions):
        if not (0 <= a <= n) or n <= 0:
            raise ValueError(f"a sequence with {a} agreeing of {n} positions")


def interval_for_agreement(agree: Sequence[float], positions: Sequence[float],
                           alpha: float = ALPHA) -> AgreementInterval | None:
    """The sequence-level interval (module docstring); None with fewer than 2 sequences (no variance)."""
    _check_counts(agree, positions)
    m = len(agree)
    if m < 2:
        return None
    total = float(sum(positions))
    p = float(sum(agree)) / total
    v_cluster = m / (m - 1) * sum((a - p * n) ** 2 for a, n in zip(agree, positions)) / total ** 2
    v_srs = p * (1 - p) / total
    deff = max(1.0, v_cluster / v_srs) if v_srs > 0 else 1.0
    n_eff = total / deff
    t = t_quantile(1 - alpha, m - 1)
    denom = 1 + t * t / n_eff
    centre = (p + t * t / (2 * n_eff)) / denom
    half = t / denom * math.sqrt(p * (1 - p) / n_eff + t * t / (4 * n_eff * n_eff))
    return AgreementInterval(p, max(0.0, centre - half), min(1.0, centre + half), m, int(total), deff, alpha)


def decide_against_minimum(interval: AgreementInterval, minimum: float) -> Call:
    if interval.low >= minimum:
        return Call.PASS
    if interval.high < minimum:
        return Call.FAIL
    return Call.UNDECIDED


def sequences_to_decide(interval: AgreementInterval, minimum: float) -> int | None:
    """About how many sequences of the same size and spread would put the minimum outside the interval
    (the half-width shrinks as 1/sqrt(m)); None when the agreement sits on the minimum."""
    gap = abs(interval.value - minimum)
    half = (interval.high - interval.low) / 2
    if gap <= 0 or half <= 0:
        return None
    return max(interval.sequences + 1, math.ceil(interval.sequences * (half / gap) ** 2))


@dataclass(frozen=True)
class PairedComparison:
    """The candidate's agreement minus the baseline's on the same positions, with its one-sided bounds."""

    change: float
    low: float
    high: float
    candidate: float
    baseline: float
    only_candidate: int  # positions where only the candidate agrees with its reference
    only_baseline: int  # positions where only the baseline agrees with its reference
    sequences: int
    positions: int
    mcnemar_z: float | None
    p_drop: float | None  # one-sided p of the clustered McNemar test for a drop
    alpha: float

    def decide(self, max_drop: float) -> Call:
        if self.low >= -max_drop:
            return Call.PASS
        if self.high < -max_drop:
            return Call.FAIL
        return Call.UNDECIDED

    def figures(self) -> dict[str, float | int | None]:
        return {"change": self.change, "change_low": self.low, "change_high": self.high,
                "candidate": self.candidate, "baseline": self.baseline, "only_candidate": self.only_candidate,
                "only_baseline": self.only_baseline, "sequences": self.sequences, "positions": self.positions,
                "mcnemar_z": self.mcnemar_z, "p_drop": self.p_drop, "confidence": 1 - 2 * self.alpha,
                "method": "clustered_mcnemar"}


def compare_paired(candidate: Sequence[Sequence[bool]], baseline: Sequence[Sequence[bool]],
                   alpha: float = ALPHA) -> PairedComparison | None:
    """Position by position, sequence by sequence (module docstring); None with fewer than 2 sequences.
    ValueError when the two sides do not hold the same positions."""
    if len(candidate) != len(baseline):
        raise ValueError(f"{len(candidate)} candidate sequences vs {len(baseline)} baseline sequences")
    d: list[int] = []
    n: list[int] = []
    only_c = only_b = agree_c = agree_b = 0
    for i, (c_seq, b_seq) in enumerate(zip(candidate, baseline)):
        if len(c_seq) != len(b_seq):
            raise ValueError(f"sequence {i}: {len(c_seq)} candidate positions vs {len(b_seq)} baseline positions")
        c10 = sum(1 for c, b in zip(c_seq, b_seq) if c and not b)
        c01 = sum(1 for c, b in zip(c_seq, b_seq) if b and not c)
        only_c += c10
        only_b += c01
        agree_c += sum(1 for c in c_seq if c)
        agree_b += sum(1 for b in b_seq if b)
        if len(c_seq):
            d.append(c10 - c01)
            n.append(len(c_seq))
    m = len(d)
    if m < 2:
        return None
    total = float(sum(n))
    change = sum(d) / total
    v_cluster = m / (m - 1) * sum((di - change * ni) ** 2 for di, ni in zip(d, n)) / total ** 2
    # Agresti-Min: half a count in each of the four cells (N + 2 pairs, b + 1/2 and c + 1/2 discordant).
    n_adj = total + 2
    change_adj = (only_c - only_b) / n_adj
    v_independent = ((only_c + only_b + 1) / n_adj - change_adj ** 2) / n_adj
    se = math.sqrt(max(v_cluster, v_independent))
    t = t_quantile(1 - alpha, m - 1)
    ss = sum(di * di for di in d)
    z = sum(d) / math.sqrt(ss) if ss > 0 else None
    return PairedComparison(change, change - t * se, change + t * se, agree_c / total, agree_b / total,
                            only_c, only_b, m, int(total), z,
                            normal_cdf(z) if z is not None else None, alpha)

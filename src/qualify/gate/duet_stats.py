"""The duet comparison (gate.regression.baseline: duet): an interval of the candidate's relative change.

Data. Launch pair i ran both sides at once, each on its own cores, step k of both started together. Each
timed step gives one observation r_ik = log(t_candidate,k / t_baseline,k) (positive: the candidate is slower).
The candidate ran on side s_i (0 or 1, cores or devices); the sides swap between launch pairs.

Model (a linear mixed model with a random intercept per launch pair):

    r_ik = delta + beta * x_i + u_i + e_ik,   x_i = +1 when the candidate had side 0, -1 when it had side 1

* delta: the candidate's effect (what the gate judges);
* beta: half the A/A bias of the node (side 0's cores/devices against side 1's): never assumed zero, it is
  estimated from the swaps and removed from delta, and reported (its interval too) as the calibration;
* u_i ~ N(0, s_b^2): everything one launch pair shares and the next one does not (process start, memory
  placement, which cores were busy, clocks): the launch pair is the block;
* e_ik: the step's own noise.

Why not count the steps: the steps of one pair share u_i, so 50 steps of one pair are not 50 independent
samples; a process-level effect would pass for a precisely measured regression (tests/unit/test_duet_stats.py
simulates exactly that). The inference therefore runs on one summary per block, m_i = the median of the pair's
r_ik (robust to a step hit by an interrupt on one side only). For this design (one fixed effect per block and a
random block intercept) the mixed model's REML estimate of (delta, beta) is the least-squares fit of m_i on
x_i, with n - 2 degrees of freedom for the block-level variance (s_b^2 plus the step noise averaged within the
block); with unequal step counts per pair it is the same fit on the medians. So delta-hat is the mean of the
two side groups' means (balanced whatever the group sizes), and its interval is Student's t with n - 2 df.

Why not a block bootstrap: with the 4-8 launch pairs a case gets, the percentile bootstrap of a mean of n
blocks is too narrow (it ignores the t tail and shrinks the spread by sqrt((n-1)/n)); its coverage at n = 4 is
well under the nominal level (the simulation in the tests shows it), which would make the gate PASS what it
cannot see. The t interval on block summaries keeps its level for normal block effects and is wide when it
must be.

The interval is two-sided at 1 - 2*alpha, so that each end is a one-sided bound at level 1 - alpha: the form
the non-inferiority rule takes (estimate, lower, upper, n, design="duet"), as relative changes of the
candidate's step time (positive = worse; for a throughput metric the candidate's throughput fell by that).
"""

from __future__ import annotations

import enum
import math
import statistics
from dataclasses import asdict, dataclass
from typing import Any, Sequence

from qualify.metrics import RECOMMENDED_ALPHA, RECOMMENDED_MAX_REGRESSION

MIN_PAIRS = 3  # the fit has two parameters: at least one degree of freedom left for the block variance


@dataclass(frozen=True)
class DuetBlock:
    """One launch pair: which side the candidate had, and its per-step log ratios (candidate / baseline time)."""

    candidate_side: int
    log_ratios: tuple[float, ...]

    @property
    def summary(self) -> float:
        return statistics.median(self.log_ratios)


@dataclass(frozen=True)
class DuetInterval:
    """The candidate's relative change (positive = worse) with its interval; what the decision rule takes."""

    estimate: float
    lower: float
    upper: float
    n: int  # launch pairs (blocks), the unit of replication
    design: str  # "duet"
    confidence: float
    steps: int  # per-step observations, for the record: never the sample size
    side_bias: float | None  # side 0 vs side 1 (relative change of a step on side 0's resources), the A/A bias
    side_bias_lower: float | None
    side_bias_upper: float | None
    df: int
    method: str

    def figures(self) -> dict[str, Any]:
        return asdict(self)


def _t_quantile(p: float, df: int) -> float:
    from scipy.stats import t as student_t

    return float(student_t.ppf(p, df))


def duet_interval(blocks: Sequence[DuetBlock], *, alpha: float = RECOMMENDED_ALPHA) -> DuetInterval | None:
    """The interval of the candidate's effect from the launch pairs (see the module docstring); None when it
    cannot be had: fewer than MIN_PAIRS pairs, or no pair with the candidate on each side (the side bias
    cannot then be told from the effect, and it is never assumed zero)."""
    usable = [b for b in blocks if b.log_ratios and all(math.isfinite(r) for r in b.log_ratios)]
    side0 = [b.summary for b in usable if b.candidate_side == 0]
    side1 = [b.summary for b in usable if b.candidate_side == 1]
    n = len(side0) + len(side1)
    if n < MIN_PAIRS or not side0 or not side1:
        return None
    mean0, mean1 = statistics.fmean(side0), statistics.fmean(side1)
    delta = (mean0 + mean1) / 2
    # A step on side 0's resources takes exp(beta) times one on side 1's: with the candidate on side 0 the
    # ratio gains +beta, on side 1 -beta.
    beta = (mean0 - mean1) / 2
    df = n - 2
    ss = sum((m - mean0) ** 2 for m in side0) + sum((m - mean1) ** 2 for m in side1)
    var = ss / df
    se = math.sqrt(var / 4 * (1 / len(side0) + 1 / len(side1)))  # the same for delta and beta
    q = _t_quantile(1 - alpha, df)
    rel = math.expm1
    return DuetInterval(
        estimate=rel(delta), lower=rel(delta - q * se), upper=rel(delta + q * se), n=n, design="duet",
        confidence=1 - 2 * alpha, steps=sum(len(b.log_ratios) for b in usable),
        side_bias=rel(beta), side_bias_lower=rel(beta - q * se), side_bias_upper=rel(beta + q * se),
        df=df, method="random-intercept model per launch pair, side as fixed effect (t on pair medians)")


class DuetCall(enum.StrEnum):
    PASS = "PASS"  # the worst end of the interval is within max_regression
    FAIL = "FAIL"  # a regression is shown (the interval excludes no change) and its estimate is beyond the tolerance
    UNDECIDED = "UNDECIDED"  # neither: more launch pairs, up to the budget; then INCOMPLETE, never PASS


def decide(interval: DuetInterval | None, max_regression: float = RECOMMENDED_MAX_REGRESSION) -> DuetCall:
    """The non-inferiority call on a duet interval (a thin adapter; the gate's shared rule may replace it)."""
    if interval is None:
        return DuetCall.UNDECIDED
    if interval.upper <= max_regression:
        return DuetCall.PASS
    if interval.lower > 0 and interval.estimate > max_regression:
        return DuetCall.FAIL
    return DuetCall.UNDECIDED

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
the non-inferiority rule takes (estimate, lower, upper, n, design="duet"), on its scale: the candidate's
throughput change (the rate of a step, 1 / step time), negative = worse; lower is the worst end. log_estimate
and log_se (with df) give the bounds at any other level (the rule's alpha spending over looks).
"""

from __future__ import annotations

import enum
import math
import statistics
from dataclasses import asdict, dataclass
from typing import Any, Sequence

from qualify.gate import noninferiority as ni
from qualify.gate.quantiles import t_quantile
from qualify.metrics import RECOMMENDED_ALPHA, RECOMMENDED_MAX_REGRESSION

MIN_PAIRS = 3  # the fit has two parameters: at least one degree of freedom left for the block variance
LOOK_STEP = 2  # undecided after a look: two more pairs, one per side assignment


@dataclass(frozen=True)
class Looks:
    """Where the duet runner looks: after the planned pairs, then every LOOK_STEP pairs while undecided, up to the
    budget (twice the planned pairs). Each look's interval is at that look's share of alpha (noninferiority's
    Pocock-type spending, Lan & DeMets 1983), so that the chance of a wrong PASS or FAIL over all looks stays
    within alpha: a runner that looked at full alpha each time and stopped at the first decision would pass a
    regression at the margin more often than alpha (tests/unit/test_duet_stats.py simulates both)."""

    planned: int
    budget: int

    @classmethod
    def for_planned(cls, planned: int) -> "Looks":
        return cls(planned, 2 * planned)

    def points(self) -> list[int]:
        return list(range(self.planned, self.budget + 1, LOOK_STEP))

    def alpha_at(self, n: int, alpha: float) -> float:
        """The one-sided level of each bound at the look that n pairs reached (0 before the first look): the
        increment of the spending function from the previous look point to this one."""
        reached = [p for p in self.points() if p <= n]
        if not reached:
            return 0.0
        previous = ni.spent(alpha, reached[-2] / self.budget) if len(reached) > 1 else 0.0
        return ni.spent(alpha, reached[-1] / self.budget) - previous


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
    """The candidate's throughput change (negative = worse) with its interval; what the decision rule takes."""

    estimate: float  # the candidate's throughput change (a step's rate), negative = worse: exp(-delta) - 1
    lower: float  # the worst end (a one-sided bound at 1 - alpha)
    upper: float  # the best end
    n: int  # launch pairs (blocks), the unit of replication
    design: str  # "duet"
    log_estimate: float  # -delta: the log ratio in the better direction
    log_se: float  # its standard error (df below): the rule may take bounds at another level from these
    confidence: float
    steps: int  # per-step observations, for the record: never the sample size
    side_bias: float | None  # side 0 vs side 1 (relative change of a step on side 0's resources), the A/A bias
    side_bias_lower: float | None
    side_bias_upper: float | None
    df: int
    method: str

    def figures(self) -> dict[str, Any]:
        return asdict(self)


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
    q = t_quantile(1 - alpha, df)
    rel = math.expm1
    better = -delta  # the throughput's log change, positive = the candidate better (the rule's scale)
    return DuetInterval(
        estimate=rel(better), lower=rel(better - q * se), upper=rel(better + q * se), n=n, design="duet",
        log_estimate=better, log_se=se,
        confidence=1 - 2 * alpha, steps=sum(len(b.log_ratios) for b in usable),
        side_bias=rel(beta), side_bias_lower=rel(beta - q * se), side_bias_upper=rel(beta + q * se),
        df=df, method="random-intercept model per launch pair, side as fixed effect (t on pair medians)")


class DuetCall(enum.StrEnum):
    PASS = "PASS"  # non-inferiority shown: the worst end is within max_regression
    FAIL = "FAIL"  # a regression beyond max_regression shown: the best end is beyond it
    UNDECIDED = "UNDECIDED"  # neither: more launch pairs, up to the budget; then INCOMPLETE, never PASS


def decide(interval: DuetInterval | None, max_regression: float = RECOMMENDED_MAX_REGRESSION) -> DuetCall:
    """The non-inferiority call on a duet interval, the rule of the gate's other modes (a change of
    -max_regression is the margin): PASS when the worst end is within it, FAIL when the best end is beyond it."""
    if interval is None:
        return DuetCall.UNDECIDED
    if interval.lower >= -max_regression:
        return DuetCall.PASS
    if interval.upper < -max_regression:
        return DuetCall.FAIL
    return DuetCall.UNDECIDED

"""The regression rule: an interval for the relative change, decided by non-inferiority.

One scale for every mode. ``change = candidate / baseline - 1`` in the metric's *better* direction
(for a lower-is-better metric the ratio is baseline / candidate), computed on logs inside and
reported as ``exp(log ratio) - 1``: a 10% throughput drop is -10.0% in paired, history and duet mode
alike. ``max_regression`` (m) is the tolerated drop, so the margin is ``log(1 - m)`` on the log scale.

The decision (:func:`decide`), from an :class:`Interval` with a worst end ``lower`` and a best end
``upper`` (each a one-sided bound at the interval's level):

* PASS (non-inferiority shown): the worst end is within the tolerance, ``lower >= log(1 - m)``;
* FAIL (a regression beyond m shown): the best end is beyond it, ``upper < log(1 - m)``;
* UNDECIDED otherwise. Undecided is never PASS: with budget left the runner takes more launches
  (or pairs); at the budget the gate calls it INCOMPLETE with the launches it would need.

So a PASS is a claim with a bounded error: a candidate really worse than m PASSes with probability
at most alpha, and a candidate really within m FAILs with probability at most alpha.

Units. The interval is computed on the comparison's real sampling unit:

* paired (and duet): one log ratio per launch pair (or block); :func:`interval_from_log_ratios`;
* history: two *runs*. Launches of one run share that run's machine state, so the run-to-run
  variation measured by ``qualify calibrate`` for the fingerprint is added to the within-run
  spread (:func:`history_interval`); without a calibration there is no interval (the gate says
  "calibrate, or use paired").

Sequential looks. The runner looks after every launch from ``min_samples`` up to ``max_launches``
and stops as soon as the decision is PASS or FAIL. Looking repeatedly inflates the error rates of a
fixed-level interval, so each look k gets its own level from an alpha-spending function (Lan &
DeMets 1983, "Discrete sequential boundaries for clinical trials", Biometrika 70:659-663) with the
Pocock-type function ``alpha * ln(1 + (e - 1) * t)`` (t = n / max_launches, the information
fraction). Each one-sided bound at look k uses the increment ``alpha(t_k) - alpha(t_(k-1))``, and
the increments sum to alpha; by the union bound the chance of any false PASS (or any false FAIL)
over all looks is at most alpha, whatever the correlation between looks and with Student-t
quantiles for the unknown spread. Why this design and not the alternatives:

* a fixed maximum number of looks is what we have anyway (the launch budget), and a t quantile
  handles the unknown launch-to-launch spread at 3-8 units exactly under log-normal noise, where
  the normal-mixture confidence sequences (Howard et al. 2021) need a known sub-Gaussian scale;
* Pocock-type rather than O'Brien-Fleming-type spending: O'Brien-Fleming spends almost nothing at
  the first looks (0.7% of a 5% alpha at 3 of 8 launches), and a t quantile at that level with 2
  degrees of freedom is about 8, so the first looks could never stop a quiet identical candidate;
  Pocock-type spends more early, which is where the runner saves launches.
* union-bound (Bonferroni over looks) rather than exact recursive boundaries: it is conservative
  (the simulation in benchmarks/sequential_rule.py shows realized rates below alpha), needs no
  numerical integration, and stays valid when a run stops for other reasons.

For another mode's units (e.g. duet blocks): build ``interval_from_log_ratios(log_ratios,
direction=..., alpha=look_alpha(plan, n))`` and pass it to :func:`decide` or :func:`judge`.
"""

from __future__ import annotations

import enum
import math
import statistics
from dataclasses import dataclass
from typing import Callable, Literal, Sequence

from qualify.gate.quantiles import normal_quantile, t_quantile
from qualify.numbers import signed_pct
from qualify.metrics import Direction

# The power the "could see" figure and the "would need" estimate are stated at.
POWER = 0.90


class Decision(str, enum.Enum):
    PASS = "pass"  # non-inferiority shown: the worst end of the interval is within max_regression
    FAIL = "fail"  # a regression beyond max_regression shown: the best end is beyond it
    UNDECIDED = "undecided"  # neither: more units, or INCOMPLETE at the budget (never PASS)


@dataclass(frozen=True)
class Interval:
    """A one-sided-bounds interval of the log ratio, signed so that positive is better for the candidate."""

    estimate: float  # log(candidate / baseline) in the better direction
    lower: float  # worst end (one-sided bound at 1 - alpha_look)
    upper: float  # best end
    n: int  # units (pairs, runs' launches, blocks)
    design: str  # e.g. "paired-t", "history-runs", "duet-blocks"
    unit: str  # what n counts, for messages: "pairs", "launches", "blocks"
    alpha: float  # one-sided error probability of each bound at this look
    sd_unit: float | None = None  # spread of one unit's log value (for the "would need" estimate)
    se_floor: float = 0.0  # standard error that no number of units removes (history: run-to-run)
    df: float | None = None

    @property
    def change(self) -> float:
        return math.expm1(self.estimate)

    @property
    def worst(self) -> float:
        return math.expm1(self.lower)

    @property
    def best(self) -> float:
        return math.expm1(self.upper)


def margin(max_regression: float) -> float:
    """The tolerance on the log scale: a change of -max_regression is log(1 - max_regression)."""
    return math.log1p(-max_regression)


@dataclass(frozen=True)
class MarginWords:
    """How a decision against the margin reads: a tolerance (max_regression > 0, non-inferiority) or a required
    gain (max_regression <= 0, gate.reference's min_gain: superiority; the same rule, the margin on the other
    side of zero)."""

    passed: str
    failed: str
    spans: str

    @classmethod
    def of(cls, max_regression: float) -> "MarginWords":
        if max_regression > 0:
            bound = f"-{max_regression:.0%}"
            return cls(f"non-inferiority shown: the worst end is within {bound}",
                       f"regression shown: even the best end is beyond {bound}", f"the interval spans {bound}")
        bound = signed_pct(-max_regression)
        return cls(f"a gain of {bound} shown: the worst end is at or above it",
                   f"no gain of {bound}: even the best end is below it", f"the interval spans {bound}")


def decide(interval: Interval, max_regression: float) -> Decision:
    m = margin(max_regression)
    if interval.lower >= m:
        return Decision.PASS
    if interval.upper < m:
        return Decision.FAIL
    return Decision.UNDECIDED


def better_log_ratio(candidate: float, baseline: float, direction: Direction) -> float:
    """log(candidate / baseline) signed so that positive is better for the candidate."""
    value = math.log(candidate / baseline)
    return value if direction == "higher" else -value


# --------------------------------------------------------------------------- sequential plan


@dataclass(frozen=True)
class Plan:
    """The looks a case gets: after each unit from ``first`` up to ``budget`` (inclusive)."""

    first: int
    budget: int
    alpha: float

    def __post_init__(self) -> None:
        if not 2 <= self.first <= self.budget:
            raise ValueError(f"a plan needs 2 <= first ({self.first}) <= budget ({self.budget})")


def spent(alpha: float, fraction: float) -> float:
    """Pocock-type alpha-spending function (Lan & DeMets 1983): alpha * ln(1 + (e - 1) t)."""
    return alpha * math.log(1 + (math.e - 1) * min(1.0, max(0.0, fraction)))


def look_alpha(plan: Plan, n: int) -> float:
    """One-sided level of each bound at the look after n units (see the module docstring).

    n below the first look has nothing to spend; n past the budget (a case that ran more launches
    than planned) spends nothing more than the last look: the increments never sum above alpha.
    """
    if n < plan.first:
        return 0.0
    n = min(n, plan.budget)
    previous = 0.0 if n == plan.first else spent(plan.alpha, (n - 1) / plan.budget)
    return spent(plan.alpha, n / plan.budget) - previous


# --------------------------------------------------------------------------- intervals


def interval_from_log_ratios(log_ratios: Sequence[float], *, alpha: float, design: str = "paired-t",
                             unit: str = "pairs") -> Interval | None:
    """Student-t bounds on the mean of per-unit log ratios (positive = candidate better), each one-sided
    at level 1 - alpha. None with fewer than 2 units or alpha 0 (no look). No spread: the mean is exact."""
    xs = [float(x) for x in log_ratios]
    n = len(xs)
    if n < 2 or alpha <= 0:
        return None
    mean = statistics.fmean(xs)
    sd = statistics.stdev(xs)
    half = t_quantile(1 - alpha, n - 1) * sd / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n, design, unit, alpha, sd_unit=sd, df=n - 1)


@dataclass(frozen=True)
class RunVariation:
    """What calibration measured for one fingerprint: the run-level standard deviation of log figures
    (the offset all launches of one run share), with its degrees of freedom (A/A runs - 1)."""

    sd_run: float
    df: float
    launches: int | None = None  # launches per run when it was measured
    false_alarm_rate: float | None = None
    detectable: float | None = None  # smallest slowdown detected with 90% power (relative)
    comparisons: int | None = None


def welch_df(parts: Sequence[tuple[float, float]]) -> float:
    """Welch-Satterthwaite degrees of freedom of a sum of variance parts (variance, its df), computed on the parts'
    shares of the sum (scale-free): var**2 and v**2 themselves underflow to 0 for a variance near 1e-137 (a
    hypothesis example: identical launches and a tiny run-to-run variation). 1e6 when the sum is 0."""
    var = sum(v for v, _ in parts)
    if var <= 0:
        return 1e6
    return 1.0 / sum((v / var) ** 2 / d for v, d in parts if v > 0)


def history_interval(candidate: Sequence[float], baseline: Sequence[float], direction: Direction, *,
                     variation: RunVariation, alpha: float) -> Interval | None:
    """Two runs compared: their mean log figures, with the run-to-run variation of both runs added.

    var = s_c^2/n_c + s_b^2/n_b + 2 sd_run^2 (each run carries its own offset); Welch-Satterthwaite
    degrees of freedom over the three parts. None with fewer than 2 launches on a side or no look.
    """
    if len(candidate) < 2 or len(baseline) < 2 or alpha <= 0:
        return None
    lc = [math.log(v) for v in candidate]
    lb = [math.log(v) for v in baseline]
    sign = 1.0 if direction == "higher" else -1.0
    est = sign * (statistics.fmean(lc) - statistics.fmean(lb))
    parts = [(statistics.variance(lc) / len(lc), len(lc) - 1), (statistics.variance(lb) / len(lb), len(lb) - 1),
             (2 * variation.sd_run ** 2, max(1.0, variation.df))]
    var = sum(v for v, _ in parts)
    if var == 0:
        return Interval(est, est, est, len(lc), "history-runs", "launches", alpha, sd_unit=0.0, df=None)
    df = welch_df(parts)
    half = t_quantile(1 - alpha, df) * math.sqrt(var)
    pooled = math.sqrt((statistics.variance(lc) + statistics.variance(lb)) / 2)
    return Interval(est, est - half, est + half, len(lc), "history-runs", "launches", alpha, sd_unit=pooled,
                    se_floor=math.sqrt(2) * variation.sd_run, df=df)


# --------------------------------------------------------------------------- what it could see, what it needs


def detectable_drop(interval: Interval, max_regression: float) -> float:
    """The smallest true drop (relative, positive) this check FAILs with 90% power at its n and level."""
    se = (interval.upper - interval.estimate) / max(t_quantile(1 - interval.alpha, interval.df or 1e6), 1e-12)
    reach = -margin(max_regression) + (t_quantile(1 - interval.alpha, interval.df or 1e6)
                                       + t_quantile(POWER, interval.df or 1e6)) * se
    return -math.expm1(-reach)


def units_needed(interval: Interval, max_regression: float, alpha: float) -> int | None:
    """About how many units would decide a candidate as far from the margin as this estimate with 90% power
    (normal approximation, one-sided alpha). None: no number of units suffices (the run-to-run floor alone
    is too wide, or the estimate sits on the margin)."""
    # An estimate at or above 0 is judged as if it were 0 ("showing -m needs ..."), so the figure does not
    # promise fewer units for a candidate that merely looked lucky.
    distance = abs(min(interval.estimate, 0.0) - margin(max_regression))
    z = normal_quantile(1 - alpha) + normal_quantile(POWER)
    room = (distance / z) ** 2 - interval.se_floor ** 2
    if room <= 0 or not interval.sd_unit:
        return None if room <= 0 else interval.n
    per_side = 2 if interval.design == "history-runs" else 1  # the candidate's launches only; baseline fixed
    return max(interval.n, math.ceil(per_side * interval.sd_unit ** 2 / room))


# --------------------------------------------------------------------------- the outcome


@dataclass(frozen=True)
class Outcome:
    decision: Decision
    interval: Interval
    max_regression: float
    could_see: float  # the drop detected with 90% power here (relative, positive)
    needed: int | None  # units that would decide it (undecided only)
    budget: int | None

    @property
    def label(self) -> Literal["pass", "fail", "undecided"]:
        return self.decision.value  # type: ignore[return-value]

    def describe(self) -> str:
        iv = self.interval
        head = (f"change {signed_pct(iv.change)} (one-sided {(1 - iv.alpha) * 100:.3g}% bounds "
                f"{signed_pct(iv.worst)} .. {signed_pct(iv.best)}; {iv.n} {iv.unit}, {iv.design})")
        words = MarginWords.of(self.max_regression)
        if self.decision is Decision.PASS:
            tail = words.passed
        elif self.decision is Decision.FAIL:
            tail = words.failed
        else:
            tail = f"undecided: {words.spans}"
            if iv.sd_unit is not None:
                spread = f"{iv.unit[:-1] if iv.unit.endswith('s') else iv.unit} spread {iv.sd_unit:.1%}"
                if iv.se_floor:
                    spread += f", run-to-run {iv.se_floor / math.sqrt(2):.1%}"
                if self.needed is None:
                    tail += f" ({spread}: no number of {iv.unit} decides it here; use paired)"
                else:
                    tail += (f" ({spread}: deciding needs about {self.needed} {iv.unit}"
                             + (f"; budget {self.budget}" if self.budget else "") + ")")
        # "could see" is a drop detected with power; against a required gain it would read as nonsense.
        could = f"; could see >= {self.could_see:.0%} here" if self.max_regression > 0 else ""
        return f"{head}: {tail}{could}; {iv.n} {iv.unit}"


def judge(interval: Interval, max_regression: float, *, alpha: float, budget: int | None = None) -> Outcome:
    decision = decide(interval, max_regression)
    needed = units_needed(interval, max_regression, alpha) if decision is Decision.UNDECIDED else None
    return Outcome(decision, interval, max_regression, detectable_drop(interval, max_regression), needed, budget)


# --------------------------------------------------------------------------- the runner's question


def paired_logs(candidate: Sequence[float], baseline: Sequence[float], direction: Direction) -> list[float] | None:
    """Per-pair log ratios in the better direction; None when a figure is missing or not positive."""
    if len(candidate) != len(baseline) or not candidate:
        return None
    if not all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in [*candidate, *baseline]):
        return None
    return [better_log_ratio(c, b, direction) for c, b in zip(candidate, baseline)]


def should_continue(plan: Plan, max_regression: float, interval_at: Callable[[float], Interval | None],
                    n: int) -> bool:
    """The runner's decision callback: take another unit after n? True below the first look; at a look only
    while the decision is UNDECIDED and the budget is not spent. ``interval_at(alpha)`` builds the interval
    of the units so far at a look's one-sided level (the same function the gate judges with)."""
    if n >= plan.budget:
        return False
    if n < plan.first:
        return True
    interval = interval_at(look_alpha(plan, n))
    return interval is None or decide(interval, max_regression) is Decision.UNDECIDED

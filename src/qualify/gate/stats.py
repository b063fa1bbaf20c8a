"""The gate's regression and gain comparisons of launch-level figures, by the non-inferiority rule.

The rule itself, its scale and its sequential levels are in :mod:`qualify.gate.noninferiority`; this
module turns a case's figures into an interval on the right unit and an outcome:

* :func:`compare_pairs` (gate.regression.baseline: paired): one log ratio per launch pair, measured
  back to back on the same node in counterbalanced order (qualify.launches.run_paired), so the node's
  drift cancels in each ratio; Student-t bounds on their mean.
* :func:`compare_history` (history / optional): the candidate run against the previous release's run.
  The unit is the run: the run-to-run variation that calibration measured for the fingerprint is
  added to the launches' own spread. Without a calibration there is no interval: the comparison is
  undecided, "calibrate, or use paired" (a run's launches share its machine state, so their spread
  alone understates the difference between two runs: 12-36% false FAILs at 3-10% run offsets).
* :func:`gain_outcome` (variant gains): the variant's and its baseline variant's launches of the same
  run, Welch bounds on the difference of mean logs, judged against ``log(1 + min_gain)`` by the same
  decision: met / missed / inconclusive.

Every level is the sequential one of the look the case stopped at (noninferiority.look_alpha with
the plan ``min_samples .. max_launches``), so a decision the runner stopped on and the gate's are the
same decision. Figures that are missing, not finite or not positive leave no interval ("cannot compare").
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Sequence

from qualify.gate import noninferiority as ni
from qualify.numbers import signed_pct
from qualify.metrics import (
    RECOMMENDED_ALPHA,
    RECOMMENDED_MAX_LAUNCHES,
    RECOMMENDED_MAX_REGRESSION,
    RECOMMENDED_MIN_SAMPLES,
    Direction,
)

CALIBRATE_HINT = "calibrate (qualify calibrate MANIFEST), or use paired"


@dataclass(frozen=True)
class Comparison:
    """One metric of one case against its baseline: the outcome, or why there is none."""

    metric: str
    direction: Direction
    n_candidate: int
    n_baseline: int
    median_candidate: float | None
    median_baseline: float | None
    outcome: ni.Outcome | None  # None: nothing could be decided (problem says why)
    problem: str | None
    message: str

    @property
    def decision(self) -> ni.Decision:
        return self.outcome.decision if self.outcome else ni.Decision.UNDECIDED

    def figures(self) -> dict[str, Any]:
        out: dict[str, Any] = {"metric": self.metric, "direction": self.direction, "n_candidate": self.n_candidate,
                               "n_baseline": self.n_baseline, "median_candidate": self.median_candidate,
                               "median_baseline": self.median_baseline, "decision": self.decision.value}
        if self.outcome:
            iv = self.outcome.interval
            out.update(change=iv.change, change_worst=iv.worst, change_best=iv.best, n=iv.n, unit=iv.unit,
                       design=iv.design, look_alpha=iv.alpha, unit_spread=iv.sd_unit, df=iv.df,
                       max_regression=self.outcome.max_regression, could_see=self.outcome.could_see,
                       needed=self.outcome.needed, budget=self.outcome.budget)
        return out


def median(values: Sequence[float]) -> float | None:
    xs = _clean(values)
    return statistics.median(xs) if xs else None


def _clean(values: Sequence[float | None]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def plan(min_samples: int, max_launches: int, alpha: float, n: int) -> ni.Plan:
    """The looks a case had: min_samples .. max_launches (at least n: a case may have run more)."""
    first = max(2, min_samples)
    return ni.Plan(first, max(first, max_launches, n), alpha)


def _undecided(common: dict[str, Any], problem: str) -> Comparison:
    return Comparison(**common, outcome=None, problem=problem, message=f"cannot decide: {problem}")


def compare_pairs(candidate: Sequence[float], baseline: Sequence[float], direction: Direction, *,
                  metric: str = "", max_regression: float = RECOMMENDED_MAX_REGRESSION,
                  alpha: float = RECOMMENDED_ALPHA, min_samples: int = RECOMMENDED_MIN_SAMPLES,
                  max_launches: int = RECOMMENDED_MAX_LAUNCHES) -> Comparison:
    """Paired: candidate[i] and baseline[i] were measured back to back on one node (see the module docstring)."""
    pairs = list(zip(candidate, baseline))
    common: dict[str, Any] = dict(metric=metric, direction=direction, n_candidate=len(pairs),
                                  n_baseline=len(pairs), median_candidate=median([c for c, _ in pairs]),
                                  median_baseline=median([b for _, b in pairs]))
    logs = ni.paired_logs([c for c, _ in pairs], [b for _, b in pairs], direction)
    if logs is None:
        return _undecided(common, "no pairs" if not pairs else "a paired figure is missing or not positive")
    look = plan(min_samples, max_launches, alpha, len(logs))
    interval = ni.interval_from_log_ratios(logs, alpha=ni.look_alpha(look, len(logs)))
    if interval is None:
        return _undecided(common, f"only {len(logs)} pairs (< {look.first}, gate.regression.min_samples)")
    outcome = ni.judge(interval, max_regression, alpha=alpha, budget=look.budget)
    each = ", ".join(signed_pct(math.expm1(x)) for x in logs)
    return Comparison(**common, outcome=outcome, problem=None,
                      message=f"paired (pair changes {each}): {outcome.describe()}")


def compare_history(candidate: Sequence[float], baseline: Sequence[float], direction: Direction, *,
                    variation: ni.RunVariation | None, metric: str = "",
                    max_regression: float = RECOMMENDED_MAX_REGRESSION, alpha: float = RECOMMENDED_ALPHA,
                    min_samples: int = RECOMMENDED_MIN_SAMPLES,
                    max_launches: int = RECOMMENDED_MAX_LAUNCHES) -> Comparison:
    """The candidate run against the baseline run, runs as the unit (see the module docstring)."""
    cand, base = _clean(candidate), _clean(baseline)
    common: dict[str, Any] = dict(metric=metric, direction=direction, n_candidate=len(cand), n_baseline=len(base),
                                  median_candidate=median(cand), median_baseline=median(base))
    if not cand or not base:
        return _undecided(common, "no candidate figures" if not cand else "no baseline figures")
    if any(v <= 0 for v in cand + base):
        return _undecided(common, "a figure is not positive")
    change = math.exp(statistics.fmean(math.log(v) for v in cand) - statistics.fmean(math.log(v) for v in base))
    change = change - 1 if direction == "higher" else 1 / change - 1
    if variation is None:
        return _undecided(common, f"change {signed_pct(change)} over {len(cand)} vs {len(base)} launches, but the "
                                  f"run-to-run variation of this fingerprint is not known, so two runs cannot be "
                                  f"told apart: {CALIBRATE_HINT}")
    look = plan(min_samples, max_launches, alpha, len(cand))
    interval = ni.history_interval(cand, base, direction, variation=variation,
                                   alpha=ni.look_alpha(look, len(cand)))
    if interval is None:
        return _undecided(common, f"only {len(cand)} vs {len(base)} launches (< {look.first}, "
                                  "gate.regression.min_samples)")
    outcome = ni.judge(interval, max_regression, alpha=alpha, budget=look.budget)
    seen = (f"; calibrated: run-to-run {variation.sd_run:.1%}"
            + (f", detects >= {variation.detectable:.0%} with 90% power" if variation.detectable else "")
            + (f", realized false alarms {variation.false_alarm_rate:.0%}" if variation.false_alarm_rate is not None
               else ""))
    return Comparison(**common, outcome=outcome, problem=None, message=f"history: {outcome.describe()}{seen}")


# --------------------------------------------------------------------------- gains


@dataclass(frozen=True)
class GainOutcome:
    """A variant's gain over its baseline variant (positive = better), judged against the required gain."""

    outcome: ni.Outcome
    required: float

    @property
    def judgement(self) -> str:
        return {ni.Decision.PASS: "met", ni.Decision.FAIL: "missed", ni.Decision.UNDECIDED: "inconclusive"}[
            self.outcome.decision]


def welch_interval(candidate: Sequence[float], baseline: Sequence[float], direction: Direction, *,
                   alpha: float) -> ni.Interval | None:
    """Welch bounds on the difference of mean logs of two independent sets of launches (no run offset:
    both sides ran in the same run). A run-to-run part of 0 with many degrees of freedom adds nothing."""
    return ni.history_interval(candidate, baseline, direction, alpha=alpha,
                               variation=ni.RunVariation(sd_run=0.0, df=1e9))


def gain_outcome(variant: Sequence[float], baseline: Sequence[float], direction: Direction, *, required: float,
                 alpha: float = RECOMMENDED_ALPHA) -> GainOutcome | None:
    """None when a side has fewer than 2 positive launches."""
    var, base = _clean(variant), _clean(baseline)
    if any(v <= 0 for v in var + base):
        return None
    interval = welch_interval(var, base, direction, alpha=alpha)
    if interval is None:
        return None
    interval = ni.Interval(interval.estimate, interval.lower, interval.upper, interval.n, "welch-launches",
                           "launches", alpha, sd_unit=interval.sd_unit, df=interval.df)
    # The same decision with the margin at the required gain: decide() takes a tolerated drop, -required.
    return GainOutcome(ni.judge(interval, -required, alpha=alpha), required)

"""What `qualify calibrate` measures for a fingerprint, as pure functions of the runs' launch figures.

A calibration runs one case several times as whole runs of identical code (A/A) and several times with
an injected slowdown (``params.slowdown``), each run its planned launches. From them:

* the run-to-run variation (:func:`run_variation`): the standard deviation of a run's mean log figure
  that its launches' own spread does not explain (the offset every launch of one run shares):
  ``sd_run^2 = max(0, var(run means) - mean(s_i^2 / n_i))``, with ``runs - 1`` degrees of freedom;
* the realized false-alarm rate (:func:`realized_rates`): the share of A/A run pairs the gate's history
  rule FAILs, each judged with the variation measured on the OTHER runs (leave-the-pair-out, so a pair
  does not vouch for itself);
* the detection rate at the injected slowdown, and the smallest regression the check detects with 90%
  power at the planned launches (:func:`detectable`).

The gate (check_regression in history mode) reads the variation by :func:`key` of the result's
fingerprint; every regression line states what it could have seen.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import statistics
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from qualify.gate import noninferiority as ni
from qualify.gate.quantiles import t_quantile
from qualify.metrics import Direction


def key(fingerprint: Mapping[str, Any] | None) -> str:
    """A fingerprint's stable key (sha256 of its canonical JSON); '' for none."""
    if not fingerprint:
        return ""
    return hashlib.sha256(json.dumps(dict(fingerprint), sort_keys=True, default=str).encode()).hexdigest()


def lookup(fingerprint: Mapping[str, Any] | None, metric: str) -> str:
    """The key of a calibration of one metric of a fingerprint in the gate's calibrations mapping."""
    return f"{key(fingerprint)}/{metric}"


def run_variation(runs: Sequence[Sequence[float]]) -> ni.RunVariation | None:
    """The run-level variation of log figures from runs of identical code (each a list of launch figures).
    None with fewer than 2 runs, a run of fewer than 2 launches, or a figure that is not positive."""
    runs = [list(r) for r in runs]
    if len(runs) < 2 or any(len(r) < 2 or min(r) <= 0 for r in runs):
        return None
    logs = [[math.log(v) for v in r] for r in runs]
    means = [statistics.fmean(r) for r in logs]
    within = statistics.fmean(statistics.variance(r) / len(r) for r in logs)
    sd_run = math.sqrt(max(0.0, statistics.variance(means) - within))
    return ni.RunVariation(sd_run=sd_run, df=len(runs) - 1, launches=round(statistics.fmean(len(r) for r in runs)))


def launch_spread(runs: Sequence[Sequence[float]]) -> float:
    """The pooled within-run standard deviation of log launch figures."""
    logs = [[math.log(v) for v in r] for r in runs if len(r) >= 2]
    return math.sqrt(statistics.fmean(statistics.variance(r) for r in logs)) if logs else 0.0


@dataclass(frozen=True)
class Rates:
    false_alarm_rate: float  # A/A pairs FAILed
    aa_comparisons: int
    detection_rate: float | None  # slowed-vs-A pairs FAILed
    slowed_comparisons: int


def realized_rates(a_runs: Sequence[Sequence[float]], slowed_runs: Sequence[Sequence[float]], direction: Direction,
                   *, max_regression: float, alpha: float) -> Rates:
    """The gate's history rule on A/A pairs and on slowed-vs-A pairs, each judged with the variation of the
    A runs not in the pair (at least 2 left; else of all A runs)."""
    from qualify.gate import stats

    def variation_without(*skip: int) -> ni.RunVariation | None:
        rest = [r for i, r in enumerate(a_runs) if i not in skip]
        return run_variation(rest if len(rest) >= 2 else a_runs)

    def fails(cand: Sequence[float], base: Sequence[float], variation: ni.RunVariation | None) -> bool:
        n = len(cand)
        cmp = stats.compare_history(cand, base, direction, variation=variation, max_regression=max_regression,
                                    alpha=alpha, min_samples=n, max_launches=n)
        return cmp.decision is ni.Decision.FAIL

    aa = [fails(a_runs[i], a_runs[j], variation_without(i, j))
          for i, j in itertools.permutations(range(len(a_runs)), 2)]
    slowed = [fails(s, a_runs[j], variation_without(j)) for s in slowed_runs for j in range(len(a_runs))]
    return Rates(sum(aa) / len(aa) if aa else 0.0, len(aa), sum(slowed) / len(slowed) if slowed else None,
                 len(slowed))


def detectable(variation: ni.RunVariation, spread: float, launches: int, *, max_regression: float,
               alpha: float) -> float:
    """The smallest drop the history rule FAILs with 90% power at this many launches a side (one look)."""
    var = 2 * spread ** 2 / launches + 2 * variation.sd_run ** 2
    parts = [(spread ** 2 / launches, launches - 1)] * 2 + [(2 * variation.sd_run ** 2, max(1.0, variation.df))]
    df = ni.welch_df(parts)
    se = math.sqrt(var)
    iv = ni.Interval(0.0, -se * t_quantile(1 - alpha, df), se * t_quantile(1 - alpha, df), launches,
                     "history-runs", "launches", alpha, sd_unit=spread, df=df)
    return ni.detectable_drop(iv, max_regression)


def variation_of(row: Any) -> ni.RunVariation:
    """A stored calibration (store.models.Calibration) as the gate's RunVariation."""
    return ni.RunVariation(sd_run=row.sd_run, df=row.df, launches=row.launches,
                           false_alarm_rate=row.false_alarm_rate, detectable=row.detectable,
                           comparisons=row.aa_comparisons)

"""Noise-aware comparison of a candidate's samples with the previous release's samples.

The rule (one metric, one case):

* ``worse`` is the candidate median's relative change against the baseline median, signed so
  that positive means worse (lower throughput, or higher latency/wall time).
* With at least ``min_samples`` samples on BOTH sides, a regression needs both
  (1) ``worse > max_regression`` (the effect is big enough to matter) and
  (2) a one-sided Mann-Whitney U test (candidate worse than baseline) with ``p < alpha``
  (the effect is not noise).
* With fewer samples the test has no power (exact one-sided U with 2 vs 2 samples cannot go
  below p = 1/6), so only a ratio beyond ``max(max_regression, noise_floor)`` fails, where the
  noise floor is what one measurement on this kind of machine can swing by itself. The message
  says that the comparison was a ratio only.
* An improvement (``worse <= 0``) never fails.

Anchors (how other benchmark gates decide):

* asv (airspeed velocity) ``asv compare``/``asv continuous``: a change counts only when the
  ratio of the two results exceeds ``--factor`` AND the difference is statistically significant
  (asv uses a Mann-Whitney U test on the samples when both sides have them). Rule (1)+(2) is
  exactly that shape.
* Conbench's lookback z-score: the new result is compared with the mean and standard deviation
  of a window of earlier results of the same benchmark and flagged beyond a z threshold; i.e.
  a regression is judged against the measured spread, not against one number. Mann-Whitney on
  the two sample sets serves the same purpose without assuming normal noise (CPU timings on a
  shared 2-core machine have heavy tails).
* PyTorch HUD (TorchInductor dashboard): speed-up ratio of a run to a baseline window, with a
  regression flagged when the ratio falls beyond a threshold (and confirmed by "2 trailing
  violations"). Our ``worse > max_regression`` is that ratio rule; repeating the measurement
  (samples) plays the role of the trailing confirmations.

Choosing the defaults (proved by tests/test_gate_stats.py and benchmarks/gate_stats.py):
with n = 5 vs 5 and 3% multiplicative noise, the median of 5 has a standard deviation of about
1.2 * 3% / sqrt(5) = 1.6%, so the ratio of two medians has about 2.3%. A true 10% regression
then has its observed ``worse`` above 5% in about 98% of trials, whereas a 10% tolerance would
catch only about half of them (the observed value scatters symmetrically around 10%). Hence
the tolerance must sit between the noise and the effect: ``max_regression = 0.05``.
The exact one-sided U test with 5 vs 5 reaches p = 1/252 = 0.004 at best and p < 0.05 for
U <= 4; a 10% shift at 3% noise (3.3 sigma) gives U <= 4 in well over 99% of trials, so
``alpha = 0.05`` costs almost no power while bounding false alarms at 5% (the exact test is
conservative: under the null hypothesis P(p < 0.05) = P(U <= 4) = 12/252 = 4.8%), and the ratio
condition cuts them further (to well under 1% at 3% noise, where a 5% median gap is rare). At 20% noise (this machine's worst case) no 5-sample rule can see a 10%
regression reliably; the test keeps false alarms below 5% regardless of the noise, and the
benchmark prints the (low) power honestly.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from typing import Any, Literal, Sequence

from qualify.metrics import (
    RECOMMENDED_ALPHA,
    RECOMMENDED_MAX_REGRESSION,
    RECOMMENDED_MIN_SAMPLES,
    RECOMMENDED_NOISE_FLOOR,
    Direction,
)


@dataclass(frozen=True)
class Comparison:
    metric: str
    direction: Direction
    n_candidate: int
    n_baseline: int
    median_candidate: float | None
    median_baseline: float | None
    ratio: float | None  # candidate median / baseline median
    worse: float | None  # relative change, positive = worse for this metric's direction
    p_value: float | None
    method: Literal["paired-t-log", "welch-log", "mann-whitney", "ratio-only", "none"]
    tolerance: float  # the relative change that was needed to fail
    regressed: bool
    message: str

    def figures(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("message")
        out.pop("regressed")
        return out


def median(values: Sequence[float]) -> float | None:
    xs = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return statistics.median(xs) if xs else None


def relative_worse(candidate: float, baseline: float, direction: Direction) -> float:
    """Relative change of candidate against baseline, positive = worse."""
    change = (candidate - baseline) / abs(baseline)
    return -change if direction == "higher" else change


def mann_whitney_worse(candidate: Sequence[float], baseline: Sequence[float], direction: Direction) -> float:
    """One-sided Mann-Whitney U p-value for "candidate is worse than baseline".

    For a higher-is-better metric "worse" means the candidate's samples tend to be smaller
    (alternative="less"); for lower-is-better, larger. scipy picks the exact distribution for
    small samples without ties and the normal approximation otherwise.
    """
    from scipy.stats import mannwhitneyu

    alternative = "less" if direction == "higher" else "greater"
    result = mannwhitneyu(list(candidate), list(baseline), alternative=alternative, method="auto")
    p = float(result.pvalue)
    return p if math.isfinite(p) else 1.0


def welch_log_worse(candidate: Sequence[float], baseline: Sequence[float], direction: Direction) -> float:
    """One-sided Welch t-test p-value on log values for "candidate is worse than baseline".

    Used on launch-level samples (one figure per independent process launch): with 3 vs 3 of them
    no rank test can reach p < 0.05 (the exact Mann-Whitney minimum is 1/20), whereas the t-test on
    logs (throughput noise is multiplicative) keeps its nominal false-alarm rate and has the power
    to see a 10% shift at 3% launch-to-launch noise. Without spread on either side the difference
    is exact: p is 0 when the candidate is worse, else 1.
    """
    from scipy.stats import ttest_ind

    cand = [math.log(v) for v in candidate]
    base = [math.log(v) for v in baseline]
    if statistics.pvariance(cand) == 0 and statistics.pvariance(base) == 0:
        worse = statistics.fmean(cand) < statistics.fmean(base) if direction == "higher" else \
            statistics.fmean(cand) > statistics.fmean(base)
        return 0.0 if worse else 1.0
    alternative = "less" if direction == "higher" else "greater"
    p = float(ttest_ind(cand, base, equal_var=False, alternative=alternative).pvalue)
    return p if math.isfinite(p) else 1.0


def _pct(x: float) -> str:
    return f"{x * 100:+.1f}%"


def _tested_verdict(worse: float, p: float, max_regression: float, alpha: float) -> tuple[bool, str]:
    """The rule with a test (unpaired or paired): the change beyond the tolerance AND significant."""
    regressed = worse > max_regression and p < alpha
    if regressed:
        return True, f"regression beyond {max_regression:.0%} and significant (p={p:.3g} < {alpha:g})"
    if worse <= 0:
        return False, "no regression"
    if worse <= max_regression:
        return False, f"within the {max_regression:.0%} tolerance (p={p:.3g})"
    return False, f"beyond {max_regression:.0%} but not significant (p={p:.3g} >= {alpha:g}): noise"


def compare_samples(candidate: Sequence[float], baseline: Sequence[float], direction: Direction, *,
                    metric: str = "", max_regression: float = RECOMMENDED_MAX_REGRESSION,
                    alpha: float = RECOMMENDED_ALPHA, min_samples: int = RECOMMENDED_MIN_SAMPLES,
                    noise_floor: float = RECOMMENDED_NOISE_FLOOR,
                    test: Literal["welch-log", "mann-whitney"] = "welch-log",
                    unit: str = "launches") -> Comparison:
    """Decide whether candidate regressed against baseline (see module docstring for the rule).

    test: "welch-log" for launch-level samples (few, independent), "mann-whitney" for many samples.
    unit: what one sample is, for the message ("launches", "samples").
    """
    cand = [float(v) for v in candidate if v is not None and math.isfinite(float(v))]
    base = [float(v) for v in baseline if v is not None and math.isfinite(float(v))]
    med_c, med_b = median(cand), median(base)
    common = dict(metric=metric, direction=direction, n_candidate=len(cand), n_baseline=len(base),
                  median_candidate=med_c, median_baseline=med_b)
    if med_c is None or med_b is None or med_b == 0:
        why = ("no candidate samples" if med_c is None else
               "no baseline samples" if med_b is None else "the baseline median is 0")
        return Comparison(**common, ratio=None, worse=None, p_value=None, method="none",
                          tolerance=max_regression, regressed=False, message=f"cannot compare: {why}")
    ratio = med_c / med_b
    worse = relative_worse(med_c, med_b, direction)
    change = f"median {med_c:.4g} vs {med_b:.4g} ({_pct(-worse if direction == 'higher' else worse)}"
    change += ", worse)" if worse > 0 else ", not worse)"
    positive = all(v > 0 for v in cand + base)
    if len(cand) >= min_samples and len(base) >= min_samples and (test == "mann-whitney" or positive):
        p = (welch_log_worse(cand, base, direction) if test == "welch-log"
             else mann_whitney_worse(cand, base, direction))
        test_name = "Welch t-test on logs" if test == "welch-log" else "Mann-Whitney"
        regressed, verdict = _tested_verdict(worse, p, max_regression, alpha)
        msg = f"{change}, {len(cand)} vs {len(base)} {unit}, one-sided {test_name}: {verdict}"
        return Comparison(**common, ratio=ratio, worse=worse, p_value=p, method=test,
                          tolerance=max_regression, regressed=regressed, message=msg)
    tolerance = max(max_regression, noise_floor)
    regressed = worse > tolerance
    msg = (f"{change}; only {len(cand)} vs {len(base)} {unit} (< {min_samples}): too few for a test, "
           f"ratio compared with the noise floor {tolerance:.0%}: "
           + ("regression" if regressed else "no regression beyond the noise floor"))
    return Comparison(**common, ratio=ratio, worse=worse, p_value=None, method="ratio-only",
                      tolerance=tolerance, regressed=regressed, message=msg)


# --------------------------------------------------------------------------- paired


def compare_pairs(candidate: Sequence[float], baseline: Sequence[float], direction: Direction, *,
                  metric: str = "", max_regression: float = RECOMMENDED_MAX_REGRESSION,
                  alpha: float = RECOMMENDED_ALPHA, min_samples: int = RECOMMENDED_MIN_SAMPLES,
                  noise_floor: float = RECOMMENDED_NOISE_FLOOR) -> Comparison:
    """Paired comparison: candidate[i] and baseline[i] were measured back to back on the same node
    (gate.regression.baseline: paired), so the machine's drift between pairs cancels in their ratio.

    worse: the median over pairs of the per-pair relative change (positive = worse). A regression
    needs worse > max_regression AND a one-sided paired t-test on the log ratios with p < alpha. Why
    not Wilcoxon's signed-rank test: with 3 pairs its smallest one-sided p is 1/8, so it could never
    flag anything; the t-test on log ratios keeps its nominal false-alarm rate for log-normal noise.
    Fewer than min_samples pairs: the median ratio against the noise floor, said so.
    """
    pairs = [(float(c), float(b)) for c, b in zip(candidate, baseline)
             if c is not None and b is not None and math.isfinite(float(c)) and math.isfinite(float(b))]
    positive = [(c, b) for c, b in pairs if c > 0 and b > 0]
    med_c = median([c for c, _ in pairs])
    med_b = median([b for _, b in pairs])
    common = dict(metric=metric, direction=direction, n_candidate=len(pairs), n_baseline=len(pairs),
                  median_candidate=med_c, median_baseline=med_b)
    if not positive or len(positive) < len(pairs):
        why = "no pairs" if not pairs else "a figure is not positive"
        return Comparison(**common, ratio=None, worse=None, p_value=None, method="none",
                          tolerance=max_regression, regressed=False, message=f"cannot compare the pairs: {why}")
    logs = [math.log(c / b) for c, b in positive]  # > 0: candidate higher
    bad = [-x for x in logs] if direction == "higher" else logs  # > 0: candidate worse
    ratio = math.exp(statistics.median(logs))
    worse = math.exp(statistics.median(bad)) - 1
    change = (f"median pair ratio {ratio:.4f} ({_pct(-worse if direction == 'higher' else worse)}"
              + (", worse)" if worse > 0 else ", not worse)"))
    n = len(bad)
    if n >= min_samples:
        spread = statistics.stdev(bad)
        if spread == 0:
            p = 0.0 if statistics.fmean(bad) > 0 else 1.0
        else:
            from scipy.stats import t as student_t

            t_stat = statistics.fmean(bad) / (spread / math.sqrt(n))
            p = float(student_t.sf(t_stat, df=n - 1))
        regressed, verdict = _tested_verdict(worse, p, max_regression, alpha)
        each = ", ".join(f"{c / b:.3f}" for c, b in positive)
        msg = f"paired, {change}, {n} pairs (ratios {each}), one-sided paired t-test on log ratios: {verdict}"
        return Comparison(**common, ratio=ratio, worse=worse, p_value=p, method="paired-t-log",
                          tolerance=max_regression, regressed=regressed, message=msg)
    tolerance = max(max_regression, noise_floor)
    regressed = worse > tolerance
    msg = (f"paired, {change}; only {n} pairs (< {min_samples}): too few for a test, ratio compared with the "
           f"noise floor {tolerance:.0%}: " + ("regression" if regressed else "no regression beyond the noise floor"))
    return Comparison(**common, ratio=ratio, worse=worse, p_value=None, method="ratio-only",
                      tolerance=tolerance, regressed=regressed, message=msg)


# --------------------------------------------------------------------------- gains


@dataclass(frozen=True)
class GainInterval:
    """A variant's relative gain over its baseline (positive = better) with a bootstrap interval."""

    gain: float  # of the medians
    low: float
    high: float
    confidence: float
    n_variant: int
    n_baseline: int

    def judge(self, required: float) -> Literal["met", "missed", "inconclusive"]:
        if self.low >= required:
            return "met"
        if self.high < required:
            return "missed"
        return "inconclusive"


def _gain(variant_median: float, baseline_median: float, direction: Direction) -> float:
    return variant_median / baseline_median - 1 if direction == "higher" else baseline_median / variant_median - 1


def gain_interval(variant: Sequence[float], baseline: Sequence[float], direction: Direction, *,
                  confidence: float = 0.90, resamples: int = 2000, seed: int = 0) -> GainInterval | None:
    """Percentile-bootstrap interval of the gain of medians (each side resampled independently).

    Deterministic (fixed seed), so re-judging a run gives the same answer. None when a side is empty
    or a median is not positive. With one sample per side the interval is the point itself.
    """
    import random

    var = [float(v) for v in variant if v is not None and math.isfinite(float(v))]
    base = [float(v) for v in baseline if v is not None and math.isfinite(float(v))]
    if not var or not base:
        return None
    mv, mb = statistics.median(var), statistics.median(base)
    if mv <= 0 or mb <= 0:
        return None
    rng = random.Random(seed)
    draws = []
    for _ in range(resamples):
        bv = statistics.median(rng.choices(var, k=len(var)))
        bb = statistics.median(rng.choices(base, k=len(base)))
        if bv > 0 and bb > 0:
            draws.append(_gain(bv, bb, direction))
    draws.sort()
    tail = (1 - confidence) / 2
    low = draws[int(tail * (len(draws) - 1))]
    high = draws[int((1 - tail) * (len(draws) - 1))]
    return GainInterval(_gain(mv, mb, direction), low, high, confidence, len(var), len(base))

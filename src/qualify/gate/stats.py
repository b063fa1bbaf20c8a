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

from qualify.metrics import Direction

# The defaults the simulation proves (see module docstring). The manifest's RegressionPolicy
# should carry the same values.
RECOMMENDED_MAX_REGRESSION = 0.05
RECOMMENDED_ALPHA = 0.05
RECOMMENDED_MIN_SAMPLES = 5
RECOMMENDED_NOISE_FLOOR = 0.20


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
    method: Literal["mann-whitney", "ratio-only", "none"]
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


def _pct(x: float) -> str:
    return f"{x * 100:+.1f}%"


def compare_samples(candidate: Sequence[float], baseline: Sequence[float], direction: Direction, *,
                    metric: str = "", max_regression: float = RECOMMENDED_MAX_REGRESSION,
                    alpha: float = RECOMMENDED_ALPHA, min_samples: int = RECOMMENDED_MIN_SAMPLES,
                    noise_floor: float = RECOMMENDED_NOISE_FLOOR) -> Comparison:
    """Decide whether candidate regressed against baseline (see module docstring for the rule)."""
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
    if len(cand) >= min_samples and len(base) >= min_samples:
        p = mann_whitney_worse(cand, base, direction)
        regressed = worse > max_regression and p < alpha
        if regressed:
            verdict = f"regression beyond {max_regression:.0%} and significant (p={p:.3g} < {alpha:g})"
        elif worse <= 0:
            verdict = "no regression"
        elif worse <= max_regression:
            verdict = f"within the {max_regression:.0%} tolerance (p={p:.3g})"
        else:
            verdict = f"beyond {max_regression:.0%} but not significant (p={p:.3g} >= {alpha:g}): noise"
        msg = f"{change}, {len(cand)} vs {len(base)} samples, one-sided Mann-Whitney: {verdict}"
        return Comparison(**common, ratio=ratio, worse=worse, p_value=p, method="mann-whitney",
                          tolerance=max_regression, regressed=regressed, message=msg)
    tolerance = max(max_regression, noise_floor)
    regressed = worse > tolerance
    msg = (f"{change}; only {len(cand)} vs {len(base)} samples (< {min_samples}): too few for a test, "
           f"ratio compared with the noise floor {tolerance:.0%}: "
           + ("regression" if regressed else "no regression beyond the noise floor"))
    return Comparison(**common, ratio=ratio, worse=worse, p_value=None, method="ratio-only",
                      tolerance=tolerance, regressed=regressed, message=msg)


# --------------------------------------------------------------------------- simulation


def _draws(effect: float, noise: float, n: int, trials: int, seed: int, direction: Direction):
    import numpy as np

    rng = np.random.default_rng(seed)
    truth = 1000.0
    cand_truth = truth * (1 - effect) if direction == "higher" else truth * (1 + effect)
    base = truth * (1 + noise * rng.standard_normal((trials, n)))
    cand = cand_truth * (1 + noise * rng.standard_normal((trials, n)))
    return cand, base


def simulate(*, effect: float, noise: float, n: int, trials: int, seed: int,
             max_regression: float = RECOMMENDED_MAX_REGRESSION, alpha: float = RECOMMENDED_ALPHA,
             min_samples: int = RECOMMENDED_MIN_SAMPLES, noise_floor: float = RECOMMENDED_NOISE_FLOOR,
             direction: Direction = "higher") -> float:
    """Fraction of trials that compare_samples flags as a regression.

    Samples are a throughput of 1000 with multiplicative Gaussian noise (relative standard
    deviation ``noise``), the candidate's true value lowered by ``effect`` (0.10 = 10% slower).
    For a lower-is-better metric the candidate's true value is raised instead.
    """
    return float(simulate_flags(effect=effect, noise=noise, n=n, trials=trials, seed=seed,
                                max_regression=max_regression, alpha=alpha, min_samples=min_samples,
                                noise_floor=noise_floor, direction=direction).mean())


def simulate_flags(*, effect: float, noise: float, n: int, trials: int, seed: int,
                   max_regression: float = RECOMMENDED_MAX_REGRESSION, alpha: float = RECOMMENDED_ALPHA,
                   min_samples: int = RECOMMENDED_MIN_SAMPLES, noise_floor: float = RECOMMENDED_NOISE_FLOOR,
                   direction: Direction = "higher"):
    """Per-trial decisions of compare_samples itself (the gate's code path), as a bool array."""
    import numpy as np

    cand, base = _draws(effect, noise, n, trials, seed, direction)
    return np.array([compare_samples(c, b, direction, max_regression=max_regression, alpha=alpha,
                                     min_samples=min_samples, noise_floor=noise_floor).regressed
                     for c, b in zip(cand, base)], dtype=bool)


def simulate_flags_fast(*, effect: float, noise: float, n: int, trials: int, seed: int,
                        max_regression: float = RECOMMENDED_MAX_REGRESSION, alpha: float = RECOMMENDED_ALPHA,
                        min_samples: int = RECOMMENDED_MIN_SAMPLES, noise_floor: float = RECOMMENDED_NOISE_FLOOR,
                        direction: Direction = "higher"):
    """The same rule vectorised over trials (same draws as simulate_flags; a test checks that
    both agree trial by trial), for benchmarks with many trials."""
    import numpy as np
    from scipy.stats import mannwhitneyu

    cand, base = _draws(effect, noise, n, trials, seed, direction)
    med_c, med_b = np.median(cand, axis=1), np.median(base, axis=1)
    change = (med_c - med_b) / np.abs(med_b)
    worse = -change if direction == "higher" else change
    if n >= min_samples:
        alternative = "less" if direction == "higher" else "greater"
        p = mannwhitneyu(cand, base, alternative=alternative, axis=1, method="auto").pvalue
        return (worse > max_regression) & (p < alpha)
    return worse > max(max_regression, noise_floor)

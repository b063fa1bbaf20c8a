"""Monte-Carlo simulation of the gate's regression rule (qualify.gate.stats.compare_samples).

Used by benchmarks/gate_stats.py and by tests/ to prove the defaults (false-alarm and detection
rates at this machine's noise). Not part of the library: nothing at run time needs it.
"""

from __future__ import annotations

from qualify.gate.stats import compare_samples
from qualify.metrics import (
    RECOMMENDED_ALPHA,
    RECOMMENDED_MAX_REGRESSION,
    RECOMMENDED_MIN_SAMPLES,
    RECOMMENDED_NOISE_FLOOR,
    Direction,
)


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
    """Fraction of trials that compare_samples flags as a regression (each sample: one launch's figure).

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
    from scipy.stats import ttest_ind

    cand, base = _draws(effect, noise, n, trials, seed, direction)
    med_c, med_b = np.median(cand, axis=1), np.median(base, axis=1)
    change = (med_c - med_b) / np.abs(med_b)
    worse = -change if direction == "higher" else change
    ratio_only = worse > max(max_regression, noise_floor)
    if n >= min_samples:
        # The gate's test on launch-level samples: one-sided Welch t-test on the logs.
        positive = (cand > 0).all(axis=1) & (base > 0).all(axis=1)
        alternative = "less" if direction == "higher" else "greater"
        with np.errstate(invalid="ignore", divide="ignore"):
            p = ttest_ind(np.log(np.where(positive[:, None], cand, 1.0)),
                          np.log(np.where(positive[:, None], base, 1.0)),
                          equal_var=False, alternative=alternative, axis=1).pvalue
        tested = (worse > max_regression) & (np.nan_to_num(p, nan=1.0) < alpha)
        return np.where(positive, tested, ratio_only)
    return ratio_only

"""The quantiles the gate's intervals use, one copy, remembered.

scipy.stats is imported on first use, not at import: it costs ~0.4 s, and a CLI call that judges nothing (`gate
check`) must not pay it. The values are remembered because the same few (alpha, df) pairs come back for every
case of a run and for every trial of the error-rate simulations (a `t.ppf` call is ~0.3 ms; the simulations of
tests/unit make thousands).
"""

from __future__ import annotations

import math
from functools import lru_cache


@lru_cache(maxsize=4096)
def t_quantile(p: float, df: float) -> float:
    """Student's t quantile: P(T <= q) = p with df degrees of freedom."""
    from scipy.stats import t as student_t

    return float(student_t.ppf(p, df))


@lru_cache(maxsize=256)
def normal_quantile(p: float) -> float:
    """The standard normal quantile: P(Z <= q) = p."""
    from scipy.stats import norm

    return float(norm.ppf(p))


def normal_cdf(z: float) -> float:
    """The standard normal distribution function P(Z <= z), from the error function (no scipy call)."""
    return 0.5 * math.erfc(-z / math.sqrt(2.0))

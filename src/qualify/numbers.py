"""Numbers as results carry them and as people read them: one copy of each helper.

A result document's figure may be missing, null, a bool (JSON true is not 1.0 here) or not finite; every
reader takes it through `finite`. Formatting for tables, logs and reports goes through `fmt_number` and
`signed_pct`, so that a figure reads the same everywhere.
"""

from __future__ import annotations

import math
from typing import Any


def finite(value: Any) -> float | None:
    """The value as a float when it is a finite number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def fmt_number(value: Any) -> str:
    """A figure in 4 significant digits (3 in scientific notation when very large or small); n/a for none."""
    if value is None:
        return "n/a"
    if isinstance(value, float):
        if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
            return f"{value:.3g}"
        return f"{value:.4g}"
    return str(value)


def signed_pct(value: Any, signed: bool = True) -> str:
    """A fraction as a percentage with one decimal (+5.0%); n/a when it is not a finite number."""
    number = finite(value)
    if number is None:
        return "n/a"
    return f"{number * 100:+.1f}%" if signed else f"{number * 100:.1f}%"

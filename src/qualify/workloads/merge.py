"""Nested-dict merge, the one copy (standard library only).

Used by the training workload (a case's deepspeed_config under its switches) and by the
orchestrator's case expansion (deepspeed_config of the defaults, then of the model).
"""

from __future__ import annotations

import copy
from typing import Any


def deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """A new dict: base with top laid over it; nested dicts merge key by key, anything else in
    top replaces base's value. Neither input is modified or shared with the result."""
    out = copy.deepcopy(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out

"""What a case's Prefect task run logs about its result: the key figures, and each launch's figure per metric."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from qualify.report.views import KEY_METRICS, fmt_number
from qualify.result_document import PER_LAUNCH


def resources_text(resources: Mapping[str, Any]) -> str:
    """'gpus=1, cpus=4', or what a case without a request gets."""
    return ", ".join(f"{k}={v}" for k, v in resources.items()) or "default resources (1 CPU)"


def figure_lines(case_id: str, kind: str, metrics: Mapping[str, Any] | None,
                 samples: Mapping[str, Sequence[Any]] | None) -> list[str]:
    """'<case>: tokens_per_s=1234 (launches 1201, 1234, 1270)' for each key metric the case reported."""
    metrics, samples = metrics or {}, samples or {}
    lines = []
    for name in KEY_METRICS.get(kind, ()):
        if name not in metrics:
            continue
        launches = samples.get(PER_LAUNCH + name) or []
        per_launch = f" (launches {', '.join(fmt_number(v) for v in launches)})" if len(launches) > 1 else ""
        lines.append(f"{case_id}: {name}={fmt_number(metrics.get(name))}{per_launch}")
    return lines

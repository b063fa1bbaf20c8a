"""`qualify compare` rows on the gate's scale, and the report's chart drawn from them (it read the old ratio keys)."""

from __future__ import annotations

from qualify.comparison import compare_series
from qualify.gate.noninferiority import RunVariation
from qualify.manifest import RegressionPolicy
from qualify.report import charts


def test_compare_calls_by_the_gate_rule_and_the_chart_draws_them() -> None:
    policy = RegressionPolicy()
    base = [1000.0, 1004.0, 996.0, 1002.0]
    quiet = RunVariation(0.002, 20)
    rows = [compare_series("c", "tokens_per_s", base, [v * 0.85 for v in base], policy, variation=quiet),
            compare_series("c", "tokens_per_s", base, [v * 1.0 for v in base], policy, variation=quiet),
            compare_series("c", "tokens_per_s", base, [v * 1.2 for v in base], policy, variation=quiet),
            compare_series("c", "tokens_per_s", base, base, policy)]  # never calibrated
    assert [r.call for r in rows] == ["regression", "within tolerance", "improvement", "undecided"]
    assert abs(rows[0].change + 0.15) < 1e-9 and rows[0].change_worst < rows[0].change < rows[0].change_best
    assert "calibrate" in rows[3].message
    png = charts.baseline_chart([r.to_dict() for r in rows], "change")
    assert png.startswith(b"\x89PNG")

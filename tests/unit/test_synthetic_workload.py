"""The synthetic workload's knobs the regression tests rest on: slowdown as extra work, launch spread by slot."""

from __future__ import annotations

import pytest

from qualify.workloads import synthetic


def _run(params: dict, launch: dict | None = None) -> dict:
    case = {"case_id": "synthetic/x", "kind": "synthetic", "params": params, **({"launch": launch} if launch else {})}
    return synthetic.handler(case, None)


def test_slowdown_is_extra_work_rates_fall_and_times_grow() -> None:
    out = _run({"samples": {"tokens_per_s": [110.0], "wall_s": [2.0], "latency_s_p90": [1.0], "loss_last": [3.0]},
                "slowdown": 0.10})
    assert out["metrics"]["tokens_per_s"] == pytest.approx(100.0)
    assert out["metrics"]["wall_s"] == pytest.approx(2.2)
    assert out["metrics"]["latency_s_p90"] == pytest.approx(1.1)
    assert out["metrics"]["loss_last"] == pytest.approx(3.0)  # not a rate nor a time: untouched


def test_a_paired_launch_reports_the_entry_of_its_slot() -> None:
    params = {"launch_samples": [{"tokens_per_s": [v]} for v in (100.0, 104.0, 97.0)]}
    assert _run(params, {"index": 0, "of": 3})["metrics"]["tokens_per_s"] == 100.0
    assert _run(params, {"index": 0, "of": 3, "slot": 1})["metrics"]["tokens_per_s"] == 104.0
    assert _run(params, {"index": 1, "of": 3, "slot": 5})["metrics"]["tokens_per_s"] == 97.0

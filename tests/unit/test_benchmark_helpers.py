"""The benchmarks' own helpers that decide what they report (benchmarks/cluster_sim.py, paired_vs_history.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

pytestmark = pytest.mark.unit


def test_a_case_span_is_the_workers_not_when_the_driver_noticed_it() -> None:
    from benchmarks.cluster_sim import held_span

    # Submitted at 100.0, waited 2.0 s in Ray's queue, held its GPUs 5.0 s: 102..107 on the worker, although the
    # driver noticed the start at 102.3 and the end at 107.4, after its successor (started 107.01) was running.
    ran = SimpleNamespace(queue_wait_s=2.0, exec_s=5.0)
    assert held_span(100.0, ran, 102.3, 107.4) == (102.0, 107.0)
    never_ran = SimpleNamespace(queue_wait_s=None, exec_s=0.5)  # a result the driver made: its own times
    assert held_span(100.0, never_ran, 100.5, 100.5) == (100.5, 100.5)


def test_one_case_per_run_qualifies_that_model_alone(tmp_path: Path) -> None:
    from benchmarks.paired_vs_history import manifest

    one = yaml.safe_load(manifest(tmp_path / "a.yaml", "1.0", "0.9", mode="duet", slowdown=0.1,
                                  cases=("slowed",)).read_text())
    assert [m["name"] for m in one["training"]["models"]] == ["slowed"]
    assert one["training"]["models"][0]["settings"] == {"slowdown": 0.1}
    both = yaml.safe_load(manifest(tmp_path / "b.yaml", "1.0", "0.9", mode="duet", slowdown=0.1).read_text())
    assert [m["name"] for m in both["training"]["models"]] == ["same", "slowed"]


def test_a_subset_flag_keeps_the_known_order_and_refuses_anything_else() -> None:
    from benchmarks.paired_vs_history import subset

    assert subset("--cases", " slowed,identical ", ("identical", "slowed")) == ("identical", "slowed")
    for bad in ("", ",", "identical,bogus"):
        with pytest.raises(ValueError, match=r"--cases: a comma-separated subset of identical,slowed, got"):
            subset("--cases", bad, ("identical", "slowed"))

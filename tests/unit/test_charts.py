"""The report's charts say what they show: no panel for a figure that was not computed, a slowdown drawn red
whatever its check concluded, whiskers and axes labelled (qualify.report.charts)."""

from __future__ import annotations

from typing import Any

import pytest
from matplotlib.colors import to_hex

from qualify.report import charts


@pytest.fixture
def figure(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    captured: dict[str, Any] = {}

    def keep(fig: Any) -> bytes:
        captured["fig"] = fig
        return b""

    monkeypatch.setattr(charts, "_png", keep)
    return captured


ROWS = [{"variant": "base", "tokens_per_s": 100.0, "tps_low": 90.0, "tps_high": 110.0, "mfu": None},
        {"variant": "compile", "tokens_per_s": 80.6, "tps_low": 79.0, "tps_high": 82.0, "mfu": None,
         "gain": -0.194, "gain_low": -0.22, "gain_high": -0.17, "min_gain": -0.25, "gain_status": "PASS",
         "gain_baseline": "base"}]


def test_training_chart_without_mfu_has_no_empty_panel_and_a_slowdown_is_red(figure: dict[str, Any]) -> None:
    charts.training_chart("tiny", ROWS)
    axes = figure["fig"].axes
    assert len(axes) == 2  # tokens/s and gains; MFU could not be computed
    assert "MFU n/a" in axes[0].get_title() and "min..max of launches" in axes[0].get_title()
    assert axes[0].get_ylabel() == "tokens/s"
    bar = axes[1].patches[0]
    assert to_hex(bar.get_facecolor()) == charts.STATUS_COLOURS["FAIL"]  # -19.4%, although the check passed
    assert "check PASS" in axes[1].get_xticklabels()[0].get_text()


def test_training_chart_with_mfu_keeps_its_panel(figure: dict[str, Any]) -> None:
    charts.training_chart("tiny", [dict(row, mfu=0.31) for row in ROWS])
    assert [ax.get_title() for ax in figure["fig"].axes][1] == "tiny: MFU"


def test_inference_whiskers_and_axis_are_labelled(figure: dict[str, Any]) -> None:
    charts.inference_chart("tq", [{"scheme": "w8a8", "tokens_per_s": 179.0, "tps_low": 150.0, "tps_high": 600.0,
                                   "token_agreement": 0.97, "topk_overlap": 0.95, "min_agreement": 0.9,
                                   "status": "passed"}])
    throughput = figure["fig"].axes[0]
    assert "whiskers min..max of launches" in throughput.get_title()
    assert throughput.get_ylabel() == "output tokens/s"

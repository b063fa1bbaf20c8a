"""The report's training section: what a reader may take from each figure."""

from __future__ import annotations

import pytest

from qualify.report import html

pytestmark = pytest.mark.unit


def _case(case_id: str, variant: str, environment: dict) -> dict:
    return {"case_id": case_id, "kind": "train", "model": "tiny", "variant": variant, "status": "passed",
            "metrics": {"tokens_per_s": 900.0}, "samples": {"tokens_per_s": [880.0, 920.0]},
            "environment": environment}


def test_rates_measured_in_duet_say_they_are_not_alone_rates_and_reference_cases_stay_out_of_the_chart(
        monkeypatch: pytest.MonkeyPatch) -> None:
    drawn: list[list[str]] = []
    monkeypatch.setattr(html.charts, "training_chart",
                        lambda model, rows: drawn.append([r["variant"] for r in rows]) or b"")
    view = {"cases": [_case("train/tiny/base", "base", {"duet": {"mode": "duet", "pairs": []}}),
                      _case("train/tiny/compile", "compile", {"duet": {"mode": "paired", "reason": "no node"}}),
                      _case("reference/train/tiny/base", "base", {})], "policy": {}}
    section = html._training(view, None)
    assert "train/tiny/base: measured in duet" in section and "lower than the image's alone" in section
    assert "train/tiny/compile: measured in duet" not in section  # it fell back to paired: alone-rates
    assert drawn == [["base", "compile"]]  # the ablation chart draws each variant once, without reference cases
    quiet = html._training({"cases": [_case("train/tiny/base", "base", {})], "policy": {}}, None)
    assert "measured in duet" not in quiet

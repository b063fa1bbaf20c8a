"""A waiver names one check or one family written out, never everything (issue 24.3)."""

from __future__ import annotations

import datetime as dt

import pytest
import yaml
from pydantic import ValidationError

from qualify.gate.checks import FAIL, Reason, apply_waivers
from qualify.manifest import Waiver
from qualify.manifest.load import ManifestError, load_manifest_text

TODAY = dt.date(2025, 6, 1)
EVERY_CHECK = ["regression", "variant_gain", "agreement", "probe:prefix_cache", "probe:degenerate",
               "threshold:tokens_per_s", "threshold:token_agreement", "component:torch", "completeness",
               "quantization", "variant_evidence", "mfu", "retries"]


def _waiver(check: str) -> Waiver:
    return Waiver(id="W", check=check, reason="because", expires=TODAY)


@pytest.mark.parametrize("check", ["*", "**", "?*", "*:*", "[a-z]*", "[!x]*", "regress*", "regression*",
                                   "threshold*", "threshold:*_s", "threshold:tokens_per_?",
                                   "probe:[a-z]*", "component:t?rch", "component:", "threshold:",
                                   "completeness", "completeness:*", "quantization", "mfu", "retries",
                                   "thresholds:*", "*:tokens_per_s", " regression", "probe: x", "agreement*"])
def test_a_pattern_or_an_unwaivable_check_is_refused(check: str) -> None:
    with pytest.raises(ValidationError, match="not one check or one family"):
        _waiver(check)


@pytest.mark.parametrize("check", ["regression", "variant_gain", "agreement", "max_model_len_limit",
                                   "threshold:tokens_per_s", "threshold:*", "probe:prefix_cache", "probe:*",
                                   "component:torch", "component:*"])
def test_one_check_or_one_family_is_accepted(check: str) -> None:
    assert _waiver(check).check == check


@pytest.mark.parametrize("check,covered", [
    ("threshold:*", {"threshold:tokens_per_s", "threshold:token_agreement"}),
    ("probe:*", {"probe:prefix_cache", "probe:degenerate"}),
    ("component:*", {"component:torch"}),
    ("regression", {"regression"}),
    ("threshold:tokens_per_s", {"threshold:tokens_per_s"}),
])
def test_a_waiver_covers_exactly_what_it_names(check: str, covered: set[str]) -> None:
    assert {c for c in EVERY_CHECK if _waiver(check).covers_check(c)} == covered


def test_the_gate_never_waives_beyond_the_name_even_unvalidated() -> None:
    # A waiver that skipped validation (model_construct) still covers only an equal check.
    everything = Waiver.model_construct(id="W", cases="*", check="*", reason="x", expires=TODAY)
    reasons = [Reason(c, "synthetic/x", FAIL, "bad") for c in EVERY_CHECK]
    assert all(r.status == FAIL for r in apply_waivers(reasons, [everything], TODAY))


def test_the_manifest_names_the_waiver_field() -> None:
    text = yaml.safe_dump({"release": {"name": "r", "repository": "127.0.0.1:5000/q/r", "tag": "1",
                                       "candidate_tag": "1-rc1", "previous_tag": "0"},
                           "custom_cases": [{"name": "nap", "kind": "sleep"}],
                           "gate": {"waivers": [{"id": "W", "check": "*", "reason": "all", "expires": "2099-01-01"}]}})
    with pytest.raises(ManifestError) as info:
        load_manifest_text(text, "m.yaml")
    [problem] = info.value.problems
    assert problem.field == "gate.waivers[0].check" and "'*'" in problem.message

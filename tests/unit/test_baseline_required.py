"""History mode needs a previous release (issue 24.1): without release.previous_tag the regression check
would compare with nothing and the run would PASS. Refused at validation, INCOMPLETE when re-judged."""

from __future__ import annotations

import pytest
import yaml

from qualify.manifest.load import ManifestError, load_manifest_text

RELEASE = {"name": "r", "repository": "127.0.0.1:5000/q/r", "tag": "1.1", "candidate_tag": "1.1-rc1"}
CASES = [{"name": "nap", "kind": "sleep"}]


def _text(release: dict, regression: dict | None) -> str:
    data = {"release": release, "custom_cases": CASES}
    if regression is not None:
        data["gate"] = {"regression": regression}
    return yaml.safe_dump(data)


@pytest.mark.parametrize("regression", [None, {}, {"baseline": "history"}, {"baseline": "history", "enabled": True},
                                        {"max_regression": 0.1}])
def test_history_mode_without_a_previous_release_is_refused(regression: dict | None) -> None:
    with pytest.raises(ManifestError) as info:
        load_manifest_text(_text(RELEASE, regression), "m.yaml")
    [problem] = info.value.problems
    assert problem.field == "release.previous_tag"
    assert "baseline: optional" in problem.message and "first release" in problem.message


@pytest.mark.parametrize("previous", [None, ""])
def test_an_empty_previous_tag_is_no_previous_release(previous: str | None) -> None:
    release = {**RELEASE, "previous_tag": previous}
    try:
        load_manifest_text(_text(release, None), "m.yaml")
    except ManifestError as exc:
        assert any(p.field == "release.previous_tag" for p in exc.problems), str(exc)
    else:
        pytest.fail("a history-mode manifest without a previous release was accepted")


@pytest.mark.parametrize("regression", [{"baseline": "optional"}, {"enabled": False},
                                        {"baseline": "history", "enabled": False}])
def test_modes_that_need_no_previous_release_are_accepted(regression: dict) -> None:
    assert load_manifest_text(_text(RELEASE, regression), "m.yaml").release.release.previous_tag is None


def test_a_named_previous_release_is_accepted() -> None:
    assert load_manifest_text(_text({**RELEASE, "previous_tag": "1.0"}, None), "m.yaml")


def test_a_stored_manifest_is_re_read_and_left_to_the_gate() -> None:
    # An older run's stored copy stays readable; the gate makes its regression check INCOMPLETE
    # (tests/unit/test_gate_evaluate.py::test_no_previous_release_is_incomplete_in_history_mode).
    assert load_manifest_text(_text(RELEASE, None), "m.yaml", check_expiry=False)

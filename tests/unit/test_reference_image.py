"""A reference image to beat (issue 28): gate.reference names an image by digest; the cases its glob names run again as
`reference/<case id>` beside it, and the gate decides the gain by the interval rule against `min_gain` (superiority)
or `max_regression` (a tolerance). The end-to-end runs are tests/integration/test_reference_e2e.py."""

from __future__ import annotations

import math
import statistics
import time

import pytest
import yaml

from qualify.gate import noninferiority as ni
from qualify.gate.checks import ResultData, check_reference, check_regression
from qualify.gate.evaluate import evaluate
from qualify.manifest import is_reference_case
from qualify.manifest.cases import expand
from qualify.manifest.load import ManifestError, load_manifest_text
from support.gate import TODAY, manifest_dict, release as make_release

pytestmark = pytest.mark.unit

DIGEST = "sha256:" + "ab" * 32
REFERENCE = {"image": f"127.0.0.1:5000/std/pytorch@{DIGEST}", "label": "standard image", "min_gain": 0.15,
             "cases": "train/*", "python": "/opt/std/bin/python"}  # the local executor's "image"


def _release(**reference: object):
    return make_release(gate_extra={"reference": {**REFERENCE, **reference}})


def _problems(text: str) -> str:
    with pytest.raises(ManifestError) as err:
        load_manifest_text(text, check_expiry=False)
    return str(err.value)


def _text(**reference: object) -> str:
    return yaml.safe_dump(manifest_dict(gate_extra={"reference": {**REFERENCE, **reference}}), sort_keys=False)


# --------------------------------------------------------------------------- the manifest


def test_the_cases_the_glob_names_run_again_beside_the_reference() -> None:
    rel = _release()
    ids = [c.case_id for c in expand(rel)]
    assert ids == ["train/tiny/base", "train/tiny/compile", "infer/tq/none", "infer/tq/w8a8",
                   "reference/train/tiny/base", "reference/train/tiny/compile"]
    ref = next(c for c in expand(rel) if c.case_id == "reference/train/tiny/base")
    own = next(c for c in expand(rel) if c.case_id == "train/tiny/base")
    assert is_reference_case(ref) and not is_reference_case(own)
    assert (ref.params, ref.resources, ref.launches) == (own.params, own.resources, own.launches)
    assert rel.case_counts()["gate.reference"] == 2


def test_a_reference_case_is_judged_by_the_reference_rule_and_the_others_by_the_regression_rule() -> None:
    rel = _release(mode="duet")
    ref, own = (next(c for c in expand(rel) if c.case_id == i) for i in ("reference/train/tiny/base",
                                                                          "train/tiny/base"))
    assert rel.gate.regression_for(own) is rel.gate.regression
    rule = rel.gate.regression_for(ref)
    # The required gain is the margin on the other side of zero: max_regression -0.15 is "+15% shown".
    assert (rule.baseline, rule.max_regression, rule.alpha) == ("duet", -0.15, rel.gate.regression.alpha)
    tolerance = _release(min_gain=None, max_regression=0.05).gate.regression_for(ref)
    assert tolerance.max_regression == pytest.approx(0.05) and tolerance.baseline == "paired"


@pytest.mark.parametrize("reference, expected", [
    ({"image": "127.0.0.1:5000/std/pytorch:25.05"}, "names no digest"),
    ({"min_gain": None}, "give exactly one of 'min_gain'"),
    ({"max_regression": 0.05}, "give exactly one of 'min_gain'"),
    ({"cases": "infer/nothing*"}, "matches no case"),
    ({"mode": "history"}, "gate.reference.mode"),
    ({"min_gain": -1.5}, "gate.reference.min_gain"),
])
def test_a_reference_that_cannot_be_judged_is_refused_with_its_field(reference: dict, expected: str) -> None:
    assert expected in _problems(_text(**reference))


def test_the_local_executor_needs_an_interpreter_for_the_reference() -> None:
    data = manifest_dict(gate_extra={"reference": {k: v for k, v in REFERENCE.items() if k != "python"}})
    data["execution"] = {"executor": "local"}
    assert "gate.reference.python" in _problems(yaml.safe_dump(data))
    data["execution"] = {"executor": "container"}
    load_manifest_text(yaml.safe_dump(data), check_expiry=False)  # the container executor runs it by digest


def test_a_huge_matrix_with_a_reference_is_refused_by_the_cap_without_listing_its_cases() -> None:
    data = manifest_dict(gate_extra={"reference": {**REFERENCE, "cases": "*"}})
    data["training"] = {"models": [{"name": f"m{k}"} for k in range(3000)],
                        "variants": [{"name": f"v{k}"} for k in range(3000)]}
    started = time.process_time()
    problems = _problems(yaml.safe_dump(data))
    assert "over the cap" in problems
    assert time.process_time() - started < 20  # 9 million ids never listed (the count is an upper bound)


# --------------------------------------------------------------------------- the gate


def _result(case_id: str, cand: list[float], ref: list[float] | None, reason: str | None = None) -> ResultData:
    samples = {"per_launch.tokens_per_s": cand}
    if ref is not None:
        samples["paired_baseline.per_launch.tokens_per_s"] = ref
    return ResultData(case_id=case_id, kind="train", status="passed",
                      metrics={"tokens_per_s": statistics.median(cand)}, samples=samples,
                      environment={"paired": {"baseline": "std", "order": ["A0", "B0"], "reason": reason}})


def _judge(rel, cand: list[float], ref: list[float] | None, reason: str | None = None):
    case = next(c for c in expand(rel) if c.case_id == "reference/train/tiny/base")
    return check_reference(rel.gate, [case], {case.case_id: _result(case.case_id, cand, ref, reason)})


def test_a_gain_is_shown_only_when_the_worst_end_reaches_the_required_one() -> None:
    rel = _release()
    reference = [100.0, 80.0, 120.0]  # drift between pairs cancels
    # +20% in every pair (the worst end well above +15%): PASS.
    [shown] = _judge(rel, [v * 1.20 for v in reference], reference)
    assert (shown.check, shown.status) == ("reference", "PASS"), shown.message
    assert "a gain of +15.0% shown" in shown.message and "against standard image" in shown.message
    assert shown.figures["required_change"] == pytest.approx(0.15)
    assert shown.figures["change"] == pytest.approx(0.20, abs=1e-9)
    # +10% in every pair: the best end is below +15%: FAIL (a faster reference named as the slower one fails too).
    [short] = _judge(rel, [v * 1.10 for v in reference], reference)
    assert short.status == "FAIL" and "no gain of +15.0%" in short.message
    [slower] = _judge(rel, [v * 0.90 for v in reference], reference)
    assert slower.status == "FAIL"
    # +15.5% with noise spanning +15%: neither shown, never PASS.
    [spans] = _judge(rel, [reference[0] * 1.10, reference[1] * 1.21, reference[2] * 1.155], reference)
    assert spans.status == "INCOMPLETE" and "spans +15.0%" in spans.message
    # No reference side (the image could not be had): INCOMPLETE with the reason.
    [missing] = _judge(rel, reference, None, reason="gate.reference.python has another package set")
    assert missing.status == "INCOMPLETE" and "another package set" in missing.message


def test_the_reference_margin_is_the_required_gain_itself() -> None:
    """Mutations: a margin of log(1 - g) instead of log(1 + g), or a sign flip, or PASS on the estimate instead of
    the worst end, each changes one of these calls."""
    iv = ni.Interval(estimate=math.log(1.16), lower=math.log(1.151), upper=math.log(1.17), n=6, design="paired-t",
                     unit="pairs", alpha=0.05)
    assert ni.decide(iv, -0.15) is ni.Decision.PASS  # worst +15.1% >= +15%
    assert ni.decide(iv, -0.152) is ni.Decision.UNDECIDED  # worst +15.1% < +15.2% <= best +17%
    assert ni.decide(iv, -0.171) is ni.Decision.FAIL  # best +17% < +17.1%
    assert ni.margin(-0.15) == pytest.approx(math.log(1.15))
    assert ni.MarginWords.of(-0.15).passed.startswith("a gain of +15.0% shown")
    assert ni.MarginWords.of(0.05).passed.startswith("non-inferiority shown")


def test_the_reference_cases_are_not_compared_with_the_previous_release_and_the_verdict_counts_them() -> None:
    rel = _release()
    cases = expand(rel)
    reference = [100.0, 101.0, 99.0]
    results = {c.case_id: _result(c.case_id, [v * 1.3 for v in reference], reference)
               for c in cases if is_reference_case(c)}
    # History mode with no baseline run: the regression check speaks of the release, never of a reference case.
    regression = check_regression(rel.gate, cases, results, None, "1.0 has no PASS run")
    assert all(not (r.case_id or "").startswith("reference/") for r in regression)
    verdict = evaluate(rel.gate, cases, results, baseline=None, components=[], today=TODAY)
    lines = [r for r in verdict.reasons if r.check == "reference"]
    assert {r.case_id for r in lines} == {"reference/train/tiny/base", "reference/train/tiny/compile"}
    assert all(r.status == "PASS" for r in lines)


def test_the_reference_side_runs_the_named_variant_as_it_comes() -> None:
    """The note's comparison: the optimized image with its optimisations on against the standard image as it comes:
    gate.reference.variant makes a training reference case's other side run that variant of the same model."""
    from types import SimpleNamespace

    from qualify.execution.attempts import _other_side_case

    rel = _release(variant="base", cases="train/*/compile")
    cases = expand(rel)
    ref = next(c for c in cases if c.case_id == "reference/train/tiny/compile")
    ctx = SimpleNamespace(manifest=rel, cases=cases)
    other = _other_side_case(ctx, ref)  # type: ignore[arg-type]
    assert other.case_id == ref.case_id and other.variant == "base" and not other.params.get("compile")
    assert ref.params.get("compile") is True  # the candidate's side keeps its own switches
    # Without a variant, and for the candidate's own cases, the other side runs the same case.
    plain = _release(cases="train/*/compile")
    assert _other_side_case(SimpleNamespace(manifest=plain, cases=expand(plain)), ref) is ref  # type: ignore[arg-type]
    own = next(c for c in cases if c.case_id == "train/tiny/compile")
    assert _other_side_case(ctx, own) is own  # type: ignore[arg-type]
    assert "gate.reference.variant" in _problems(_text(variant="nope"))


def test_a_gain_just_at_the_required_one_passes_at_most_alpha_of_the_time_simulated() -> None:
    """The rule's error rates against a required gain, by simulation (benchmarks/gate_simulation.simulate_paired, the
    sequential paired runner with a shared run offset): a candidate exactly +15% faster is a false PASS for
    min_gain 0.15 at most alpha of the time (three standard errors of slack); +30% PASSes, +5% FAILs."""
    from benchmarks import gate_simulation

    trials, slack = 400, 3 * math.sqrt(0.05 * 0.95 / 400)
    for noise in (0.02, 0.05):
        at = gate_simulation.simulate_paired(drop=1 - 1.15, noise=noise, offset=0.03, trials=trials, seed=7,
                                             max_regression=-0.15)
        assert at.pass_rate <= 0.05 + slack, at
    clear = gate_simulation.simulate_paired(drop=1 - 1.30, noise=0.02, offset=0.03, trials=trials, seed=8,
                                            max_regression=-0.15)
    short = gate_simulation.simulate_paired(drop=1 - 1.05, noise=0.02, offset=0.03, trials=trials, seed=9,
                                            max_regression=-0.15)
    assert clear.pass_rate > 0.9 and short.fail_rate > 0.9, (clear, short)


def test_calibration_leaves_reference_cases_out() -> None:
    """`qualify calibrate` measures history mode's run-to-run variation; a reference case is measured beside its
    reference image, needs none, and would only run its own case again."""
    from qualify.execution.calibrate import calibrated_cases

    ids = [c.case_id for c in calibrated_cases(_release())]
    assert "train/tiny/base" in ids and not any(i.startswith("reference/") for i in ids)

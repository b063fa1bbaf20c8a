"""The agreement check's statistics (gate/agreement.py) and the check end to end through evaluate().

Each formula is pinned by an independent computation, by a clustered data set on which treating positions
as independent decides otherwise, and by a seeded coverage simulation with within-sequence correlation.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps
from support.gate import TODAY, GOOD_COMPONENTS, agreement_parts, cases_of, good_results, release

from qualify.gate import agreement as ag
from qualify.gate.evaluate import evaluate
from qualify.workloads.infer import metrics as infer_metrics


def _wilson_roots(p: float, n: float, t: float) -> tuple[float, float]:
    """The Wilson bounds as the roots of (p_hat - p)^2 = t^2 p (1 - p) / n (an independent derivation)."""
    a = 1 + t * t / n
    b = -(2 * p + t * t / n)
    c = p * p
    disc = math.sqrt(b * b - 4 * a * c)
    return (-b - disc) / (2 * a), (-b + disc) / (2 * a)


# --------------------------------------------------------------------------- the interval


def test_interval_matches_a_hand_computation():
    agree, positions = [10, 8, 10, 6], [10, 10, 10, 10]
    iv = ag.interval_for_agreement(agree, positions)
    p = 34 / 40
    v_cluster = 4 / 3 * ((10 - 8.5) ** 2 + (8 - 8.5) ** 2 + (10 - 8.5) ** 2 + (6 - 8.5) ** 2) / 40 ** 2
    deff = v_cluster / (p * (1 - p) / 40)
    assert iv.value == pytest.approx(p) and iv.design_effect == pytest.approx(deff) and deff > 2.8
    lo, hi = _wilson_roots(p, 40 / deff, float(sps.t.ppf(0.95, 3)))
    assert (iv.low, iv.high) == (pytest.approx(lo), pytest.approx(hi))
    assert iv.sequences == 4 and iv.positions == 40 and iv.confidence == pytest.approx(0.9)


def test_sequences_not_positions_are_the_unit():
    """150 sequences agree everywhere, 10 are half broken: 0.96875 over 10,240 positions. As 10,240 independent
    trials the lower bound would clear 0.96; by sequence (design effect ~30) it cannot."""
    agree, positions = [64] * 150 + [32] * 10, [64] * 160
    iv = ag.interval_for_agreement(agree, positions)
    assert iv.value == pytest.approx(0.96875) and iv.design_effect > 25
    naive_low = _wilson_roots(iv.value, 10240, float(sps.t.ppf(0.95, 159)))[0]
    assert naive_low > 0.96 > iv.low
    assert ag.decide_against_minimum(iv, 0.96) is ag.Call.UNDECIDED
    # the same agreement spread evenly over the sequences (62 of 64 everywhere) is decided
    even = ag.interval_for_agreement([62] * 160, positions)
    assert even.design_effect == 1.0 and ag.decide_against_minimum(even, 0.96) is ag.Call.PASS


def test_all_positions_agree_is_still_an_interval():
    iv = ag.interval_for_agreement([64] * 160, [64] * 160)
    t = float(sps.t.ppf(0.95, 159))
    assert iv.value == 1.0 and iv.high == pytest.approx(1.0) and iv.low == pytest.approx(10240 / (10240 + t * t))
    assert ag.decide_against_minimum(iv, 0.99) is ag.Call.PASS
    few = ag.interval_for_agreement([10, 10], [10, 10])  # 20 positions cannot show 0.99
    assert few.low < 0.99 and ag.decide_against_minimum(few, 0.99) is ag.Call.UNDECIDED


def test_decisions_and_refusals():
    assert ag.decide_against_minimum(ag.interval_for_agreement([40] * 160, [64] * 160), 0.9) is ag.Call.FAIL
    assert ag.interval_for_agreement([5], [10]) is None
    with pytest.raises(ValueError):
        ag.interval_for_agreement([11, 3], [10, 10])
    with pytest.raises(ValueError):
        ag.interval_for_agreement([1, 2], [10])
    iv = ag.interval_for_agreement([57] * 80 + [58] * 80, [64] * 160)
    needed = ag.sequences_to_decide(iv, 0.9)
    assert needed > 160


def _beta_binomial(rng, p, rho, m, n, reps):
    """reps x m sequences of n positions whose agreement rates scatter with intra-sequence correlation rho."""
    kappa = 1 / rho - 1
    rates = rng.beta(p * kappa, (1 - p) * kappa, size=(reps, m))
    return rng.binomial(n, rates)


@pytest.mark.parametrize("p,rho", [(0.99, 0.05), (0.95, 0.2)])
def test_coverage_with_within_sequence_correlation(p, rho):
    """The lower bound misses the true agreement about alpha of the time (false PASS at the boundary); treating
    positions as independent would miss far more often (the mutation this pins)."""
    rng = np.random.default_rng(20261201)
    counts = _beta_binomial(rng, p, rho, 160, 64, 1500)
    misses = naive_misses = 0
    t = float(sps.t.ppf(0.95, 159))
    for row in counts:
        iv = ag.interval_for_agreement(row.tolist(), [64] * 160)
        misses += iv.low > p
        naive_misses += _wilson_roots(iv.value, 10240, t)[0] > p
    assert 0.025 <= misses / len(counts) <= 0.075
    assert naive_misses / len(counts) > 0.12


# --------------------------------------------------------------------------- paired (clustered McNemar)


def test_paired_matches_a_hand_computation():
    base = [[True] * 10, [True] * 10, [True] * 8 + [False] * 2]
    cand = [[True] * 7 + [False] * 3, [True] * 10, [True] * 9 + [False]]
    cmp = ag.compare_paired(cand, base)
    d, n = [-3, 0, 1], [10, 10, 10]
    change = -2 / 30
    v_cluster = 3 / 2 * sum((di - change * ni) ** 2 for di, ni in zip(d, n)) / 900
    v_am = ((1 + 3 + 1) / 32 - (-2 / 32) ** 2) / 32
    se = math.sqrt(max(v_cluster, v_am))
    t = float(sps.t.ppf(0.95, 2))
    assert cmp.change == pytest.approx(change)
    assert (cmp.low, cmp.high) == (pytest.approx(change - t * se), pytest.approx(change + t * se))
    assert (cmp.only_candidate, cmp.only_baseline) == (1, 3)
    assert cmp.mcnemar_z == pytest.approx(-2 / math.sqrt(10))
    assert cmp.p_drop == pytest.approx(sps.norm.cdf(-2 / math.sqrt(10)))
    assert cmp.candidate == pytest.approx(26 / 30) and cmp.baseline == pytest.approx(28 / 30)
    swapped = ag.compare_paired(base, cand)  # the direction: the baseline side is now the better one
    assert swapped.change == pytest.approx(-change) and swapped.p_drop > 0.5


def test_paired_identical_sides_pass_and_still_have_an_interval():
    flags = [[True] * 63 + [False]] * 160
    cmp = ag.compare_paired(flags, flags)
    n_adj = 10242
    se = math.sqrt((1 / n_adj) / n_adj)
    assert cmp.change == 0 and cmp.low == pytest.approx(-float(sps.t.ppf(0.95, 159)) * se)
    assert cmp.mcnemar_z is None and cmp.p_drop is None
    assert cmp.decide(0.01) is ag.Call.PASS and cmp.decide(0.0) is ag.Call.UNDECIDED


def test_paired_blocks_by_sequence():
    """A 1.5-point drop made of 10 sequences that lost a quarter of their positions: independent positions
    would call it shown beyond 1 point's margin... no: within it. By sequence it is undecided."""
    base = [[True] * 64 for _ in range(160)]
    cand = [[True] * 64 for _ in range(150)] + [[True] * 48 + [False] * 16 for _ in range(10)]
    cmp = ag.compare_paired(cand, base)
    assert cmp.change == pytest.approx(-160 / 10240)
    independent_se = math.sqrt(((161) / 10242 - (160 / 10242) ** 2) / 10242)
    t = float(sps.t.ppf(0.95, 159))
    assert cmp.change + t * independent_se < -0.01  # as independent positions: a drop beyond 1 point shown
    assert cmp.high > -0.01 and cmp.decide(0.01) is ag.Call.UNDECIDED  # by sequence: not shown
    assert cmp.decide(0.03) is ag.Call.PASS


def test_paired_refuses_other_positions():
    with pytest.raises(ValueError):
        ag.compare_paired([[True, False]], [[True, False], [True]])
    with pytest.raises(ValueError):
        ag.compare_paired([[True, False], [True]], [[True], [True]])
    assert ag.compare_paired([[True]], [[False]]) is None


def test_paired_false_pass_rate_at_the_margin():
    """Simulated releases whose true drop is exactly the margin, discordance clustered by sequence: the
    paired check PASSes about alpha of the time or less, and FAILs a drop of three times the margin."""
    rng = np.random.default_rng(7)
    passes = fails = 0
    reps = 300
    for rep in range(reps):
        drop = 0.01 if rep < reps // 2 else 0.03
        # each sequence loses positions at its own rate (mean `drop`), and some flip the other way
        lose = rng.beta(drop * 9, (1 - drop) * 9, size=160)
        gain = rng.beta(0.005 * 9, 0.995 * 9, size=160)
        base, cand = [], []
        for lr, gr in zip(lose, gain):
            b = rng.random(64) < 0.97
            c = b.copy()
            c[b & (rng.random(64) < lr / 0.97)] = False
            c[~b & (rng.random(64) < min(1.0, gr / 0.03))] = True
            base.append(b.tolist())
            cand.append(c.tolist())
        # true change: -drop + gain's expected contribution; shift the comparison's margin by it
        cmp = ag.compare_paired(cand, base)
        margin = drop - 0.005  # the true drop net of the gains
        if rep < reps // 2:
            passes += cmp.decide(margin) is ag.Call.PASS
        else:
            fails += cmp.decide(0.01) is ag.Call.FAIL
    assert passes / (reps // 2) <= 0.08
    assert fails / (reps // 2) >= 0.9


# --------------------------------------------------------------------------- the record the workload writes


def test_flags_pack_and_unpack():
    flags = [[True, False, True], [], [False] * 9 + [True]]
    text = infer_metrics.pack_flags(flags)
    assert infer_metrics.sequence_counts(flags) == ([2, 1], [3, 10])
    assert infer_metrics.unpack_flags(text, [3, 10]) == [[True, False, True], [False] * 9 + [True]]
    with pytest.raises(ValueError):
        infer_metrics.unpack_flags(text, [3, 20])
    with pytest.raises(ValueError):
        infer_metrics.unpack_flags("not base64!", [3])
    big = [[bool((i * 7 + t) % 5) for t in range(64)] for i in range(160)]
    assert len(infer_metrics.pack_flags(big)) == 1708  # 10,240 positions: 1,280 bytes, 1.7 kB of base64
    assert infer_metrics.unpack_flags(infer_metrics.pack_flags(big), [64] * 160) == big


def test_counts_from_logits_per_sequence():
    import torch

    ref = torch.zeros(2, 3, 4)
    ref[:, :, 1] = 1.0  # reference argmax 1 everywhere
    q = ref.clone()
    q[0, 2, 3] = 5.0  # sequence 0, position 2 disagrees
    q[1, 0, 0] = 5.0  # sequence 1, position 0 disagrees
    figures, flags = infer_metrics.compare_logits_by_sequence(ref, q)
    assert flags == [[True, True, False], [False, True, True]]
    assert figures["token_agreement"] == pytest.approx(4 / 6) and figures["eval_sequences"] == 2
    samples, env = infer_metrics.agreement_record(flags, "x")
    assert samples == {infer_metrics.AGREE_SERIES: [2.0, 2.0], infer_metrics.POSITIONS_SERIES: [3.0, 3.0]}
    assert infer_metrics.unpack_flags(env[infer_metrics.FLAGS_KEY], [3, 3]) == flags
    topk, tflags = infer_metrics.compare_topk_by_sequence(
        [[{1: -0.1, 2: -1.0}, {}], [{3: -0.2}]], [[{2: -0.1, 1: -1.0}, {5: -1.0}], [{3: -0.1}]], k=2)
    assert tflags == [[False], [True]] and topk["eval_positions"] == 2 and topk["token_agreement"] == 0.5


# --------------------------------------------------------------------------- the check, end to end


@pytest.fixture
def rel():
    return release(gate_extra={"agreement": {"w8a8": 0.9, "none": 0.99}})


def _set(results, case_id, value, **kwargs):
    import dataclasses

    metrics, samples, env = agreement_parts(value, **kwargs)
    r = results[case_id]
    out = dict(results)
    out[case_id] = dataclasses.replace(r, metrics={**r.metrics, **metrics}, samples={**r.samples, **samples},
                                       environment={**r.environment, **env})
    return out


def _judge(rel, results, baseline=None):
    return evaluate(rel.gate, cases_of(rel), results, GOOD_COMPONENTS, baseline, today=TODAY,
                    expected_components=rel.components)


def _agreement(verdict, case_id="infer/tq/w8a8"):
    return [r for r in verdict.reasons if r.check == "agreement" and r.case_id == case_id]


def test_good_int8_passes_a_broken_kernel_fails_a_borderline_one_is_incomplete(rel):
    good = good_results(rel)
    [ok] = _agreement(_judge(rel, good))
    assert ok.status == "PASS" and ok.figures["low"] >= 0.9 and ok.figures["sequences"] == 160
    broken = _judge(rel, _set(good, "infer/tq/w8a8", 0.6))
    assert broken.verdict == "FAIL" and _agreement(broken)[0].status == "FAIL"
    border = _judge(rel, _set(good, "infer/tq/w8a8", 0.9))
    [reason] = _agreement(border)
    assert border.verdict == "INCOMPLETE" and reason.status == "INCOMPLETE"
    assert "spans the minimum 0.9" in reason.message and reason.figures["low"] < 0.9 < reason.figures["high"]


def test_agreement_without_per_sequence_counts_is_incomplete(rel):
    import dataclasses

    good = good_results(rel)
    r = good["infer/tq/w8a8"]
    bare = dict(good)
    bare["infer/tq/w8a8"] = dataclasses.replace(r, samples={k: v for k, v in r.samples.items()
                                                            if not k.startswith("agreement_")})
    [reason] = _agreement(_judge(rel, bare))
    assert reason.status == "INCOMPLETE" and "no per-sequence counts" in reason.message
    lying = dict(good)
    lying["infer/tq/w8a8"] = dataclasses.replace(r, metrics={**r.metrics, "token_agreement": 0.999})
    [reason] = _agreement(_judge(rel, lying))
    assert reason.status == "INCOMPLETE" and "contradicts itself" in reason.message


def test_merged_launches_use_one_launchs_sequences(rel):
    import dataclasses

    good = good_results(rel)
    r = good["infer/tq/w8a8"]
    agree = list(r.samples[infer_metrics.AGREE_SERIES])
    positions = list(r.samples[infer_metrics.POSITIONS_SERIES])
    twice = dataclasses.replace(r, samples={**r.samples, infer_metrics.AGREE_SERIES: agree * 2,
                                            infer_metrics.POSITIONS_SERIES: positions * 2,
                                            "launch_index." + infer_metrics.AGREE_SERIES: [0.0] * 160 + [1.0] * 160})
    [reason] = _agreement(_judge(rel, {**good, "infer/tq/w8a8": twice}))
    assert reason.status == "PASS" and reason.figures["sequences"] == 160


def test_paired_with_the_previous_release(rel):
    good, baseline = good_results(rel), good_results(rel, seed=100)
    same = [r for r in _agreement(_judge(rel, good, baseline)) if "previous release" in r.message]
    assert [r.status for r in same] == ["PASS"] and same[0].figures["change"] == 0
    # another release that gets 20% of its wrong positions elsewhere, same agreement: still no drop
    moved = _set(good, "infer/tq/w8a8", 0.99, flip=0.2)
    [paired] = [r for r in _agreement(_judge(rel, moved, baseline)) if "previous release" in r.message]
    assert paired.status == "PASS" and paired.figures["only_baseline"] > 0
    # a 3-point drop (0.99 -> 0.96) on the same positions fails, though 0.96 clears the 0.9 minimum
    drop = _judge(rel, _set(good, "infer/tq/w8a8", 0.96), baseline)
    minimum, paired = sorted(_agreement(drop), key=lambda r: "previous release" in r.message)
    assert minimum.status == "PASS" and paired.status == "FAIL" and drop.verdict == "FAIL"
    assert paired.figures["p_drop"] < 1e-6 and paired.figures["change_high"] < -0.01
    # other evaluation data: not the same positions, no paired line
    other = _set(good, "infer/tq/w8a8", 0.96, data="e" * 64)
    assert not [r for r in _agreement(_judge(rel, other, baseline)) if "previous release" in r.message]


def test_paired_needs_like_for_like_but_not_the_same_launch_count(rel):
    import dataclasses

    good, baseline = good_results(rel), good_results(rel, seed=100)
    drop = _set(good, "infer/tq/w8a8", 0.96)
    r = drop["infer/tq/w8a8"]
    more_launches = {**drop, "infer/tq/w8a8": dataclasses.replace(r, fingerprint={**r.fingerprint, "launches": 9})}
    assert [x.status for x in _agreement(_judge(rel, more_launches, baseline)) if "previous release" in x.message] \
        == ["FAIL"]
    other_device = {**drop, "infer/tq/w8a8": dataclasses.replace(r, fingerprint={**r.fingerprint, "device": "gpu"})}
    assert not [x for x in _agreement(_judge(rel, other_device, baseline)) if "previous release" in x.message]

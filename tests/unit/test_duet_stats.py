"""The duet interval (gate/duet_stats.py): the launch pair is the block, the side bias is estimated from the
swaps and removed. Simulations of its error rates; each test fails when the formula is mutated (steps counted as
samples, the side bias ignored, z instead of t)."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from qualify.gate.duet_stats import DuetBlock, DuetCall, decide, duet_interval

pytestmark = pytest.mark.unit


def simulate(rng: random.Random, *, pairs: int, effect: float, block_sd: float, step_sd: float = 0.01,
             steps: int = 40, side_bias: float = 0.0) -> list[DuetBlock]:
    """Launch pairs of a duet: a true log effect, a process-level effect per pair (shared by all its steps),
    a side 0 vs side 1 bias, the sides swapped every pair."""
    blocks = []
    for i in range(pairs):
        side = i % 2
        shared = rng.gauss(0, block_sd)
        bias = side_bias if side == 0 else -side_bias
        blocks.append(DuetBlock(side, tuple(math.log1p(effect) + bias + shared + rng.gauss(0, step_sd)
                                            for _ in range(steps))))
    return blocks


def coverage(rng: random.Random, trials: int, **kw) -> float:
    """How often the interval holds the true effect."""
    truth = 1 / (1 + kw["effect"]) - 1  # a step `effect` slower: the throughput change
    hits = 0
    for _ in range(trials):
        iv = duet_interval(simulate(rng, **kw))
        assert iv is not None
        hits += iv.lower <= truth <= iv.upper
    return hits / trials


def test_a_process_level_effect_does_not_inflate_confidence() -> None:
    # 4 pairs x 40 steps: 160 steps, but 4 blocks. A per-pair effect of 3% with 1% step noise: an interval
    # that counted the steps would be ~6x too narrow and miss the truth most of the time.
    rng = random.Random(1)
    cov = coverage(rng, 2000, pairs=4, effect=0.0, block_sd=0.03)
    assert 0.86 <= cov <= 0.94  # nominal 90%


def test_an_identical_candidate_is_rarely_failed_even_with_process_level_effects() -> None:
    rng = random.Random(2)
    fails = sum(decide(duet_interval(simulate(rng, pairs=4, effect=0.0, block_sd=0.03)), 0.05) == DuetCall.FAIL
                for _ in range(2000))
    assert fails / 2000 <= 0.05


def test_a_regression_just_beyond_the_tolerance_is_rarely_passed() -> None:
    # A true 6% regression with a 5% tolerance: PASS needs the upper end within 5%, i.e. a one-sided error
    # of the bound; its rate is at most alpha.
    rng = random.Random(3)
    passes = sum(decide(duet_interval(simulate(rng, pairs=6, effect=0.06, block_sd=0.02)), 0.05) == DuetCall.PASS
                 for _ in range(2000))
    assert passes / 2000 <= 0.05


def test_duet_precision_sees_a_ten_percent_regression_and_passes_identical_code() -> None:
    rng = random.Random(4)
    calls_same = [decide(duet_interval(simulate(rng, pairs=4, effect=0.0, block_sd=0.007)), 0.05)
                  for _ in range(500)]
    calls_slow = [decide(duet_interval(simulate(rng, pairs=4, effect=0.10, block_sd=0.007)), 0.05)
                  for _ in range(500)]
    assert calls_same.count(DuetCall.PASS) / 500 >= 0.95
    assert calls_slow.count(DuetCall.FAIL) / 500 >= 0.95
    assert DuetCall.PASS not in calls_slow


def test_the_side_bias_is_estimated_and_removed_not_assumed_zero() -> None:
    rng = random.Random(5)
    # side 0's cores 8% slower than side 1's; 3 pairs (candidate on side 0 twice, side 1 once): a plain mean of
    # the pairs would carry a third of the bias into the effect.
    estimates, biases = [], []
    for _ in range(500):
        iv = duet_interval(simulate(rng, pairs=3, effect=0.0, block_sd=0.005, side_bias=math.log(1.08)))
        assert iv is not None
        estimates.append(iv.estimate)
        biases.append(iv.side_bias)
    assert abs(statistics.fmean(estimates)) < 0.005
    assert statistics.fmean(biases) == pytest.approx(0.08, abs=0.005)


def test_the_side_bias_interval_holds_the_true_bias() -> None:
    rng = random.Random(6)
    hits = 0
    for _ in range(1000):
        iv = duet_interval(simulate(rng, pairs=6, effect=0.02, block_sd=0.02, side_bias=math.log(1.03)))
        hits += iv.side_bias_lower <= 0.03 <= iv.side_bias_upper
    assert 0.86 <= hits / 1000 <= 0.94


def test_no_interval_without_both_side_assignments_or_enough_pairs() -> None:
    one_side = [DuetBlock(0, (0.01, 0.02)) for _ in range(5)]
    assert duet_interval(one_side) is None  # the side bias cannot be told from the effect
    assert duet_interval([DuetBlock(0, (0.0,)), DuetBlock(1, (0.0,))]) is None  # no df left
    assert decide(None) == DuetCall.UNDECIDED


def test_the_interval_has_the_form_the_decision_rule_takes() -> None:
    iv = duet_interval(simulate(random.Random(7), pairs=4, effect=0.1, block_sd=0.01))
    assert iv is not None and iv.design == "duet" and iv.n == 4 and iv.steps == 160 and iv.df == 2
    assert iv.lower < iv.estimate < iv.upper
    assert iv.confidence == pytest.approx(0.90)


def _block_bootstrap_upper(blocks: list[DuetBlock], rng: random.Random, resamples: int = 300) -> float:
    """A percentile block bootstrap of the balanced effect (resampling pairs within each side group)."""
    g0 = [b.summary for b in blocks if b.candidate_side == 0]
    g1 = [b.summary for b in blocks if b.candidate_side == 1]
    draws = sorted((statistics.fmean(rng.choices(g0, k=len(g0))) + statistics.fmean(rng.choices(g1, k=len(g1)))) / 2
                   for _ in range(resamples))
    return math.expm1(draws[int(0.95 * (resamples - 1))])


def test_why_not_a_block_bootstrap_it_under_covers_with_four_pairs() -> None:
    # The documented reason for the model-based interval: at 4 pairs, a block bootstrap's one-sided 95% bound on
    # the step time misses a true zero effect far more often than 5% (it would PASS regressions it cannot see).
    rng = random.Random(8)
    misses_boot = misses_t = 0
    for _ in range(400):
        blocks = simulate(rng, pairs=4, effect=0.0, block_sd=0.03)
        misses_boot += _block_bootstrap_upper(blocks, rng) < 0.0
        misses_t += duet_interval(blocks).lower > 0.0  # the worst end claims an improvement
    assert misses_boot / 400 > 0.15
    assert misses_t / 400 < 0.09


# --------------------------------------------------------------------------- looks: sampling until decided


def test_the_looks_spend_alpha_once_over_the_whole_schedule() -> None:
    from qualify.gate.duet_stats import Looks

    looks = Looks.for_planned(4)
    assert (looks.planned, looks.budget, looks.points()) == (4, 8, [4, 6, 8])
    shares = [looks.alpha_at(n, 0.05) for n in looks.points()]
    assert all(s > 0 for s in shares) and math.isclose(sum(shares), 0.05)
    assert shares[0] > shares[1] > 0  # Pocock-type: most of it early, where a quiet case can stop
    assert looks.alpha_at(3, 0.05) == 0.0 and looks.alpha_at(5, 0.05) == shares[0]
    assert looks.alpha_at(9, 0.05) == shares[-1]  # past the budget, nothing more is spent


def _sequential_duet(rng: random.Random, effect: float, alpha_at) -> DuetCall:  # noqa: ANN001
    """The runner's rule (execution.duet.run_duet): look after 4 pairs, then every 2 more while undecided, up to
    8; the gate judges the last look at the same level."""
    from qualify.gate.duet_stats import Looks

    looks = Looks.for_planned(4)
    # 12 steps a pair: the units a real duet pair gives (24 timed steps, traded two at a time); the block
    # noise (3%) is what decides, and fewer generated steps keep the 8,600 simulated duets quick.
    blocks = simulate(rng, pairs=looks.budget, effect=effect, block_sd=0.03, steps=12)
    call = DuetCall.UNDECIDED
    for n in looks.points():
        call = decide(duet_interval(blocks[:n], alpha=alpha_at(looks, n)), 0.05)
        if call is not DuetCall.UNDECIDED:
            break
    return call


def test_sampling_until_decided_keeps_the_false_pass_rate_within_alpha_at_the_margin() -> None:
    # A true regression exactly at the margin (throughput -5%: steps 1/0.95 slower) must PASS at most alpha of the
    # time over all looks. Looking at full alpha each time, the same runner passes it more often than alpha.
    margin_effect = 1 / 0.95 - 1
    trials = 4000
    spent = [_sequential_duet(random.Random(k), margin_effect, lambda lk, n: lk.alpha_at(n, 0.05))
             for k in range(trials)]
    naive = [_sequential_duet(random.Random(k), margin_effect, lambda lk, n: 0.05) for k in range(trials)]
    spent_rate, naive_rate = spent.count(DuetCall.PASS) / trials, naive.count(DuetCall.PASS) / trials
    assert spent_rate <= 0.05, spent_rate
    assert naive_rate > 0.055 and naive_rate > spent_rate * 1.3, (naive_rate, spent_rate)


def test_sampling_until_decided_still_decides_a_clear_case() -> None:
    rng = random.Random(11)
    same = [_sequential_duet(rng, 0.0, lambda lk, n: lk.alpha_at(n, 0.05)) for _ in range(300)]
    slow = [_sequential_duet(rng, 0.10, lambda lk, n: lk.alpha_at(n, 0.05)) for _ in range(300)]
    assert DuetCall.FAIL not in same and same.count(DuetCall.PASS) / 300 >= 0.85, same.count(DuetCall.PASS)
    # 3% per-pair noise: measured 92% PASS and 82% FAIL over 1000 seeds (the price of honest looks: 99.9% and 97%
    # at full alpha per look, which passes a regression at the margin 11% of the time)
    assert DuetCall.PASS not in slow and slow.count(DuetCall.FAIL) / 300 >= 0.75, slow.count(DuetCall.FAIL)

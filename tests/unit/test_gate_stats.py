"""The regression statistics, proved by simulation (fixed seeds, so the rates are exact)."""

from __future__ import annotations

import pytest
from scipy.stats import mannwhitneyu

from benchmarks import gate_simulation
from qualify.gate import stats
from qualify.manifest import RegressionPolicy

TRIALS = 1000


def test_a_true_10pct_regression_is_caught_at_least_95pct():
    # 5 samples a side, 3% noise (a quiet run on this machine), true regression 10%
    rate = gate_simulation.simulate(effect=0.10, noise=0.03, n=5, trials=TRIALS, seed=20250601)
    assert rate >= 0.95, rate


def test_a_also_for_lower_is_better_metrics():
    rate = gate_simulation.simulate(effect=0.10, noise=0.03, n=5, trials=TRIALS // 2, seed=7, direction="lower")
    assert rate >= 0.95, rate


def test_b_same_distribution_is_flagged_at_most_5pct():
    rate = gate_simulation.simulate(effect=0.0, noise=0.03, n=5, trials=TRIALS, seed=20250602)
    assert rate <= 0.05, rate


def test_b_is_bounded_by_the_exact_test_at_this_machines_worst_noise():
    # 20% noise: the ratio condition no longer filters much, but the exact one-sided test keeps
    # false alarms at P(U <= 4) = 12/252 = 4.8% whatever the spread. The bound allows for the
    # sampling error of 2000 trials (3 standard errors, about 1.4%).
    rate = gate_simulation.simulate(effect=0.0, noise=0.20, n=5, trials=2 * TRIALS, seed=11)
    assert rate <= 12 / 252 + 3 * (12 / 252 * (1 - 12 / 252) / (2 * TRIALS)) ** 0.5, rate


def test_tolerance_equal_to_the_effect_would_miss_half():
    # Why the tolerance must sit between noise and effect: at max_regression = 0.10 a true 10%
    # regression is seen on only about half the trials (observed medians scatter around 10%).
    rate = gate_simulation.simulate(effect=0.10, noise=0.03, n=5, trials=300, seed=3, max_regression=0.10)
    assert 0.3 < rate < 0.7, rate


def test_policy_values_used_by_the_simulation_are_valid_policy_values():
    policy = RegressionPolicy(max_regression=stats.RECOMMENDED_MAX_REGRESSION, alpha=stats.RECOMMENDED_ALPHA,
                              min_samples=stats.RECOMMENDED_MIN_SAMPLES, noise_floor=stats.RECOMMENDED_NOISE_FLOOR)
    assert policy.max_regression < 0.10 < policy.noise_floor


def test_exact_mann_whitney_minimum_p_for_5_vs_5():
    cand, base = [1, 2, 3, 4, 5], [6, 7, 8, 9, 10]
    p = stats.mann_whitney_worse(cand, base, "higher")
    assert p == pytest.approx(1 / 252)
    assert p == pytest.approx(mannwhitneyu(cand, base, alternative="less", method="exact").pvalue)
    # lower-is-better: the candidate being larger is worse
    assert stats.mann_whitney_worse(base, cand, "lower") == pytest.approx(1 / 252)
    assert stats.mann_whitney_worse(base, cand, "higher") > 0.99


def test_compare_samples_figures_and_messages():
    cmp = stats.compare_samples([89.5, 90, 91, 89, 92], [99.5, 100, 101, 99, 102], "higher", metric="tokens_per_s",
                                test="mann-whitney")
    assert cmp.regressed and cmp.method == "mann-whitney"
    assert cmp.worse == pytest.approx(0.10) and cmp.ratio == pytest.approx(0.9)
    assert "tokens_per_s" == cmp.metric and "significant" in cmp.message
    figures = cmp.figures()
    assert "message" not in figures and figures["p_value"] == pytest.approx(1 / 252)


def test_few_samples_ratio_only():
    cmp = stats.compare_samples([80, 81], [100, 100, 100], "higher", noise_floor=0.25)
    assert cmp.method == "ratio-only" and not cmp.regressed and cmp.tolerance == 0.25
    assert "too few" in cmp.message
    cmp = stats.compare_samples([70], [100], "higher", noise_floor=0.25)
    assert cmp.regressed


@pytest.mark.parametrize("cand,base,why", [([], [1.0], "no candidate samples"), ([1.0], [], "no baseline samples"),
                                           ([1.0], [0.0], "baseline median is 0")])
def test_cannot_compare(cand, base, why):
    cmp = stats.compare_samples(cand, base, "higher")
    assert cmp.method == "none" and not cmp.regressed and why in cmp.message


def test_non_finite_samples_are_ignored():
    cmp = stats.compare_samples([float("nan"), 100.0, 101.0], [100.0, float("inf"), 99.0], "higher")
    assert cmp.n_candidate == 2 and cmp.n_baseline == 2 and not cmp.regressed


@pytest.mark.parametrize("effect,noise,n", [(0.10, 0.03, 5), (0.0, 0.20, 5), (0.10, 0.10, 3), (0.05, 0.05, 8)])
def test_vectorised_benchmark_rule_matches_compare_samples(effect, noise, n):
    kwargs = dict(effect=effect, noise=noise, n=n, trials=200, seed=42)
    assert (gate_simulation.simulate_flags(**kwargs) == gate_simulation.simulate_flags_fast(**kwargs)).all()

"""The regression rule (qualify.gate.noninferiority, qualify.gate.stats): each formula pinned by a figure that a
mutation changes, and the error rates under repeated looking proved by simulation (fixed seeds)."""

from __future__ import annotations

import math
import statistics

import pytest
from scipy.stats import t as student_t

from benchmarks import gate_simulation
from qualify.gate import calibration
from qualify.gate import noninferiority as ni
from qualify.gate import stats

# Five pair changes around -2% (log ratios, positive = candidate better): mean -0.02, sd 0.0158.
LOGS = [-0.04, -0.03, -0.02, -0.01, 0.0]


def _bounds(logs: list[float], alpha: float) -> tuple[float, float]:
    """The textbook one-sided Student-t bounds, written out independently of the library."""
    n = len(logs)
    half = float(student_t.ppf(1 - alpha, n - 1)) * statistics.stdev(logs) / math.sqrt(n)
    return statistics.fmean(logs) - half, statistics.fmean(logs) + half


# --------------------------------------------------------------------------- formulas (mutations)


def _with(mean: float, sd: float) -> list[float]:
    """Five log ratios with exactly this mean and sample standard deviation."""
    return [mean + sd * k / math.sqrt(2.5) for k in (-2, -1, 0, 1, 2)]


def test_interval_uses_n_minus_1_degrees_of_freedom_and_a_one_sided_level() -> None:
    iv = ni.interval_from_log_ratios(LOGS, alpha=0.05)
    low, high = _bounds(LOGS, 0.05)
    assert iv is not None and iv.lower == pytest.approx(low, abs=1e-12) and iv.upper == pytest.approx(high, abs=1e-12)
    # df n-1 -> n+10 narrows the bound by 20%; a two-sided 95% interval (t at 0.975) widens it by 29%.
    wrong_df = float(student_t.ppf(0.95, len(LOGS) + 10))
    two_sided = float(student_t.ppf(0.975, len(LOGS) - 1))
    right = float(student_t.ppf(0.95, len(LOGS) - 1))
    half = iv.upper - iv.estimate
    assert half != pytest.approx(half * wrong_df / right, rel=0.05)
    assert half != pytest.approx(half * two_sided / right, rel=0.05)


def test_the_decision_rests_on_the_one_sided_bound_at_this_margin() -> None:
    # Pairs chosen so that the one-sided 95% worst end sits just inside -5% (PASS), while a two-sided
    # 95% bound or n+10 degrees of freedom would move it across: the decision changes with the formula.
    logs = _with(mean=-0.03, sd=0.02)
    iv = ni.interval_from_log_ratios(logs, alpha=0.05)
    assert iv is not None
    assert ni.decide(iv, 0.05) is ni.Decision.PASS
    two_sided_low = statistics.fmean(logs) - float(student_t.ppf(0.975, 4)) * statistics.stdev(logs) / math.sqrt(5)
    assert two_sided_low < ni.margin(0.05)  # a two-sided interval would not PASS: the test pins one-sided
    narrow = ni.interval_from_log_ratios(logs, alpha=0.05)
    assert narrow is not None and narrow.lower > ni.margin(0.05) > two_sided_low


def test_df_mutation_changes_a_decision() -> None:
    # The worst end with n-1 df is just beyond -5% (undecided); with n+10 df it would be inside (PASS).
    logs = _with(mean=-0.03, sd=0.025)
    iv = ni.interval_from_log_ratios(logs, alpha=0.05)
    assert iv is not None and ni.decide(iv, 0.05) is ni.Decision.UNDECIDED
    mean, sd = statistics.fmean(logs), statistics.stdev(logs)
    assert mean - float(student_t.ppf(0.95, 15)) * sd / math.sqrt(5) > ni.margin(0.05)


@pytest.mark.parametrize("direction, cand, base", [("higher", 90.0, 100.0), ("lower", 110.0, 100.0)])
def test_direction_a_worse_candidate_is_a_negative_change(direction: str, cand: float, base: float) -> None:
    # Swapping or ignoring the direction turns the regression into a gain: FAIL becomes PASS.
    spread = [1.0, 1.01, 0.99, 1.005, 0.995]
    cmp = stats.compare_pairs([cand * s for s in spread], [base for _ in spread], direction,  # type: ignore[arg-type]
                              max_regression=0.05, min_samples=3, max_launches=5)
    assert cmp.decision is ni.Decision.FAIL, cmp.message
    assert cmp.outcome is not None and cmp.outcome.interval.change < -0.05


def test_one_scale_a_ten_percent_drop_is_minus_ten_in_every_mode() -> None:
    # change = candidate / baseline - 1 (better direction): 90 vs 100 is -10.0%, not -11.1% (log dropped,
    # or baseline / candidate - 1, would say otherwise); for a latency 100 -> 111.1 is also -10.0%.
    spread = [1.0, 1.001, 0.999, 1.0005]
    paired = stats.compare_pairs([90.0 * s for s in spread], [100.0] * 4, "higher", min_samples=3, max_launches=4)
    history = stats.compare_history([90.0 * s for s in spread], [100.0 * s for s in spread], "higher",
                                     variation=ni.RunVariation(0.001, 10), min_samples=3, max_launches=4)
    latency = stats.compare_pairs([100 / 0.9 * s for s in spread], [100.0] * 4, "lower", min_samples=3,
                                  max_launches=4)
    for cmp in (paired, history, latency):
        assert cmp.outcome is not None
        assert cmp.outcome.interval.change == pytest.approx(-0.10, abs=0.002), cmp.message
    assert "-10.0%" in paired.message and "-10.0%" in history.message


def test_the_log_scale_mean_is_not_the_mean_of_ratios() -> None:
    # Pair ratios 0.5 and 2.0: on logs they cancel (change 0); averaging ratios would say +25%.
    iv = ni.interval_from_log_ratios([math.log(0.5), math.log(2.0)], alpha=0.05)
    assert iv is not None and iv.change == pytest.approx(0.0, abs=1e-12)


def test_history_adds_the_run_to_run_variation() -> None:
    # Launches within each run agree to 1%; calibration says runs differ by 5%. An 8% gap between two runs
    # is then not shown to be a regression (treating the launches as independent would FAIL it).
    cand = [92.0, 92.5, 91.6, 92.2]
    base = [100.0, 100.4, 99.7, 100.2]
    calibrated = stats.compare_history(cand, base, "higher", variation=ni.RunVariation(0.05, 9), min_samples=3,
                                       max_launches=4)
    independent = stats.compare_history(cand, base, "higher", variation=ni.RunVariation(0.0, 1e9),
                                        min_samples=3, max_launches=4)
    assert independent.decision is ni.Decision.FAIL
    assert calibrated.decision is ni.Decision.UNDECIDED, calibrated.message
    assert calibrated.outcome is not None and calibrated.outcome.needed is None  # more launches cannot help
    assert "no number of launches" in calibrated.message


def test_history_without_a_calibration_cannot_pass() -> None:
    same = [100.0, 100.1, 99.9]
    cmp = stats.compare_history(same, same, "higher", variation=None)
    assert cmp.decision is ni.Decision.UNDECIDED and cmp.outcome is None
    assert "calibrate" in cmp.message and "use paired" in cmp.message


def test_fewer_units_than_the_first_look_never_decide() -> None:
    # No noise-floor shortcut: 2 pairs 15% apart with min_samples 3 are undecided, never PASS or FAIL.
    cmp = stats.compare_pairs([85.0, 85.0], [100.0, 100.0], "higher", min_samples=3, max_launches=8)
    assert cmp.decision is ni.Decision.UNDECIDED and "min_samples" in cmp.message


def test_pass_and_fail_bounds_and_undecided() -> None:
    make = lambda lo, hi: ni.Interval(0.0, lo, hi, 5, "t", "pairs", 0.05)  # noqa: E731
    m = ni.margin(0.05)
    assert ni.decide(make(m, 0.1), 0.05) is ni.Decision.PASS
    assert ni.decide(make(m - 1e-9, 0.1), 0.05) is ni.Decision.UNDECIDED
    assert ni.decide(make(m - 0.1, m - 1e-9), 0.05) is ni.Decision.FAIL


def test_spending_sums_to_alpha_and_is_pocock_type() -> None:
    plan = ni.Plan(3, 8, 0.05)
    levels = [ni.look_alpha(plan, n) for n in range(3, 9)]
    assert sum(levels) == pytest.approx(0.05)
    assert levels[0] == pytest.approx(0.05 * math.log(1 + (math.e - 1) * 3 / 8))
    assert ni.look_alpha(plan, 2) == 0.0 and ni.look_alpha(plan, 12) == levels[-1]


def test_gain_uses_the_same_rule() -> None:
    base = [100.0, 101.0, 99.0, 100.5]
    met = stats.gain_outcome([130.0, 131.0, 129.5, 130.4], base, "higher", required=0.2)
    missed = stats.gain_outcome([105.0, 105.5, 104.6, 105.2], base, "higher", required=0.2)
    assert met is not None and met.judgement == "met"
    assert missed is not None and missed.judgement == "missed"


def test_calibration_separates_the_run_offset_from_the_launch_spread() -> None:
    runs = [[100.0, 101.0, 99.0], [110.0, 111.0, 109.0], [90.0, 91.0, 89.0], [100.0, 101.0, 99.0]]
    v = calibration.run_variation(runs)
    means = [statistics.fmean(math.log(x) for x in r) for r in runs]
    within = statistics.fmean(statistics.variance([math.log(x) for x in r]) / 3 for r in runs)
    assert v is not None and v.sd_run == pytest.approx(math.sqrt(statistics.variance(means) - within))
    assert v.df == 3
    assert calibration.run_variation([[100.0, 100.0]]) is None


# --------------------------------------------------------------------------- error rates (simulation)

TRIALS = 400
SLACK = 3 * math.sqrt(0.05 * 0.95 / TRIALS)  # three standard errors of a 5% rate


@pytest.mark.parametrize("noise", [0.02, 0.10])
def test_paired_sequential_false_pass_and_false_fail_stay_below_alpha(noise: float) -> None:
    slow = gate_simulation.simulate_paired(drop=0.10, noise=noise, offset=0.03, trials=TRIALS, seed=1)
    same = gate_simulation.simulate_paired(drop=0.0, noise=noise, offset=0.03, trials=TRIALS, seed=2)
    assert slow.pass_rate <= 0.05 + SLACK, slow
    assert same.fail_rate <= 0.05 + SLACK, same
    if noise == 0.02:  # and it decides: a quiet identical candidate PASSes, a 10% drop FAILs
        assert same.pass_rate > 0.8 and slow.fail_rate > 0.8


def test_futility_stops_what_the_budget_cannot_decide_and_adds_no_false_decision() -> None:
    # 10% launch noise, paired: deciding at a 5% margin needs far more than 8 pairs (this machine's paired regime).
    kw = dict(noise=0.10, offset=0.03, trials=TRIALS)
    same, same_full = (gate_simulation.simulate_paired(drop=0.0, seed=5, **kw),
                       gate_simulation.simulate_paired(drop=0.0, seed=5, futile_factor=math.inf, **kw))
    slow = gate_simulation.simulate_paired(drop=0.10, seed=6, **kw)
    assert same.mean_units < 4.5 and same_full.mean_units > 7.0, (same, same_full)  # it stops at the first looks
    assert same.fail_rate <= 0.05 + SLACK and slow.pass_rate <= 0.05 + SLACK, (same, slow)
    margin = gate_simulation.simulate_paired(drop=0.05, seed=7, **kw)  # on the margin: never PASSed more often
    margin_full = gate_simulation.simulate_paired(drop=0.05, seed=7, futile_factor=math.inf, **kw)
    assert margin.pass_rate <= margin_full.pass_rate + SLACK and margin.pass_rate <= 0.05 + SLACK


def test_futility_costs_next_to_nothing_where_the_budget_decides() -> None:
    # 3% launch noise: an identical candidate needs about the budget; the futility stop must leave its PASS rate.
    kw = dict(drop=0.0, noise=0.03, offset=0.03, trials=TRIALS, seed=8)
    with_stop = gate_simulation.simulate_paired(**kw)
    without = gate_simulation.simulate_paired(futile_factor=math.inf, **kw)
    assert with_stop.pass_rate >= without.pass_rate - 0.04, (with_stop, without)
    assert with_stop.mean_units <= without.mean_units


def test_the_futility_stop_says_what_deciding_would_need() -> None:
    from qualify.gate import sequential

    block = sequential.spec(metric="tokens_per_s", direction="higher", mode="paired", max_regression=0.05,
                            alpha=0.05, min_samples=3, max_launches=8)
    cand, base = [100.0, 112.0, 90.0], [100.0, 92.0, 110.0]  # pair ratios 1.0, 1.22, 0.82: a 20% spread
    step = sequential.next_step(block, cand, base)
    assert not step.more and "more than 4 times the budget of 8" in step.reason, step
    needed = int(step.reason.split("needs about ")[1].split()[0])
    assert needed > 32
    assert sequential.next_step(block, cand, base, futile_factor=needed / 8 + 0.01).more  # just under: go on
    quiet = sequential.next_step(block, [100.0, 101.0, 99.0], [100.0, 100.5, 99.5])
    assert not quiet.more and quiet.reason.startswith("decided (pass)"), quiet


def test_history_with_run_offsets_keeps_its_false_fail_rate_and_the_mutation_does_not() -> None:
    # 2% launch noise, 10% run-level offset: every launch of a run shares its offset (the scenario).
    calibrated = gate_simulation.simulate_history(drop=0.0, noise=0.02, offset=0.10, trials=TRIALS, seed=3)
    independent = gate_simulation.simulate_history(drop=0.0, noise=0.02, offset=0.10, trials=TRIALS, seed=3,
                                                   independent=True)
    assert calibrated.fail_rate <= 0.05 + SLACK, calibrated
    assert independent.fail_rate > 0.15, independent  # launches as independent units: false FAILs


def test_history_with_run_offsets_never_passes_a_ten_percent_drop_more_than_alpha() -> None:
    slow = gate_simulation.simulate_history(drop=0.10, noise=0.02, offset=0.03, trials=TRIALS, seed=4)
    assert slow.pass_rate <= 0.05 + SLACK, slow


def test_welch_degrees_of_freedom_are_scale_free_and_survive_tiny_variances() -> None:
    parts = [(0.04, 2.0), (0.01, 4.0), (0.02, 5.0)]
    expected = sum(v for v, _ in parts) ** 2 / sum(v ** 2 / d for v, d in parts)  # the textbook form
    assert ni.welch_df(parts) == pytest.approx(expected, rel=1e-12)
    tiny = [(v * 1e-270, d) for v, d in parts]  # v**2 underflows to 0: the textbook form divides by zero
    assert ni.welch_df(tiny) == pytest.approx(expected, rel=1e-9)
    assert ni.welch_df([(0.0, 3.0)]) == 1e6


def test_remembered_quantiles_are_scipys_for_every_p_and_df() -> None:
    # gate/quantiles.py remembers its values: a key that dropped df or p would hand one interval another's width.
    from scipy.stats import norm

    from qualify.gate.quantiles import normal_cdf, normal_quantile, t_quantile

    for p, df in [(0.95, 4), (0.95, 5), (0.975, 4), (0.95, 4), (0.8, 12.5), (0.95, 1e6)]:
        assert t_quantile(p, df) == float(student_t.ppf(p, df))
    for p in (0.95, 0.8, 0.95, 0.99):
        assert normal_quantile(p) == float(norm.ppf(p))
    for z in (-8.0, -1.6448536, 0.0, 0.3, 2.5):
        assert normal_cdf(z) == pytest.approx(float(norm.cdf(z)), rel=1e-12, abs=1e-300)


def test_the_benchmark_reads_each_modes_change() -> None:
    # benchmarks/paired_vs_history.py printed "n/a" for every history and paired case: their reasons carry
    # `change`, a duet's `estimate`.
    from benchmarks.paired_vs_history import _change

    assert _change({"estimate": -0.093, "change": 0.5}) == -0.093
    assert _change({"change": -0.09, "change_worst": -0.2}) == -0.09
    assert _change({"ratio": 1.1}) == 1.1 and _change({}) is None

"""Canonical metric names and which way is better.

Workloads report flat metrics (see qualify.workloads.protocol); the gate needs
their direction to tell a regression from an improvement.
"""

from __future__ import annotations

from typing import Literal

Direction = Literal["higher", "lower"]

# Regression-gate defaults (the manifest's gate.regression; the rule is qualify.gate.noninferiority,
# its error rates are simulated by benchmarks/sequential_rule.py): a PASS shows that the change is no
# worse than -5%; alpha bounds each of a false PASS and a false FAIL over all the sequential looks;
# the first look is after 3 launches (pairs), the last at the budget of 8.
RECOMMENDED_MAX_REGRESSION = 0.05
RECOMMENDED_ALPHA = 0.05
RECOMMENDED_MIN_SAMPLES = 3
RECOMMENDED_MAX_LAUNCHES = 8
# Timed steps of each side's launch in a duet (execution.duet.with_duet_steps; measured on this machine by
# benchmarks/paired_vs_history.py): what a launch pair's summary needs to be steady, not what a case needs.
RECOMMENDED_DUET_STEPS = 24

METRICS: dict[str, Direction] = {
    # training
    "tokens_per_s": "higher",
    "tokens_per_s_per_device": "higher",
    "tflops_per_device": "higher",
    "mfu": "higher",
    "step_time_s_median": "lower",
    "step_time_s_p10": "lower",
    "step_time_s_p90": "lower",
    "peak_memory_bytes": "lower",  # the training peak, from after warm-up
    "setup_peak_memory_bytes": "lower",
    "compile_time_s": "lower",
    "loss_first": "lower",
    "loss_last": "lower",
    "cv_tokens_per_s": "lower",
    # inference
    "load_time_s": "lower",
    "quantize_time_s": "lower",
    "output_tokens_per_s": "higher",
    "latency_s_p50": "lower",
    "latency_s_p90": "lower",
    "latency_s_p99": "lower",
    "ttft_s_p50": "lower",
    "ttft_s_p90": "lower",
    "ttft_s_p99": "lower",
    "tpot_s_p50": "lower",
    "tpot_s_p90": "lower",
    "tpot_s_p99": "lower",
    "itl_s_p50": "lower",
    "token_agreement": "higher",
    "topk_overlap": "higher",
    "kl_div_mean": "lower",
    "perplexity": "lower",
    "perplexity_delta": "lower",
    "weight_bytes": "lower",  # the quantized linear layers' weights as stored
    "weight_bytes_ratio": "lower",  # weight_bytes / the same weights unquantized
    "quantized_share": "higher",  # share of the targeted linear weights really quantized
    "model_weight_bytes": "lower",
    # sleep (overhead benchmark) and generic
    "wall_s": "lower",
}

def direction(metric: str) -> Direction:
    try:
        return METRICS[metric]
    except KeyError:
        raise KeyError(f"unknown metric {metric!r}") from None


def is_known(metric: str) -> bool:
    return metric in METRICS

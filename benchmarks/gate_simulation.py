"""Monte-Carlo simulation of the gate's sequential non-inferiority rule, through the gate's own functions.

Used by benchmarks/gate_stats.py (the table) and by tests/unit/test_gate_stats.py (the error rates under
repeated looking). Not part of the library: nothing at run time needs it.

Model (log scale, throughput, higher is better): a launch's log figure is
``truth + run offset + launch noise``; the candidate's truth is ``log(1 - drop)``. Launch noise is
normal with sd ``noise``; every launch of one run shares that run's offset (sd ``offset``).

* paired: the candidate and the baseline launch back to back in the SAME run, so the offset cancels in
  each pair's ratio; the runner looks after each pair from the plan's first to its budget with the runner's own
  callback (gate.sequential.next_step: its futility stop included), the gate judges what it stopped at
  (stats.compare_pairs).
* history: two runs, each with its own offset; the run-to-run variation is estimated by a calibration of
  ``calibration_runs`` A/A runs (calibration.run_variation) as `qualify calibrate` does; the runner adds
  candidate launches the same way (stats.compare_history).

``futile_factor``: the runner's futility stop (gate.sequential.FUTILE_FACTOR); math.inf turns it off (the rule as it
was, to compare).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from qualify.gate import calibration
from qualify.gate import noninferiority as ni
from qualify.gate import sequential, stats


@dataclass
class Counts:
    trials: int = 0
    passed: int = 0
    failed: int = 0
    undecided: int = 0
    units: int = 0

    def add(self, decision: ni.Decision, n: int) -> None:
        self.trials += 1
        self.units += n
        self.passed += decision is ni.Decision.PASS
        self.failed += decision is ni.Decision.FAIL
        self.undecided += decision is ni.Decision.UNDECIDED

    @property
    def pass_rate(self) -> float:
        return self.passed / self.trials

    @property
    def fail_rate(self) -> float:
        return self.failed / self.trials

    @property
    def mean_units(self) -> float:
        return self.units / self.trials


def _run(rng: random.Random, truth: float, offset: float, noise: float, n: int) -> list[float]:
    shift = rng.gauss(0.0, offset) if offset else 0.0
    return [math.exp(truth + shift + rng.gauss(0.0, noise)) for _ in range(n)]


def _block(mode: str, *, first: int, budget: int, max_regression: float, alpha: float,
           baseline: list[float] | None = None, variation: ni.RunVariation | None = None) -> dict:
    return sequential.spec(metric="tokens_per_s", direction="higher", mode=mode, max_regression=max_regression,
                           alpha=alpha, min_samples=first, max_launches=budget, baseline=baseline, variation=variation)


def simulate_paired(*, drop: float, noise: float, offset: float, trials: int, seed: int, first: int = 3,
                    budget: int = 8, max_regression: float = 0.05, alpha: float = 0.05,
                    futile_factor: float = sequential.FUTILE_FACTOR) -> Counts:
    rng = random.Random(seed)
    block = _block("paired", first=first, budget=budget, max_regression=max_regression, alpha=alpha)
    counts = Counts()
    truth = math.log1p(-drop)
    for _ in range(trials):
        shift = rng.gauss(0.0, offset) if offset else 0.0  # one run: both sides share it
        cand: list[float] = []
        base: list[float] = []
        while True:
            cand.append(math.exp(truth + shift + rng.gauss(0.0, noise)))
            base.append(math.exp(shift + rng.gauss(0.0, noise)))
            if not sequential.next_step(block, cand, base, futile_factor=futile_factor).more:
                break
        cmp = stats.compare_pairs(cand, base, "higher", max_regression=max_regression, alpha=alpha,
                                  min_samples=first, max_launches=budget)
        counts.add(cmp.decision, len(cand))
    return counts


def simulate_history(*, drop: float, noise: float, offset: float, trials: int, seed: int, first: int = 3,
                     budget: int = 8, max_regression: float = 0.05, alpha: float = 0.05,
                     calibration_runs: int = 6, independent: bool = False,
                     futile_factor: float = sequential.FUTILE_FACTOR) -> Counts:
    """independent=True: the mutation that treats one run's launches as independent (no run-to-run part)."""
    rng = random.Random(seed)
    counts = Counts()
    truth = math.log1p(-drop)
    for _ in range(trials):
        variation = (ni.RunVariation(0.0, 1e9) if independent else
                     calibration.run_variation([_run(rng, 0.0, offset, noise, first)
                                                for _ in range(calibration_runs)]))
        assert variation is not None
        base = _run(rng, 0.0, offset, noise, first)
        shift = rng.gauss(0.0, offset) if offset else 0.0
        block = _block("history", first=first, budget=budget, max_regression=max_regression, alpha=alpha,
                       baseline=base, variation=variation)
        cand: list[float] = []
        while True:
            cand.append(math.exp(truth + shift + rng.gauss(0.0, noise)))
            if not sequential.next_step(block, cand, futile_factor=futile_factor).more:
                break
        cmp = stats.compare_history(cand, base, "higher", variation=variation, max_regression=max_regression,
                                    alpha=alpha, min_samples=first, max_launches=budget)
        counts.add(cmp.decision, len(cand))
    return counts

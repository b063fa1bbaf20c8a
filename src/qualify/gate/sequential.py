"""Sample until decided: the runner's question "another launch (pair)?", as a pure function of plain data.

The driver puts a ``sequential`` block into the case document (:func:`spec`), built from the policy and,
in history mode, the baseline run's launch figures and the fingerprint's calibrated run-to-run variation.
The case's one Ray task runs its planned launches, then asks :func:`next_step` after each further launch
(or pair) whether to go on, up to ``max_launches``: it stops as soon as the gate's decision at that look is
PASS or FAIL (qualify.gate.noninferiority: the same interval, at the look's alpha-spending level, that
the gate judges afterwards). The merged result records how many launches ran and why they stopped
(environment ``sequential``), which the verdict and `runs show` repeat.

No block (regression disabled, no regression metric for the kind, a multi-node case, history mode without
a baseline or a calibration): the planned launches only, said so.

Futility: at a look, an undecided comparison whose spread means deciding would take more than FUTILE_FACTOR times
the budget (noninferiority.units_needed, at the observed spread) stops there, INCOMPLETE, instead of spending the
rest of the budget on a decision it cannot reach. A futility stop never decides anything, so it cannot add a false
PASS or FAIL; what it costs is the cases that the rest of the budget would have decided although the first looks
made their spread seem wider than it is. The factor keeps that small: at the first look (3 units, 2 degrees of
freedom) a spread over-estimated enough to make needed > 4 x budget when the truth needs the budget is about a 2%
event (chi-square with 2 degrees of freedom beyond 8). Simulated with the rest of the rule in
benchmarks/gate_simulation.py (600 trials each, 3% run offset, budget 8): an identical candidate paired with 10%
launch noise took 3.6 pairs on average instead of 7.6, 3% noise 5.5 instead of 6.1, with PASS rates within the
simulation's noise of the rule without it (0.617 against 0.628 at 3%); a candidate at the margin PASSed less often,
never more (tests/unit/test_gate_stats.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from qualify.gate import noninferiority as ni
from qualify.gate import stats
from qualify.metrics import Direction

KEY = "sequential"
# Stop an undecided comparison when deciding needs more than this many times the budget (module docstring).
FUTILE_FACTOR = 4.0


def spec(*, metric: str, direction: Direction, mode: str, max_regression: float, alpha: float, min_samples: int,
         max_launches: int, baseline: Sequence[float] | None = None,
         variation: ni.RunVariation | None = None) -> dict[str, Any]:
    """The case document's ``sequential`` block (JSON-safe)."""
    return {"metric": metric, "direction": direction, "mode": mode, "max_regression": max_regression,
            "alpha": alpha, "min_samples": min_samples, "max_launches": max_launches,
            "baseline": list(baseline) if baseline is not None else None,
            "variation": {"sd_run": variation.sd_run, "df": variation.df} if variation else None}


@dataclass(frozen=True)
class Step:
    more: bool
    reason: str


def _comparison(block: Mapping[str, Any], candidate: Sequence[float],
                paired_baseline: Sequence[float] | None) -> stats.Comparison:
    common = dict(metric=block["metric"], max_regression=block["max_regression"], alpha=block["alpha"],
                  min_samples=block["min_samples"], max_launches=block["max_launches"])
    if block["mode"] == "paired":
        return stats.compare_pairs(candidate, paired_baseline or [], block["direction"], **common)
    var = block.get("variation")
    variation = ni.RunVariation(float(var["sd_run"]), float(var["df"])) if var else None
    return stats.compare_history(candidate, block.get("baseline") or [], block["direction"], variation=variation,
                                 **common)


def next_step(block: Mapping[str, Any], candidate: Sequence[float | None],
              paired_baseline: Sequence[float | None] | None = None, *,
              futile_factor: float = FUTILE_FACTOR) -> Step:
    """After n = len(candidate) launches (pairs): another one? Never past max_launches, whatever the figures say;
    not when deciding would need more than futile_factor times the budget (the module docstring says why).

    `candidate` (and `paired_baseline`) hold one figure per launch run, None where the launch did not report the
    metric: the budget counts launches, not figures, so a metric no launch reports cannot keep the loop going
    (it did: a paired synthetic case without the metric ran 583 launches against a budget of 4)."""
    n = len(candidate)
    budget = int(block["max_launches"])
    unit = "pairs" if block["mode"] == "paired" else "launches"
    missing = [k + 1 for k, v in enumerate(candidate) if v is None]
    missing += [k + 1 for k, v in enumerate(paired_baseline or []) if v is None and k + 1 not in missing]
    if missing:
        return Step(False, f"no decision to wait for: {block['metric']} missing from launch(es) "
                           f"{', '.join(map(str, sorted(missing)))}")
    if n < int(block["min_samples"]):
        if n >= budget:
            return Step(False, f"the budget of {budget} {unit} is spent before the first look")
        return Step(True, f"{n} launches, below the first look at {block['min_samples']}")
    cmp = _comparison(block, [float(v) for v in candidate if v is not None],
                      [float(v) for v in paired_baseline if v is not None] if paired_baseline is not None else None)
    if cmp.outcome is None:
        return Step(False, f"no decision to wait for: {cmp.problem}")
    if cmp.decision is not ni.Decision.UNDECIDED:
        return Step(False, f"decided ({cmp.decision.value}) after {n} {unit}")
    if n >= budget:
        return Step(False, f"still undecided at the budget of {budget} {unit} (gate.regression.max_launches)")
    if cmp.outcome.needed is None:
        return Step(False, f"undecided after {n} {unit}, and no number of {unit} would decide it here "
                           "(the run-to-run variation alone is too wide)")
    if cmp.outcome.needed > futile_factor * budget:
        return Step(False, f"undecided after {n} {unit}, and deciding needs about {cmp.outcome.needed} {unit} at "
                           f"this spread, more than {futile_factor:g} times the budget of {budget}")
    return Step(True, f"undecided after {n} {unit}")

"""Error rates of the gate's sequential non-inferiority rule (qualify.gate.noninferiority), by simulation.

    python benchmarks/gate_stats.py [--trials N] [--seed S]

For paired and history mode, 2% and 10% launch noise, with and without a 3% run-level offset (shared by
all launches of one run), and a true drop of 0%, 5% and 10%, prints how often the gate decides PASS, FAIL
and undecided (INCOMPLETE at the budget of 8 launches) with the default policy (max_regression 5%,
alpha 5%, first look at 3, budget 8), and the launches (pairs) used on average. The simulation runs
the gate's own functions (benchmarks/gate_simulation.py), looks included.

The errors: at a 0% drop a FAIL is false (the bound: alpha = 5%); at a 10% drop a PASS is false
(bound 5%); at 5% (on the margin) both PASS and FAIL must stay at or below 5%.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from benchmarks import gate_simulation  # noqa: E402

NOISES = (0.02, 0.10)
OFFSETS = (0.0, 0.03)
DROPS = (0.0, 0.05, 0.10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=20261201)
    args = parser.parse_args()
    print(f"policy: max_regression 5%, alpha 5%, looks at 3..8 launches (Pocock-type alpha spending); "
          f"{args.trials} trials per cell, seed {args.seed}")
    print(f"{'mode':<8} {'noise':>5} {'offset':>6} {'drop':>5} {'PASS':>7} {'FAIL':>7} {'undecided':>9} "
          f"{'units':>6}  error")
    start = time.monotonic()
    k = 0
    for mode, simulate in (("paired", gate_simulation.simulate_paired),
                           ("history", gate_simulation.simulate_history)):
        for noise in NOISES:
            for offset in OFFSETS:
                for drop in DROPS:
                    k += 1
                    c = simulate(drop=drop, noise=noise, offset=offset, trials=args.trials, seed=args.seed + k)
                    error = {0.0: f"false FAIL {c.fail_rate:.1%}", 0.10: f"false PASS {c.pass_rate:.1%}"}.get(
                        drop, f"on the margin: PASS {c.pass_rate:.1%}, FAIL {c.fail_rate:.1%}")
                    print(f"{mode:<8} {noise:>5.0%} {offset:>6.0%} {drop:>5.0%} {c.pass_rate:>7.1%} "
                          f"{c.fail_rate:>7.1%} {c.undecided / c.trials:>9.1%} {c.mean_units:>6.2f}  {error}")
    print(f"({time.monotonic() - start:.0f} s; history mode's run-to-run variation from a 6-run calibration "
          "per trial)")


if __name__ == "__main__":
    main()

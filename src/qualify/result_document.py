"""The merged result document's sample keys: the format the runners write and the gate reads.

A case's launches are merged into one document (execution/launches.py); the keys below are where its
launch-level figures live. This module is the contract between the runners (execution/) and the readers
(gate/, comparison, reports), so that the gate never imports a runner.
"""

from __future__ import annotations

from typing import Mapping, Sequence

PER_LAUNCH = "per_launch."  # one figure per launch: samples["per_launch.<metric>"] (what the gate tests)
LAUNCH_INDEX = "launch_index."  # samples["launch_index.<series>"][i]: the launch step sample i came from
PAIRED_BASELINE = "paired_baseline."  # a paired case's baseline side: samples["paired_baseline.per_launch.<m>"]
# A duet case (execution/duet.py): one log(candidate / baseline step time) per synchronized step, the launch pair
# of each, and the candidate's side (0 or 1; NaN: a pair without usable steps) per launch pair.
DUET_LOG_RATIO = "duet.log_ratio"
DUET_PAIR = "duet.pair"
DUET_CANDIDATE_SIDE = "duet.candidate_side"


def per_launch_series(samples: Mapping[str, Sequence[float]], metric: str) -> list[float] | None:
    """The launch-level samples of a metric in a result's samples, or None when it has none."""
    values = samples.get(PER_LAUNCH + metric)
    return [float(v) for v in values] if values else None


def paired_baseline_series(samples: Mapping[str, Sequence[float]], metric: str) -> list[float] | None:
    """The baseline side's launch-level figures of a paired case (index i pairs with the candidate's launch i)."""
    values = samples.get(PAIRED_BASELINE + PER_LAUNCH + metric)
    return [float(v) for v in values] if values else None


def duet_pairs(samples: Mapping[str, Sequence[float]]) -> list[tuple[int, list[float]]]:
    """A duet case's launch pairs: (the candidate's side, the pair's per-step log ratios), in pair order."""
    sides = samples.get(DUET_CANDIDATE_SIDE) or []
    by_pair: dict[int, list[float]] = {}
    for ratio, pair in zip(samples.get(DUET_LOG_RATIO) or [], samples.get(DUET_PAIR) or []):
        by_pair.setdefault(int(pair), []).append(float(ratio))
    return [(int(sides[p]), ratios) for p, ratios in sorted(by_pair.items())
            if p < len(sides) and sides[p] == sides[p]]  # NaN != NaN: a pair without a side

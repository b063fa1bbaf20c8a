"""Where a run's case time went: the launches' phases summed, and the run's measurement efficiency.

Measurement efficiency = the timed-measurement seconds of every launch (workloads/phases.py, `measure`; the
baseline side's too in a paired or duet case) over the cases stage's wall seconds. A run whose launches spend
their time importing torch and building models has a low one, however fast its steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from qualify.numbers import finite
from qualify.workloads.phases import MEASURE

# Seconds a launch spent waiting at the measurement gate (execution/setup_overlap.py) while the other launches of
# its case measured: not a cost of its own (it overlaps those measurements), so not counted in the launch seconds.
PARKED = "parked"


@dataclass(frozen=True)
class LaunchTime:
    """The run's phases (seconds summed over its cases' launches) and its measurement efficiency."""

    phases: dict[str, float]
    cases_wall_s: float | None

    @property
    def measure_s(self) -> float:
        return self.phases.get(MEASURE, 0.0)

    @property
    def efficiency(self) -> float | None:
        if not self.cases_wall_s or not self.phases:
            return None
        return self.measure_s / self.cases_wall_s

    def line(self) -> str:
        eff = self.efficiency
        head = (f"measurement efficiency {eff:.2f} (timed measurement {self.measure_s:.1f} s over the cases "
                f"stage's {self.cases_wall_s:.1f} s wall)" if eff is not None
                else "measurement efficiency n/a (no launch reported its phases)")
        own = {name: sec for name, sec in self.phases.items() if name != PARKED}
        total = sum(own.values())
        parts = ", ".join(f"{name} {sec:.1f} s" for name, sec in
                          sorted(own.items(), key=lambda kv: -kv[1]) if sec >= 0.05)
        parked = self.phases.get(PARKED, 0.0)
        tail = (f" (and {parked:.1f} s parked at the measurement gate while other launches of their case measured)"
                if parked >= 0.05 else "")
        return f"{head}; launch seconds ({total:.1f} s in all): {parts}{tail}" if parts else head

    def as_dict(self) -> dict[str, Any]:
        return {"phases": self.phases, "cases_wall_s": self.cases_wall_s, "measure_s": self.measure_s,
                "efficiency": self.efficiency}


def _add(total: dict[str, float], phases: Any) -> None:
    if not isinstance(phases, Mapping):
        return
    for name, seconds in phases.items():
        value = finite(seconds)
        if value is not None and value >= 0:
            total[str(name)] = total.get(str(name), 0.0) + value


def launch_time(environments: Iterable[Mapping[str, Any] | None], stage_seconds: Mapping[str, Any]) -> LaunchTime:
    """From the case results' environments (their `phases`, and `paired.baseline_phases` for the baseline
    side) and the run's stage seconds."""
    total: dict[str, float] = {}
    for env in environments:
        env = env or {}
        _add(total, env.get("phases"))
        paired = env.get("paired")
        if isinstance(paired, Mapping):
            _add(total, paired.get("baseline_phases"))
    wall = finite(stage_seconds.get("cases")) if stage_seconds else None
    return LaunchTime(phases={k: round(v, 3) for k, v in total.items()}, cases_wall_s=wall)

"""The suite's timeline (tests/support/timeline.py): per worker, the seconds its tests ran (overlapping phases
counted once), the seconds it had none, and its long set-ups by name."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from support.timeline import Phase, _busy, append, phase_of, read, summary


def test_busy_counts_overlaps_once_and_gaps_not_at_all() -> None:
    assert _busy([(0, 10), (5, 12), (20, 25)]) == 17
    assert _busy([(3, 4), (0, 10)]) == 10
    assert _busy([]) == 0


def test_summary_says_what_each_worker_ran_and_waited() -> None:
    phases = [
        Phase("gw0", "a.py::t1", "setup", 100, 101), Phase("gw0", "a.py::t1", "call", 101, 150),
        Phase("gw1", "b.py::t2", "setup", 100, 140), Phase("gw1", "b.py::t2", "call", 140, 160),
        Phase("gw0", "c.py::t3", "call", 170, 200),
    ]
    lines = summary(phases)
    assert lines[0].startswith("timeline: 100 s from the first test phase to the last, 2 worker(s)")
    gw0 = next(line for line in lines if line.startswith("timeline: gw0:"))
    assert "tests ran 80 s; no test 20 s" in gw0 and "done 0 s before the end" in gw0
    assert "set-ups over 10 s: 0, 0 s" in gw0
    gw1 = next(line for line in lines if line.startswith("timeline: gw1:"))
    assert "tests ran 60 s; no test 40 s" in gw1 and "done 40 s before the end" in gw1
    assert "set-ups over 10 s: 1, 40 s" in gw1
    assert any("40.0 s setup at +0 s  b.py::t2" in line for line in lines)
    assert summary([]) == []


def test_reports_become_phases_and_survive_the_file(tmp_path: Path) -> None:
    report = SimpleNamespace(nodeid="x.py::t", when="call", start=5.0, stop=7.5,
                             node=SimpleNamespace(gateway=SimpleNamespace(id="gw1")))
    phase = phase_of(report)
    assert phase == Phase("gw1", "x.py::t", "call", 5.0, 7.5) and phase.seconds == 2.5
    assert phase_of(SimpleNamespace(nodeid="x.py::t", when="call", start=1.0, stop=2.0)).worker == "main"
    assert phase_of(SimpleNamespace(nodeid="x.py::t", when="call")) is None
    path = tmp_path / "t.jsonl"
    append(path, phase)
    append(path, Phase("main", "y.py::u", "setup", 1.0, 2.0))
    assert read(path) == [phase, Phase("main", "y.py::u", "setup", 1.0, 2.0)]
    assert read(tmp_path / "none.jsonl") == []

"""Paired baseline vs history baseline on this machine, while its load changes (issues 14, 22).

    python benchmarks/paired_vs_history.py [--reps N] [--slowdown 0.10] [--burn-every 2] [--calibrate-runs 3]
                                           [--out DIR]

1. Qualifies the previous release once ("0.9", quiet machine): the smoke training case (tiny-llama, base)
   as two models, `same` and `slowed`, 3 launches each. This run is the history baseline and, being a PASS,
   the environment that paired runs re-measure. Then `qualify calibrate` on it (--calibrate-runs A/A runs and
   one run with the slowdown per case), which gives history mode the run-to-run variation it needs.
2. N times: qualifies a candidate ("1.0-k") in paired mode, with `same` identical to the previous release and
   `slowed` made slower by --slowdown (params.slowdown: each timed step sleeps that fraction of itself; the
   baseline side never gets it). A CPU burner (one busy process) runs during every --burn-every'th repetition,
   so that the machine's state differs between the baseline run and the candidates, and between candidates.
3. Each candidate run is judged twice on the same launches: paired (its stored verdict: its launches against
   the previous release's launches measured beside them) and history (the same candidate launches against
   the previous release's stored launches from step 1, the gate's check_regression with baseline: history).

Both modes use the non-inferiority rule (qualify.gate.noninferiority) with max_regression 5%, alpha 0.05, a first
look at 3 launches (pairs) and a budget of 8: paired runs add pairs while undecided. Prints each repetition,
the wall time of a paired and of a history-only run, then the decisions per mode and case:

    paired: same PASS a INCOMPLETE b FAIL c (launches m); slowed PASS ... | history: same ... ; slowed ...

The goal: no mode ever PASSes the slowed case.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
QUALIFY = str(Path(sys.executable).with_name("qualify"))
POLICY = {"max_regression": 0.05, "alpha": 0.05, "min_samples": 3, "max_launches": 8}
STATUSES = ("PASS", "INCOMPLETE", "FAIL")


def manifest(path: Path, tag: str, previous: str | None, *, mode: str, slowdown: float) -> Path:
    slowed: dict[str, Any] = {"name": "slowed", "preset": "tiny-llama"}
    if slowdown:
        slowed["settings"] = {"slowdown": slowdown}
    data: dict[str, Any] = {
        "apiVersion": "qualify/v1",
        "release": {"name": "pvh", "repository": "127.0.0.1:5000/qualify/pvh", "tag": tag,
                    "candidate_tag": f"{tag}-rc1", **({"previous_tag": previous} if previous else {})},
        "build": {"builder": "local"},
        "execution": {"executor": "local", "case_timeout_s": 600, "infra_retries": 0, "launches": 3},
        "training": {
            # fp32: bf16 matmuls are emulated on this CPU (about 3 s a step under load); the modes are compared,
            # not the dtype. Every launch: 2 warm-up and 6 timed steps.
            "defaults": {"seq_len": 128, "micro_batch": 2, "steps": 6, "warmup_steps": 2, "repeats": 1,
                         "dtype": "fp32", "zero_stage": 0, "num_threads": 1, "resources": {"cpus": 2}},
            "models": [{"name": "same", "preset": "tiny-llama"}, slowed],
            "variants": [{"name": "base"}],
        },
        "gate": {"regression": {**POLICY, "baseline": mode}},
        "promotion": {"on_pass": False, "targets": [{"name": "public",
                                                      "reference": f"127.0.0.1:5000/qualify/pvh-pub:{tag}"}]},
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def qualify_run(path: Path, db: str, data_dir: Path) -> tuple[dict[str, Any], float]:
    env = {**os.environ, "QUALIFY_DATA_DIR": str(data_dir), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    start = time.monotonic()
    res = subprocess.run([QUALIFY, "run", str(path), "--db", db, "--json"], capture_output=True, text=True,
                         env=env, cwd=REPO, timeout=3600)
    wall = time.monotonic() - start
    try:
        return json.loads(res.stdout), wall
    except ValueError:
        sys.exit(f"qualify run {path} exited {res.returncode} without a result:\n{res.stderr[-3000:]}")


def history_statuses(db: str, run_id: int) -> dict[str, str]:
    """The history judgement of a paired run's candidate launches against the previous release's stored run."""
    from qualify.manifest.cases import expand
    from qualify.gate.checks import ResultData, check_regression
    from qualify.gate.judging import stored_release
    from qualify.store import repo
    from qualify.store.engine import open_database

    engine, sessions = open_database(db, migrate=False)
    try:
        with sessions() as session:
            run = repo.get_run(session, run_id)
            rel = stored_release(run)
            policy = rel.gate.model_copy(update={"regression": rel.gate.regression.model_copy(
                update={"baseline": "history"})})
            base_run = repo.baseline_run(session, rel.release.repository, rel.release.previous_tag)
            results = {r.case_id: ResultData.from_row(r) for r in repo.case_results(session, run_id)}
            baseline = {r.case_id: ResultData.from_row(r) for r in repo.case_results(session, base_run.id)}
            calibrations = repo.calibrations_for(session, [r.fingerprint for r in baseline.values()])
            reasons = check_regression(policy, expand(rel), results, baseline, f"run {base_run.id}",
                                       calibrations=calibrations)
    finally:
        engine.dispose()
    return {r.case_id: str(r.status) for r in reasons if r.case_id}


def paired_statuses(outcome: dict[str, Any]) -> dict[str, str]:
    return {r["case_id"]: r["status"] for r in outcome["reasons"] if r["check"] == "regression" and r.get("case_id")}


def launches_used(db: str, run_id: int) -> dict[str, int]:
    from qualify.store import repo
    from qualify.store.engine import open_database

    engine, sessions = open_database(db, migrate=False)
    try:
        with sessions() as session:
            return {r.case_id: int((r.metrics or {}).get("launches") or 0) for r in repo.case_results(session, run_id)}
    finally:
        engine.dispose()


def calibrate(path: Path, db: str, data_dir: Path, runs: int, slowdown: float) -> str:
    env = {**os.environ, "QUALIFY_DATA_DIR": str(data_dir)}
    res = subprocess.run([QUALIFY, "calibrate", str(path), "--db", db, "--runs", str(runs), "--slowed-runs", "1",
                          "--slowdown", str(slowdown)], capture_output=True, text=True, env=env, cwd=REPO,
                         timeout=7200)
    if res.returncode != 0:
        sys.exit(f"qualify calibrate exited {res.returncode}:\n{res.stderr[-3000:]}")
    return res.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--slowdown", type=float, default=0.10)
    ap.add_argument("--burn-every", type=int, default=2, help="a CPU burner during every k-th repetition")
    ap.add_argument("--calibrate-runs", type=int, default=3, help="A/A runs per case for history mode's calibration")
    ap.add_argument("--out", type=Path, help="where the database and reports go (default: a temp folder)")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO / "src"))
    out = args.out or Path(tempfile.mkdtemp(prefix="qualify-pvh-"))
    out.mkdir(parents=True, exist_ok=True)
    db = f"sqlite:///{out / 'pvh.db'}"
    print(f"data in {out}; {args.reps} repetitions, slowdown {args.slowdown:.0%}, burner every "
          f"{args.burn_every}th; policy {POLICY}", flush=True)
    base_manifest = manifest(out / "base.yaml", "0.9", None, mode="optional", slowdown=0.0)
    base, base_wall = qualify_run(base_manifest, db, out)
    if base.get("verdict") != "PASS":
        sys.exit(f"the previous release did not PASS: {json.dumps(base.get('reasons'))[:2000]}")
    print(f"previous release 0.9: run {base['run_id']} PASS in {base_wall:.0f} s (history-mode cost of one run)",
          flush=True)
    start = time.monotonic()
    print(calibrate(base_manifest, db, out, args.calibrate_runs, args.slowdown).rstrip(), flush=True)
    print(f"calibration: {time.monotonic() - start:.0f} s", flush=True)
    counts = {mode: {name: {s: 0 for s in STATUSES} for name in ("same", "slowed")} for mode in ("paired", "history")}
    used: dict[str, list[int]] = {"same": [], "slowed": []}
    walls = []
    for k in range(1, args.reps + 1):
        burner = None
        if args.burn_every and k % args.burn_every == 0:
            burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            outcome, wall = qualify_run(manifest(out / f"cand-{k}.yaml", f"1.0-{k}", "0.9", mode="paired",
                                                 slowdown=args.slowdown), db, out)
        finally:
            if burner is not None:
                burner.kill()
                burner.wait()
        walls.append(wall)
        paired = paired_statuses(outcome)
        history = history_statuses(db, outcome["run_id"])
        ran = launches_used(db, outcome["run_id"])
        for name in ("same", "slowed"):
            used[name].append(ran.get(f"train/{name}/base", 0))
            for mode, statuses in (("paired", paired), ("history", history)):
                status = statuses.get(f"train/{name}/base")
                if status in STATUSES:
                    counts[mode][name][status] += 1
        changes = {r["case_id"]: r.get("figures", {}).get("change") for r in outcome["reasons"]
                   if r["check"] == "regression"}
        print(f"rep {k:>2} burner {'on ' if burner else 'off'} verdict {outcome['verdict']:<10} wall {wall:5.0f} s "
              f"paired change same {_fmt(changes.get('train/same/base'))} slowed "
              f"{_fmt(changes.get('train/slowed/base'))}, pairs {ran.get('train/same/base')}/"
              f"{ran.get('train/slowed/base')} | paired {_statuses(paired)} | history {_statuses(history)}",
              flush=True)
    print(f"wall time: previous-release (history-only) run {base_wall:.0f} s; paired run median "
          f"{statistics.median(walls):.0f} s (2 cases, 3..8 pairs each)")
    for mode in ("paired", "history"):
        print(f"{mode}: " + "; ".join(
            f"{name} " + " ".join(f"{s} {counts[mode][name][s]}" for s in STATUSES)
            + f" (launches {statistics.fmean(used[name]):.1f} a run)" for name in ("same", "slowed")))
    return 0


def _fmt(value: Any) -> str:
    return "n/a" if value is None else f"{value * 100:+.1f}%"


def _statuses(statuses: dict[str, str]) -> str:
    return " ".join(f"{k.split('/')[1]} {v}" for k, v in sorted(statuses.items()))


if __name__ == "__main__":
    sys.exit(main())

"""Paired baseline vs history baseline on this machine, while its load changes (issue 14).

    python benchmarks/paired_vs_history.py [--reps N] [--slowdown 0.10] [--burn-every 2] [--out DIR]

1. Qualifies the previous release once ("0.9", quiet machine): the smoke training case (tiny-llama, base)
   as two models, `same` and `slowed`, 3 launches each. This run is the history baseline and, being a PASS,
   the environment that paired runs re-measure.
2. N times: qualifies a candidate ("1.0-k") in paired mode, with `same` identical to the previous release and
   `slowed` made slower by --slowdown (params.slowdown: each timed step sleeps that fraction of itself; the
   baseline side never gets it). A CPU burner (one busy process) runs during every --burn-every'th repetition,
   so that the machine's state differs between the baseline run and the candidates, and between candidates.
3. Each candidate run is judged twice on the same launches: paired (its stored verdict: its launches against
   the previous release's launches measured beside them) and history (the same candidate launches against
   the previous release's stored launches from step 1, the gate's check_regression with baseline: history).

Both modes use max_regression 5%, alpha 0.05, min_samples 3 (launches or pairs). Prints each repetition, the
wall time of a paired and of a history-only run, then exactly one final line:

    paired: identical flagged A/N, slowed flagged B/N; history: identical flagged C/N, slowed flagged D/N
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
POLICY = {"max_regression": 0.05, "alpha": 0.05, "min_samples": 3}


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


def history_flags(db: str, run_id: int) -> dict[str, bool]:
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
            reasons = check_regression(policy, expand(rel), results, baseline, f"run {base_run.id}")
    finally:
        engine.dispose()
    return {r.case_id: r.status == "FAIL" for r in reasons if r.case_id}


def paired_flags(outcome: dict[str, Any]) -> dict[str, bool]:
    return {r["case_id"]: r["status"] == "FAIL" for r in outcome["reasons"]
            if r["check"] == "regression" and r.get("case_id")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--slowdown", type=float, default=0.10)
    ap.add_argument("--burn-every", type=int, default=2, help="a CPU burner during every k-th repetition")
    ap.add_argument("--out", type=Path, help="where the database and reports go (default: a temp folder)")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO / "src"))
    out = args.out or Path(tempfile.mkdtemp(prefix="qualify-pvh-"))
    out.mkdir(parents=True, exist_ok=True)
    db = f"sqlite:///{out / 'pvh.db'}"
    print(f"data in {out}; {args.reps} repetitions, slowdown {args.slowdown:.0%}, burner every "
          f"{args.burn_every}th; policy {POLICY}", flush=True)
    base, base_wall = qualify_run(manifest(out / "base.yaml", "0.9", None, mode="optional", slowdown=0.0),
                                  db, out)
    if base.get("verdict") != "PASS":
        sys.exit(f"the previous release did not PASS: {json.dumps(base.get('reasons'))[:2000]}")
    print(f"previous release 0.9: run {base['run_id']} PASS in {base_wall:.0f} s (history-mode cost of one run)",
          flush=True)
    counts = {"paired": {"same": 0, "slowed": 0}, "history": {"same": 0, "slowed": 0}}
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
        paired = paired_flags(outcome)
        history = history_flags(db, outcome["run_id"])
        for mode, flags in (("paired", paired), ("history", history)):
            for name in ("same", "slowed"):
                counts[mode][name] += bool(flags.get(f"train/{name}/base"))
        ratios = {r["case_id"]: r.get("figures", {}).get("ratio") for r in outcome["reasons"]
                  if r["check"] == "regression"}
        print(f"rep {k:>2} burner {'on ' if burner else 'off'} verdict {outcome['verdict']:<10} wall {wall:5.0f} s "
              f"paired ratio same {_fmt(ratios.get('train/same/base'))} slowed {_fmt(ratios.get('train/slowed/base'))}"
              f" | flagged paired {_flags(paired)} history {_flags(history)}", flush=True)
    print(f"wall time: previous-release (history-only) run {base_wall:.0f} s; paired run median "
          f"{statistics.median(walls):.0f} s (2 cases x 3 launches a side)")
    n = args.reps
    print(f"paired: identical flagged {counts['paired']['same']}/{n}, slowed flagged {counts['paired']['slowed']}/{n}; "
          f"history: identical flagged {counts['history']['same']}/{n}, slowed flagged {counts['history']['slowed']}/{n}")
    return 0


def _fmt(value: Any) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _flags(flags: dict[str, bool]) -> str:
    return ",".join(k.split("/")[1] for k, v in sorted(flags.items()) if v) or "-"


if __name__ == "__main__":
    sys.exit(main())

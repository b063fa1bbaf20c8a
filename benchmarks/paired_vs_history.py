"""History vs paired vs duet baselines on this machine, while its load changes (issues 14 and 23).

    python benchmarks/paired_vs_history.py [--reps N] [--modes history,paired,duet] [--slowdown 0.10]
                                           [--burn-every 2] [--out DIR] [--prefect server|ephemeral]
                                           [--cases identical,slowed]

1. Qualifies the previous release once ("0.9"): the smoke training case (tiny-llama, base) as two models, `same`
   and `slowed`, 3 launches each. This run is the history baseline and, being a PASS, the environment that
   paired and duet runs re-measure.
2. N times, for each mode: qualifies a candidate ("1.0-k<mode>") with gate.regression.baseline = that mode,
   `same` identical to the previous release and `slowed` made slower by --slowdown (params.slowdown: that
   fraction of a step's cost in extra matmuls each step, real compute; the baseline side never gets it). A CPU
   burner (one busy process) runs during every --burn-every'th repetition, for all its modes.
   - history: the candidate's launches against the previous release's stored launches;
   - paired: the previous release re-measured beside the candidate, A B A B;
   - duet: both at the same time, each on its own core, step k of both started together, sides swapped
     between launch pairs.
3. Each case's regression verdict is counted: PASS / INCOMPLETE / FAIL.

All modes: max_regression 5%, alpha 0.05, min_samples 3; each side of a case on one core (`cpus: 1`,
one thread), so that a duet (two sides) fits this 2-core machine. Prints each run, then exactly one final line:

    history: identical P/I/F, slowed P/I/F; paired: identical P/I/F, slowed P/I/F; duet: identical P/I/F, slowed P/I/F; median launches h/p/d; median wall s h/p/d

(launches: the process launches of one case, both sides counted; wall: one `qualify run` of both cases). With
`--cases identical` (or `slowed`) each run qualifies that case alone: what one run of a case costs in each mode
(with both, a history run's two 1-CPU cases share the two cores, while a duet case holds both).
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


def manifest(path: Path, tag: str, previous: str | None, *, mode: str, slowdown: float,
             cases: tuple[str, ...] = ("identical", "slowed")) -> Path:
    slowed: dict[str, Any] = {"name": "slowed", "preset": "tiny-llama"}
    if slowdown:
        slowed["settings"] = {"slowdown": slowdown}
    models = [m for case, m in (("identical", {"name": "same", "preset": "tiny-llama"}), ("slowed", slowed))
              if case in cases]
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
                         "dtype": "fp32", "zero_stage": 0, "num_threads": 1, "resources": {"cpus": 1}},
            "models": models,
            "variants": [{"name": "base"}],
        },
        "gate": {"regression": {**POLICY, "baseline": mode}},
        "promotion": {"on_pass": False, "targets": [{"name": "public",
                                                      "reference": f"127.0.0.1:5000/qualify/pvh-pub:{tag}"}]},
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


PREFECT_API: dict[str, str] = {}  # the benchmark's Prefect server (--prefect server), once it runs


def qualify_run(path: Path, db: str, data_dir: Path) -> tuple[dict[str, Any], float]:
    env = {**os.environ, "QUALIFY_DATA_DIR": str(data_dir), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           **PREFECT_API}
    start = time.monotonic()
    res = subprocess.run([QUALIFY, "run", str(path), "--db", db, "--json"], capture_output=True, text=True,
                         env=env, cwd=REPO, timeout=3600)
    wall = time.monotonic() - start
    try:
        return json.loads(res.stdout), wall
    except ValueError:
        sys.exit(f"qualify run {path} exited {res.returncode} without a result:\n{res.stderr[-3000:]}")


MODES = ("history", "paired", "duet")
CASES = {"identical": "train/same/base", "slowed": "train/slowed/base"}


def case_seconds(db: str, run_id: int) -> dict[str, float]:
    """Each case's execution seconds (its Ray task's wall time, both sides): the cost of one case, which a run's
    wall time does not show when cases share the machine (history and paired cases of 1 CPU run two at a time
    here; a duet case holds both cores)."""
    from qualify.store import repo
    from qualify.store.engine import open_database

    engine, sessions = open_database(db, migrate=False)
    try:
        with sessions() as session:
            return {row.case_id: float(row.exec_s or 0.0) for row in repo.case_results(session, run_id)}
    finally:
        engine.dispose()


def case_figures(db: str, run_id: int) -> dict[str, int]:
    """Process launches per case of a run, both sides counted (candidate launches + paired or duet baseline's)."""
    from qualify.store import repo
    from qualify.store.engine import open_database

    engine, sessions = open_database(db, migrate=False)
    out: dict[str, int] = {}
    try:
        with sessions() as session:
            for row in repo.case_results(session, run_id):
                env = row.environment or {}
                launches = int((row.metrics or {}).get("launches") or 0)
                duet = env.get("duet") or {}
                if duet.get("mode") == "duet":
                    launches = 2 * len(duet.get("pairs") or [])
                elif (env.get("paired") or {}).get("pairs"):
                    launches += int(env["paired"]["pairs"])
                out[row.case_id] = launches
    finally:
        engine.dispose()
    return out


def calibrate(path: Path, db: str, data_dir: Path, runs: int, slowdown: float) -> str:
    """`qualify calibrate` on the previous release: the run-to-run variation history mode adds to its interval."""
    env = {**os.environ, "QUALIFY_DATA_DIR": str(data_dir), **PREFECT_API}
    res = subprocess.run([QUALIFY, "calibrate", str(path), "--db", db, "--runs", str(runs), "--slowed-runs", "1",
                          "--slowdown", str(slowdown)], capture_output=True, text=True, env=env, cwd=REPO,
                         timeout=7200)
    if res.returncode != 0:
        sys.exit(f"qualify calibrate exited {res.returncode}:\n{res.stderr[-3000:]}")
    return res.stdout


def regression_calls(outcome: dict[str, Any], cases: tuple[str, ...] = tuple(CASES)) -> dict[str, str]:
    """Each case's regression verdict: P (PASS), I (INCOMPLETE or anything undecided), F (FAIL)."""
    calls = {r["case_id"]: r["status"] for r in outcome["reasons"] if r["check"] == "regression" and r.get("case_id")}
    return {case: {"PASS": "P", "FAIL": "F"}.get(calls.get(CASES[case], ""), "I") for case in cases}


def subset(flag: str, text: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
    """A comma-separated subset of `allowed`, in `allowed`'s order; ValueError naming the flag and the value."""
    chosen = {part.strip() for part in text.split(",") if part.strip()}
    if not chosen or chosen - set(allowed):
        raise ValueError(f"{flag}: a comma-separated subset of {','.join(allowed)}, got {text!r}")
    return tuple(a for a in allowed if a in chosen)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated: history,paired,duet")
    ap.add_argument("--slowdown", type=float, default=0.10)
    ap.add_argument("--burn-every", type=int, default=2, help="a CPU burner during every k-th repetition")
    ap.add_argument("--out", type=Path, help="where the database and reports go (default: a temp folder)")
    ap.add_argument("--max-minutes", type=float, default=0.0,
                    help="stop starting repetitions after this many minutes (0: no limit); the last line then "
                         "counts the repetitions that ran and says so")
    ap.add_argument("--cases", default=",".join(CASES),
                    help="which cases each run qualifies (comma-separated: identical,slowed). One case per run "
                         "measures what a run of that case costs in each mode: with both, a history run's two 1-CPU "
                         "cases share the 2 cores while a duet case holds both")
    ap.add_argument("--calibrate-runs", type=int, default=3,
                    help="A/A runs of `qualify calibrate` on the previous release (history mode needs the run-to-run "
                         "variation; 0: skip, and history mode is INCOMPLETE by design)")
    ap.add_argument("--prefect", choices=("server", "ephemeral"), default="server",
                    help="server: one `prefect server start` on the loopback for every run, as a release manager with a "
                         "server has (default); ephemeral: each run starts Prefect's temporary API")
    args = ap.parse_args()
    try:  # refused before anything starts (the Prefect server below)
        args.modes = subset("--modes", args.modes, MODES)
        args.cases = subset("--cases", args.cases, tuple(CASES))
    except ValueError as exc:
        ap.error(str(exc))
    if args.prefect == "server":
        sys.path.insert(0, str(REPO / "tests"))
        from support.shared_prefect import running

        with tempfile.TemporaryDirectory(prefix="qualify-pvh-prefect-") as home, running(Path(home)) as api:
            if api is None:
                sys.exit("the benchmark's Prefect server did not start (--prefect ephemeral runs without one)")
            PREFECT_API["PREFECT_API_URL"] = api
            return _benchmark(args)
    return _benchmark(args)


def _benchmark(args: argparse.Namespace) -> int:
    modes, cases = args.modes, args.cases
    sys.path.insert(0, str(REPO / "src"))
    out = args.out or Path(tempfile.mkdtemp(prefix="qualify-pvh-"))
    out.mkdir(parents=True, exist_ok=True)
    db = f"sqlite:///{out / 'pvh.db'}"
    print(f"data in {out}; {args.reps} repetitions of {','.join(modes)}, slowdown {args.slowdown:.0%}, burner every "
          f"{args.burn_every}th; policy {POLICY}", flush=True)
    base, base_wall = qualify_run(manifest(out / "base.yaml", "0.9", None, mode="optional", slowdown=0.0,
                                           cases=cases), db, out)
    if base.get("verdict") != "PASS":
        sys.exit(f"the previous release did not PASS: {json.dumps(base.get('reasons'))[:2000]}")
    print(f"previous release 0.9: run {base['run_id']} PASS in {base_wall:.0f} s", flush=True)
    if "history" in modes and args.calibrate_runs:
        print(calibrate(out / "base.yaml", db, out, args.calibrate_runs, args.slowdown), flush=True)
    counts = {m: {c: {"P": 0, "I": 0, "F": 0} for c in CASES} for m in MODES}
    walls: dict[str, list[float]] = {m: [] for m in MODES}
    case_s: dict[str, list[float]] = {m: [] for m in MODES}
    launches: dict[str, list[int]] = {m: [] for m in MODES}
    started = time.monotonic()
    done = 0
    for k in range(1, args.reps + 1):
        if args.max_minutes and time.monotonic() - started > args.max_minutes * 60:
            print(f"--max-minutes {args.max_minutes:g} reached: {done} of {args.reps} repetitions ran", flush=True)
            break
        done = k
        burner = None
        if args.burn_every and k % args.burn_every == 0:
            burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            for mode in modes:
                outcome, wall = qualify_run(manifest(out / f"cand-{k}-{mode}.yaml", f"1.0-{k}{mode[0]}", "0.9",
                                                     mode=mode, slowdown=args.slowdown, cases=cases), db, out)
                calls = regression_calls(outcome, cases)
                for case, call in calls.items():
                    counts[mode][case][call] += 1
                figures = case_figures(db, outcome["run_id"])
                seconds = case_seconds(db, outcome["run_id"])
                case_s[mode] += [seconds.get(CASES[c], 0.0) for c in cases]
                launches[mode] += [figures.get(CASES[c], 0) for c in cases]
                walls[mode].append(wall)
                changes = {r["case_id"]: _change(r.get("figures") or {})
                           for r in outcome["reasons"] if r["check"] == "regression" and r.get("case_id")}
                shown = " ".join(f"{c} {calls[c]} ({_fmt(changes.get(CASES[c]))})" for c in cases)
                print(f"rep {k:>2} burner {'on ' if burner else 'off'} {mode:<7} wall {wall:5.0f} s {shown} "
                      f"launches {figures}", flush=True)
        finally:
            if burner is not None:
                burner.kill()
                burner.wait()

    def pif(mode: str, case: str) -> str:
        if mode not in modes or case not in cases:
            return "-/-/-"
        c = counts[mode][case]
        return f"{c['P']}/{c['I']}/{c['F']}"

    def med(values: list[float] | list[int], digits: int = 0) -> str:
        return f"{statistics.median(values):.{digits}f}" if values else "-"

    print(f"history run of the previous release: {base_wall:.0f} s; N = {done} repetitions", flush=True)
    ratio = (f"; duet / history {statistics.median(case_s['duet']) / statistics.median(case_s['history']):.2f}"
             if case_s["duet"] and case_s["history"] and statistics.median(case_s["history"]) > 0 else "")
    print(f"median case execution s {'/'.join(med(case_s[m]) for m in MODES)} (h/p/d){ratio}", flush=True)
    if walls["duet"] and walls["history"]:
        print(f"median run wall s, duet / history {statistics.median(walls['duet']) / statistics.median(walls['history']):.2f}"
              f" ({len(cases)} case(s) per run)", flush=True)
    print("; ".join(f"{m}: identical {pif(m, 'identical')}, slowed {pif(m, 'slowed')}" for m in MODES)
          + f"; median launches {'/'.join(med(launches[m]) for m in MODES)}"
          + f"; median wall s {'/'.join(med(walls[m]) for m in MODES)}")
    return 0


def _change(figures: dict[str, Any]) -> Any:
    """The measured change of a regression reason: `estimate` (duet), `change` (history and paired)."""
    for key in ("estimate", "change", "ratio"):
        if figures.get(key) is not None:
            return figures[key]
    return None


def _fmt(value: Any) -> str:
    return "n/a" if value is None else f"{value:.3f}"


if __name__ == "__main__":
    sys.exit(main())

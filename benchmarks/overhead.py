"""Orchestration overhead of the real flow: N sleep cases of fixed duration on S slots.

Prints wall time ÷ ideal time, where ideal = N × duration ÷ S (the total case time on the
parallel slots), for the cases stage alone and for the whole command (Prefect start-up,
Ray start-up, build, verify, gate and report included), with the machine's load. Two ways to
reach Prefect (--modes): `ephemeral` (no server: Prefect starts its ephemeral API, as on a fresh
machine) and `server` (a `prefect server start` of this user on the loopback, which `qualify run`
finds and reuses: driver/local_prefect.py).

    .venv/bin/python benchmarks/overhead.py [--cases 32] [--duration 2] [--repeats 1] [--modes ephemeral,server]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=32)
    parser.add_argument("--duration", type=float, default=2.0)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--modes", default="ephemeral,server")
    args = parser.parse_args()
    lines = []
    for mode in args.modes.split(","):
        if mode == "server":
            with tempfile.TemporaryDirectory(prefix="qov-prefect-") as home, prefect_server(Path(home)) as port:
                lines.append(measure(args, mode, {"QUALIFY_PREFECT_REUSE_PORT": str(port)}))
        else:
            lines.append(measure(args, mode, {"QUALIFY_PREFECT_REUSE_PORT": "0"}))
    for line in lines:
        print(line)
    return 0


@contextlib.contextmanager
def prefect_server(home: Path):
    """This user's `prefect server start` on a free loopback port, as a release manager would run one."""
    sys.path.insert(0, str(REPO / "tests"))
    from support.shared_prefect import running

    with running(home) as api:
        if api is None:
            raise SystemExit("the Prefect server did not start")
        yield int(api.rsplit(":", 1)[1].split("/")[0])


def measure(args: argparse.Namespace, mode: str, extra_env: dict[str, str]) -> str:
    slots = os.cpu_count() or 1
    ideal = args.cases * args.duration / slots
    case_ratios, total_ratios = [], []
    for k in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="qov-") as tmp:
            tmp_path = Path(tmp)
            manifest = tmp_path / "overhead.yaml"
            manifest.write_text(yaml.safe_dump({
                "apiVersion": "qualify/v1",
                "release": {"name": "overhead", "repository": "127.0.0.1:5000/q/overhead", "tag": f"b{k}",
                            "candidate_tag": f"b{k}-rc1"},
                "custom_cases": [{"name": "fixed", "kind": "sleep", "params": {"duration_s": args.duration},
                                  "count": args.cases, "resources": {"cpus": 1}}],
                "gate": {"regression": {"baseline": "optional"}},  # each repeat is a first release
            }))
            env = {**{k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}, **extra_env,
                   "QUALIFY_DATA_DIR": str(tmp_path / "data"), "QUALIFY_RAY_TEMP": f"/tmp/qov-{k}"}
            load_before = os.getloadavg()[0]
            start = time.monotonic()
            res = subprocess.run([sys.executable, "-m", "qualify", "run", str(manifest), "--db",
                                  f"sqlite:///{tmp_path / 'q.db'}", "--json"], capture_output=True, text=True,
                                 env=env, cwd=REPO)
            total = time.monotonic() - start
            if res.returncode != 0:
                print(res.stderr[-3000:], file=sys.stderr)
                raise SystemExit(1)
            outcome = json.loads(res.stdout)
            stages = outcome["stage_seconds"]
            exec_s = [c["exec_s"] for c in outcome["cases"]]
            queue_s = [c["queue_wait_s"] for c in outcome["cases"] if c["queue_wait_s"] is not None]
            case_ratios.append(stages["cases"] / ideal)
            total_ratios.append(total / ideal)
            print(f"{mode} repeat {k}: {args.cases} cases x {args.duration:g} s on {slots} slots, ideal {ideal:.1f} s; "
                  f"cases stage {stages['cases']:.1f} s (ratio {stages['cases'] / ideal:.3f}); whole command "
                  f"{total:.1f} s (ratio {total / ideal:.3f}); load {load_before:.1f} -> {os.getloadavg()[0]:.1f}")
            print("  stages: " + ", ".join(f"{n} {v:.1f} s" for n, v in stages.items()))
            print(f"  per case: exec median {statistics.median(exec_s):.3f} s (sleep {args.duration:g} s + "
                  f"interpreter start), queue wait median {statistics.median(queue_s):.1f} s")
    return (f"{mode}: median ratio, cases stage {statistics.median(case_ratios):.3f}; whole command "
            f"{statistics.median(total_ratios):.3f} (targets: cases stage <= 1.15, whole command <= 1.2)")


if __name__ == "__main__":
    sys.exit(main())

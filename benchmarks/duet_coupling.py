"""How the two sides of a duet couple on this machine, and what the busy wait and the clean-step rule do about it
(issue 23).

    python benchmarks/duet_coupling.py [--pairs 6] [--steps 40] [--slowdown 0.10]

Two processes, each pinned to its own core, run the same step (torch matmuls, one thread), one side with
--slowdown more matmuls per step (real extra work), through the real step barrier (qualify.workloads.duet), the
sides swapped every pair. For each way of waiting at the barrier (`idle`: sleep in select until the peer
arrives; `busy`: run a small matmul between polls; `trade`: busy, and the sides trade cores every step, the
ratio taken over steps 2j and 2j+1) and each load (`quiet`; `burner`: one more busy process,
unpinned, as the benchmark of paired_vs_history runs), it prints the measured slowdown (exp of the mean of the
pairs' median log ratios, minus 1), its spread over pairs, and the share of steps a side waited for a CPU
(clean steps only are counted by the gate: execution/duet.pair_log_ratios). Ends with one line:

    coupling: alone X ms, both busy Y ms (Zx); idle quiet M%, busy quiet M%, trade quiet M%, idle burner M%, ... (true T%)
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from qualify.execution.duet import CLEAN_RUNQ_SHARE  # noqa: E402
from qualify.workloads import duet  # noqa: E402

UNITS = 40  # matmuls per step: about 20-40 ms here
MODES = ("idle", "busy", "trade")  # idle wait; busy wait; busy wait and the sides trade cores every step


def _side(directory: str, side: int, cpu: int, extra: float, mode: str, steps: int, out: "mp.Queue") -> None:
    os.sched_setaffinity(0, {cpu})
    import torch

    torch.set_num_threads(1)
    a, b = torch.randn(256, 256), torch.randn(256, 256)

    def unit() -> None:
        torch.mm(a, b)

    for _ in range(20):
        unit()
    spec = duet.DuetSpec(directory, side, (cpu,), timeout_s=60, peer_cpus=(1 - cpu,))
    barrier = duet.StepBarrier(spec, trade=mode == "trade")
    times = []
    for _ in range(steps):
        barrier.wait(None if mode == "idle" else unit)
        start = time.perf_counter()
        for _ in range(UNITS + round(UNITS * extra)):
            unit()
        times.append(time.perf_counter() - start)
        barrier.done()
    barrier.close()
    out.put((side, times, barrier.report()["runq_wait_s"]))


def pair(mode: str, cand_cpu: int, steps: int, slowdown: float) -> tuple[float, float]:
    """One launch pair: the median per-step log ratio (candidate / baseline) and the share of disturbed steps."""
    directory = tempfile.mkdtemp(prefix="qualify-duet-bench-")
    try:
        duet.make_barrier_dir(directory)
        out: mp.Queue = mp.Queue()
        procs = [mp.Process(target=_side, args=(directory, 0, cand_cpu, slowdown, mode, steps, out)),
                 mp.Process(target=_side, args=(directory, 1, 1 - cand_cpu, 0.0, mode, steps, out))]
        for p in procs:
            p.start()
        got = {side: (times, runq) for side, times, runq in (out.get(timeout=300) for _ in procs)}
        for p in procs:
            p.join()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    (c, rc), (b, rb) = got[0], got[1]
    ratios = [math.log(x / y) for x, y in zip(c, b)]
    if mode == "trade":  # each release once on each core: steps 2j and 2j+1 together (execution/duet)
        ratios = [(ratios[k] + ratios[k + 1]) / 2 for k in range(0, len(ratios) - 1, 2)]
    disturbed = sum(1 for k in range(len(c)) if rc and rb and (rc[k] > CLEAN_RUNQ_SHARE * c[k]
                                                                or rb[k] > CLEAN_RUNQ_SHARE * b[k]))
    return statistics.median(ratios), disturbed / len(c)


def unit_ms(busy_neighbour: bool) -> float:
    """A 256x256 matmul on core 0, with core 1 idle or running the same matmuls: the coupling of the two cores."""
    code = ("import os,torch;os.sched_setaffinity(0,{1});torch.set_num_threads(1);a=torch.randn(256,256)\n"
            "while True: torch.mm(a,a)")
    neighbour = subprocess.Popen([sys.executable, "-c", code]) if busy_neighbour else None
    try:
        time.sleep(1.0 if neighbour else 0.0)
        os.sched_setaffinity(0, {0})
        import torch

        torch.set_num_threads(1)
        a = torch.randn(256, 256)
        best = []
        for _ in range(7):
            t = time.perf_counter()
            for _ in range(100):
                torch.mm(a, a)
            best.append((time.perf_counter() - t) / 100 * 1e3)
        return statistics.median(best)
    finally:
        os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
        if neighbour:
            neighbour.kill()
            neighbour.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--slowdown", type=float, default=0.10)
    args = ap.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        sys.exit("duet_coupling: needs two cores")
    alone, both = unit_ms(False), unit_ms(True)
    print(f"a 256x256 matmul on core 0: {alone:.2f} ms alone, {both:.2f} ms with core 1 running matmuls too "
          f"({both / alone:.2f}x)", flush=True)
    measured: dict[str, float] = {}
    for load in ("quiet", "burner"):
        for mode in MODES:
            burner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if load == "burner" else None
            try:
                runs = [pair(mode, k % 2, args.steps, args.slowdown) for k in range(args.pairs)]
            finally:
                if burner:
                    burner.kill()
                    burner.wait()
            logs = [r for r, _ in runs]
            change = math.expm1(statistics.fmean(logs))
            measured[f"{mode} {load}"] = change
            print(f"{mode:<4} {load:<6}: measured {change:+.1%} (true {args.slowdown:+.0%}); pair medians "
                  f"{', '.join(f'{math.expm1(x):+.1%}' for x in logs)}; sd {statistics.stdev(logs):.3f}; "
                  f"disturbed steps {statistics.fmean(d for _, d in runs):.0%}", flush=True)
    print(f"coupling: alone {alone:.2f} ms, both busy {both:.2f} ms ({both / alone:.1f}x); "
          + ", ".join(f"{k} {v:+.1%}" for k, v in measured.items()) + f" (true {args.slowdown:+.0%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

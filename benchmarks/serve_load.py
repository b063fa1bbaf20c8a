"""Load on the gating service: concurrent `GET /v1/gate?ref=` against `qualify serve` with PostgreSQL behind
it and a history of 10,000 runs x 50 results, next to the same question asked through `qualify gate check`
as a process (what a CI job without the service does).

    PYTHONPATH=src:. .venv/bin/python benchmarks/serve_load.py [--runs 10000] [--results 50]
        [--concurrency 16] [--seconds 20] [--keep]

It creates a scratch database on the PostgreSQL at 127.0.0.1:5432 (trust auth, like the tests), fills it with
COPY (releases, images, runs with their stored manifest, 50 case results each, one or two decisions per run:
a FAIL re-judged PASS on every tenth run), starts `qualify serve --no-access-log` on a free loopback port,
warms it up, then keeps `--concurrency` keep-alive connections busy for `--seconds` with digest references
of random runs (one in ten never judged: 404). The client is a minimal asyncio HTTP/1.1 loop (so the load
generator costs little of the machine it shares with the server); latency is measured per request on the
client side. Target on this 2-core machine: p50 <= 10 ms and >= 500 requests/s.

Then one registry hangs (issue 25): a loopback listener that accepts and never answers is listed as an
insecure registry, and `--hung-clients` connections keep asking about a tag on it (each waits for its answer,
503, then asks again half a second later) while the warm digest reads are measured again; their p50 is
printed beside the p50 without the hung registry, measured just before.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import quote

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # support.net.Blackhole: the registry that hangs

from support.net import Blackhole  # noqa: E402
ADMIN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
REPOSITORY = "registry.example.com/qualify/bench"


def manifest_text(tag: str) -> str:
    import yaml

    return yaml.safe_dump({
        "apiVersion": "qualify/v1",
        "release": {"name": "bench", "repository": REPOSITORY, "tag": tag, "candidate_tag": f"{tag}-rc1"},
        "execution": {"executor": "local"},
        "components": [{"name": "python", "source": "python", "expected": "3.11", "match": "prefix"}],
        "custom_cases": [{"name": "case", "kind": "sleep", "params": {"duration_s": 0.1}, "count": 50}],
        "promotion": {"targets": [{"name": "public", "reference": f"registry.example.com/public/bench:{tag}"}]},
    }, sort_keys=False)


def _copy(cur, table: str, columns: list[str], rows) -> None:  # type: ignore[no-untyped-def]
    with cur.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row(row)


def populate(url: str, n_runs: int, n_results: int, seed: int = 0) -> list[str]:
    """Fill the schema; returns every run's candidate digest."""
    import psycopg
    from sqlalchemy.engine import make_url

    u = make_url(url)
    rng = random.Random(seed)
    n_releases = max(1, n_runs // 100)
    texts = {k: manifest_text(f"{k // 12}.{k % 12:02d}") for k in range(n_releases)}
    now = "2026-01-01T00:00:00+00:00"
    digests = ["sha256:" + hashlib.sha256(f"run {k}".encode()).hexdigest() for k in range(n_runs)]
    with psycopg.connect(host="127.0.0.1", port=5432, user="postgres", dbname=u.database) as conn:
        with conn.cursor() as cur:
            _copy(cur, "releases", ["id", "name", "repository", "tag", "previous_tag", "created_at"],
                  ((k + 1, "bench", REPOSITORY, f"{k // 12}.{k % 12:02d}", None, now) for k in range(n_releases)))
            _copy(cur, "images", ["id", "repository", "tag", "digest", "builder", "created_at"],
                  ((k + 1, REPOSITORY, f"rc-{k}", digests[k], "prebuilt", now) for k in range(n_runs)))
            _copy(cur, "runs", ["id", "release_id", "image_id", "candidate_digest", "status", "stage", "started_at",
                                "finished_at", "manifest_sha256", "manifest_text", "stage_seconds"],
                  ((k + 1, k % n_releases + 1, k + 1, digests[k], "passed", "report", now, now,
                    hashlib.sha256(texts[k % n_releases].encode()).hexdigest(), texts[k % n_releases], "{}")
                   for k in range(n_runs)))

            def results():  # type: ignore[no-untyped-def]
                rid = 0
                for k in range(n_runs):
                    for c in range(n_results):
                        rid += 1
                        samples = [round(rng.gauss(1.0, 0.02), 4) for _ in range(5)]
                        yield (rid, k + 1, f"sleep/case/{c:04d}", "sleep", None, None, "passed",
                               json.dumps({"wall_s": statistics.median(samples)}), json.dumps({"wall_s": samples}),
                               "{}", json.dumps({"host": "bench"}), json.dumps({"kind": "sleep"}), 1, 0.1, 1.0, now)

            _copy(cur, "case_results", ["id", "run_id", "case_id", "kind", "model", "variant", "status", "metrics",
                                        "samples", "probes", "environment", "fingerprint", "attempts",
                                        "queue_wait_s", "exec_s", "recorded_at"], results())

            def decisions():  # type: ignore[no-untyped-def]
                did = 0
                reasons = json.dumps([{"check": "completeness", "case_id": None, "status": "PASS",
                                       "message": f"all {n_results} cases passed", "figures": {}}])
                failed = json.dumps([{"check": "regression", "case_id": "sleep/case/0000", "status": "FAIL",
                                      "message": "wall_s regression", "figures": {"ratio": 1.2}}])
                for k in range(n_runs):
                    if k % 10 == 0:  # judged FAIL first, then PASS after a re-evaluation
                        did += 1
                        yield (did, k + 1, digests[k], "FAIL", failed, "0" * 64, None, now)
                    did += 1
                    yield (did, k + 1, digests[k], "PASS", reasons, "0" * 64, None, now)

            _copy(cur, "gate_decisions", ["id", "run_id", "digest", "verdict", "reasons", "policy_sha256",
                                          "baseline_run_id", "decided_at"], decisions())
            for table in ("releases", "images", "runs", "case_results", "gate_decisions"):
                cur.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT max(id) FROM {table}))")
        conn.commit()
        conn.execute("ANALYZE")
    return digests


async def _one_connection(host: str, port: int, paths: list[str], stop_at: float, latencies: list[float],
                          statuses: dict[int, int], rng: random.Random, once: list[str] | None) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while time.perf_counter() < stop_at:
            if once is not None:  # every path asked once, shared by the connections
                if not once:
                    break
                path = once.pop()
            else:
                path = paths[rng.randrange(len(paths))]
            start = time.perf_counter()
            writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            await reader.readexactly(length)
            latencies.append(time.perf_counter() - start)
            statuses[status] = statuses.get(status, 0) + 1
    finally:
        writer.close()


async def load(host: str, port: int, paths: list[str], concurrency: int, seconds: float,
               seed: int = 1, once: bool = False) -> tuple[list[float], dict[int, int], float]:
    """Keep `concurrency` connections busy for `seconds` with random `paths` (or each path once, `once`)."""
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    start = time.perf_counter()
    stop_at = start + seconds
    queue = list(paths) if once else None
    await asyncio.gather(*(_one_connection(host, port, paths, stop_at, latencies, statuses, random.Random(seed + k),
                                           queue) for k in range(concurrency)))
    return latencies, statuses, time.perf_counter() - start


async def _hung_client(host: str, port: int, path: str, stop_at: float, statuses: dict[int, int]) -> None:
    """Ask about a tag on the hung registry, wait for the answer, pause, again (a CI job retrying)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while time.perf_counter() < stop_at:
            writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            await reader.readexactly(length)
            statuses[status] = statuses.get(status, 0) + 1
            await asyncio.sleep(0.5)
    finally:
        writer.close()


async def load_beside_hung(host: str, port: int, paths: list[str], concurrency: int, seconds: float,
                           hung_path: str, hung_clients: int) -> tuple[tuple[list[float], dict[int, int], float],
                                                                        dict[int, int]]:
    """`load` while `hung_clients` connections wait on the hung registry (they start first)."""
    hung_statuses: dict[int, int] = {}
    stop_at = time.perf_counter() + seconds + 2
    hung = [asyncio.create_task(_hung_client(host, port, hung_path, stop_at, hung_statuses))
            for _ in range(hung_clients)]
    await asyncio.sleep(1.0)  # the registry pool is stuck by now
    measured = await load(host, port, paths, concurrency, seconds)
    await asyncio.gather(*hung)
    return measured, hung_statuses


def percentile(values: list[float], q: float) -> float:
    xs = sorted(values)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def report(what: str, latencies: list[float], statuses: dict[int, int], wall: float, concurrency: int) -> None:
    n = len(latencies)
    print(f"service, {what}: {n} requests in {wall:.1f} s over {concurrency} connections: {n / wall:.0f} requests/s, "
          f"p50 {percentile(latencies, 0.5) * 1000:.2f} ms, p90 {percentile(latencies, 0.9) * 1000:.2f} ms, "
          f"p99 {percentile(latencies, 0.99) * 1000:.2f} ms (HTTP {dict(sorted(statuses.items()))})", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--results", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--cli-samples", type=int, default=10)
    parser.add_argument("--hung-clients", type=int, default=24, help="connections waiting on the hung registry")
    parser.add_argument("--access-log", action="store_true", help="serve with uvicorn's access log on")
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    parser.add_argument("--reuse", metavar="NAME", help="a database an earlier --keep left (skips the loading)")
    args = parser.parse_args()

    import psycopg

    from qualify.store.engine import upgrade

    name = args.reuse or f"qualify_bench_{uuid.uuid4().hex[:8]}"
    url = f"postgresql://postgres@127.0.0.1:5432/{name}"
    if not args.reuse:
        with psycopg.connect(ADMIN, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    server = None
    hole = Blackhole().__enter__()
    try:
        t = time.perf_counter()
        if args.reuse:
            upgrade(url)
            digests = ["sha256:" + hashlib.sha256(f"run {k}".encode()).hexdigest() for k in range(args.runs)]
            print(f"database {name} reused ({args.runs} runs assumed)")
        else:
            upgrade(url)
            digests = populate(url, args.runs, args.results)
            print(f"database {name}: {args.runs} runs x {args.results} results "
                  f"({args.runs * args.results} case results, {args.runs + args.runs // 10} decisions) "
                  f"loaded in {time.perf_counter() - t:.1f} s")
        port = free_port()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
        server = subprocess.Popen([sys.executable, "-m", "qualify", "serve", "--db", url, "--port", str(port),
                                   "--insecure-registry", hole.host,
                                   *([] if args.access_log else ["--no-access-log"])], env=env, cwd=REPO,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"qualify serve did not start: {server.stderr.read().decode()[-2000:]}")
                time.sleep(0.2)
        print(f"qualify serve on 127.0.0.1:{port}, uvicorn access log {'on' if args.access_log else 'off'}", flush=True)
        rng = random.Random(7)
        refs = [f"{REPOSITORY}@{digests[rng.randrange(len(digests))]}" for _ in range(2000)]
        refs += [f"{REPOSITORY}@sha256:{hashlib.sha256(str(k).encode()).hexdigest()}" for k in range(200)]  # 404
        paths = [f"/v1/gate?ref={quote(ref, safe='')}" for ref in refs]
        # Cold: each run's digest asked once (the answer cache cannot help: every answer is a full check).
        cold = [f"/v1/gate?ref={quote(f'{REPOSITORY}@{d}', safe='')}" for d in digests]
        random.Random(3).shuffle(cold)
        report("cold, every digest asked once", *asyncio.run(load("127.0.0.1", port, cold, args.concurrency,
                                                                  args.seconds, once=True)), args.concurrency)
        # Warm: CI asks about the same recent digests again and again.
        asyncio.run(load("127.0.0.1", port, paths, 4, 3.0))
        report("warm, 2,200 references asked repeatedly",
               *asyncio.run(load("127.0.0.1", port, paths, args.concurrency, args.seconds)), args.concurrency)
        for c in sorted({1, 4, 16} - {args.concurrency}):
            report("warm", *asyncio.run(load("127.0.0.1", port, paths, c, min(args.seconds, 5.0))), c)
        # One registry hangs: the same warm reads, measured right before and beside the hung registry's callers.
        seconds = min(args.seconds, 10.0)
        alone = asyncio.run(load("127.0.0.1", port, paths, args.concurrency, seconds))
        report("warm, no registry hanging", *alone, args.concurrency)
        hung_path = f"/v1/gate?ref={quote(f'{hole.host}/team/app:1.0', safe='')}"
        beside, hung_statuses = asyncio.run(load_beside_hung("127.0.0.1", port, paths, args.concurrency, seconds,
                                                             hung_path, args.hung_clients))
        report(f"warm, beside {args.hung_clients} callers of a hung registry", *beside, args.concurrency)
        p50_alone, p50_beside = percentile(alone[0], 0.5), percentile(beside[0], 0.5)
        print(f"hung registry: digest-read p50 {p50_alone * 1000:.2f} ms alone, {p50_beside * 1000:.2f} ms beside it "
              f"(x{p50_beside / p50_alone:.2f}); the hung registry's callers got HTTP "
              f"{dict(sorted(hung_statuses.items()))}; connections it accepted: {len(hole._held)}", flush=True)
        server.terminate()
        server.wait(20)
        server = None
        times = []
        for k in range(args.cli_samples):
            ref = refs[k]
            t = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "qualify", "gate", "check", ref, "--db", url],
                                  env=env, cwd=REPO, capture_output=True, text=True)
            times.append(time.perf_counter() - t)
            assert proc.returncode in (0, 1), proc.stderr
        print(f"qualify gate check as a process: median {statistics.median(times) * 1000:.0f} ms, "
              f"min {min(times) * 1000:.0f} ms, max {max(times) * 1000:.0f} ms over {len(times)} calls "
              f"({1 / statistics.median(times):.1f} checks/s one after another)")
    finally:
        hole.__exit__(None, None, None)
        if server is not None and server.poll() is None:
            server.terminate()
            server.wait(20)
        if not args.keep and not args.reuse:
            with psycopg.connect(ADMIN, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        else:
            print(f"kept {url}")


if __name__ == "__main__":
    main()

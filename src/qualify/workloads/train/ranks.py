"""Process launch for the training workload: one process, or a relaunch per device.

Standard library only. The command builders and merge_rank_results are pure functions
(tested without running anything); `relaunch` runs the command.

Several ranks: each rank writes its own result document to <scratch>/rank-<RANK>.json
(QUALIFY_RANK_RESULT_DIR) and exits non-zero when it did not pass, so that the launcher
(torchrun's agent, DeepSpeed's launch) stops its peers at once instead of leaving them
blocked in a collective until the timeout. The parent then merges: the case passes only
when every rank of this node passed, agrees with the others and the launcher exited 0; a
failing rank's own class (nan_loss, oom, ...) wins over the crash or timeout it caused in
its peers.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
import sys
from typing import Any, Mapping

from qualify.workloads.procs import kill_group, pdeathsig_preexec
from qualify.workloads.settings import LAUNCHED_MARK, WorkloadSettings

RANK_RESULT_DIR = "QUALIFY_RANK_RESULT_DIR"
# Which rank's failure explains the case: a rank's own finding before what it caused in its
# peers (a rank whose peer died crashes in, or times out on, the next collective).
RANK_FAILURE_ORDER = ("nan_loss", "oom", "degenerate", "bad_case", "load_failed", "crash", "timeout")
# Figures every rank must report alike.
_AGREE_ENV = ("world_size", "zero_stage", "dtype", "model")
_AGREE_METRICS = ("tokens_per_step", "repeats")

MODULE = "qualify.workloads.train"
# torchrun with its rendezvous store bound to the master address (train/torchrun.py).
TORCHRUN_MODULE = "qualify.workloads.train.torchrun"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _settings(environ: Mapping[str, str] | None) -> WorkloadSettings:
    return WorkloadSettings.from_env() if environ is None else WorkloadSettings.from_env(environ)


def is_launched(environ: Mapping[str, str] | None = None) -> bool:
    """True inside a worker started by a launcher (ours, torchrun, deepspeed, MPI...)."""
    return _settings(environ).launched


def choose_launcher(launcher: str, devices: int, nodes: int) -> str:
    """'auto' relaunches only when there is more than one process to start."""
    if launcher != "auto":
        return launcher
    return "torchrun" if devices * nodes > 1 else "none"


def launch_command(launcher: str, *, devices: int, nodes: int, node_rank: int,
                   master_addr: str, master_port: int, case_path: str,
                   python: str = sys.executable, hostfile: str | None = None) -> list[str]:
    """The command that starts `devices` workers on this node (one node of `nodes`)."""
    if launcher == "torchrun":
        return [python, "-m", TORCHRUN_MODULE,
                f"--nproc-per-node={devices}", f"--nnodes={nodes}", f"--node-rank={node_rank}",
                f"--master-addr={master_addr}", f"--master-port={master_port}",
                "-m", MODULE, "--case", case_path]
    if launcher == "deepspeed":
        cmd = [python, "-m", "deepspeed.launcher.runner",
               f"--num_nodes={nodes}", f"--num_gpus={devices}",
               f"--master_addr={master_addr}", f"--master_port={master_port}"]
        if nodes > 1:
            # Multi-node: the runner reaches the other nodes itself (pdsh/ssh) from a hostfile.
            cmd.append(f"--hostfile={hostfile or '/job/hostfile'}")
        else:
            cmd.append(f"--node_rank={node_rank}")
        return cmd + ["--module", MODULE, "--case", case_path]
    raise ValueError(f"launcher {launcher!r} does not relaunch")


def is_loopback(host: str) -> bool:
    """True for a loopback address or localhost (resolved: a name may point at 127.0.1.1)."""
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


def loopback_interface() -> str | None:
    """The name of the loopback interface ("lo" on Linux), None when there is none."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    return next((n for n in names if n == "lo"), next((n for n in names if n.startswith("lo")), None))


def gloo_env(master_addr: str) -> dict[str, str]:
    """GLOO_SOCKET_IFNAME=lo when the rendezvous is on loopback: a default, the user's own choice wins
    (relaunch's `defaults`).

    Without it gloo binds its pair sockets to the address the host name resolves to (a routable
    one here), so ranks on one machine would listen on the network for nothing.
    """
    name = loopback_interface() if is_loopback(master_addr) else None
    return {"GLOO_SOCKET_IFNAME": name} if name else {}


def single_process_env(environ: Mapping[str, str] | None = None, port: int | None = None) -> dict[str, str]:
    """The rendezvous variables a lone process needs (only those not set already)."""
    present = _settings(environ).rendezvous
    wanted = {"MASTER_ADDR": "127.0.0.1", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
    out = {k: v for k, v in wanted.items() if k not in present}
    if "MASTER_PORT" not in present:
        out["MASTER_PORT"] = str(port or free_port())
    return out


def relaunch(cmd: list[str], timeout_s: float | None, log, extra_env: Mapping[str, str] | None = None,
             defaults: Mapping[str, str] | None = None) -> tuple[int, str]:
    """Run the launcher; stderr streams through, stdout (rank 0's document) is returned.

    extra_env replaces the inherited values; defaults only fill what is unset."""
    env = dict(os.environ)
    env[LAUNCHED_MARK] = "1"
    env.update(extra_env or {})
    for name, value in (defaults or {}).items():
        env.setdefault(name, value)
    log.info("relaunching: %s", " ".join(cmd))
    # Own process group: on a timeout the launcher and every worker it started go. The
    # launcher dies with this process (PR_SET_PDEATHSIG), and each rank with the launcher
    # (protocol.run_workload): a killed workload leaves no rank behind.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=None, text=True, env=env,
                            start_new_session=True, preexec_fn=pdeathsig_preexec())
    try:
        stdout, _ = proc.communicate(timeout=timeout_s)
    except BaseException:
        # The launcher forwards SIGTERM to its workers; give them time to stop.
        kill_group(proc, grace_s=15, kill_wait_s=5)
        raise
    return proc.returncode, stdout


def launch_info(launcher: str, cmd: list[str] | None) -> dict[str, Any]:
    return {"launcher": launcher, "launch_command": " ".join(cmd) if cmd else None}


def rank_result_path(directory: str, rank: int) -> str:
    return os.path.join(directory, f"rank-{rank}.json")


def read_rank_results(directory: str) -> dict[int, dict[str, Any]]:
    """{rank: document} of the rank files in directory (unreadable files are left out)."""
    out: dict[int, dict[str, Any]] = {}
    try:
        names = os.listdir(directory)
    except OSError:
        return out
    for name in names:
        if not (name.startswith("rank-") and name.endswith(".json")):
            continue
        try:
            rank = int(name[len("rank-"):-len(".json")])
            with open(os.path.join(directory, name), encoding="utf-8") as fh:
                doc = json.load(fh)
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict):
            out[rank] = doc
    return out


def _failure_rank(item: tuple[int, dict[str, Any]]) -> tuple[int, int]:
    rank, doc = item
    cls = doc.get("error_class")
    order = RANK_FAILURE_ORDER.index(cls) if cls in RANK_FAILURE_ORDER else len(RANK_FAILURE_ORDER)
    return order, rank


def merge_rank_results(docs: Mapping[int, dict[str, Any]], *, expected: list[int] | None,
                       launcher_exit_code: int | None, launcher_problem: str | None = None
                       ) -> dict[str, Any]:
    """The case's result fields from the ranks' documents of this node.

    expected: the ranks this node started (None: unknown, e.g. a multi-node DeepSpeed runner
    that reached the other nodes itself; then the documents present and the exit code judge).
    launcher_exit_code None with launcher_problem: the launcher was stopped (timeout, SIGTERM).
    """
    ranks = {r: {"status": d.get("status"), "error_class": d.get("error_class"),
                 "error": (d.get("error") or "")[:300] or None} for r, d in sorted(docs.items())}
    failing = sorted(((r, d) for r, d in docs.items() if d.get("status") != "passed"), key=_failure_rank)
    base_rank = failing[0][0] if failing else (min(docs) if docs else None)
    base = docs.get(0) if not failing and 0 in docs else (docs[base_rank] if base_rank is not None else {})
    out: dict[str, Any] = {"status": base.get("status", "error"), "error_class": base.get("error_class"),
                           "error": base.get("error"), "metrics": dict(base.get("metrics") or {}),
                           "samples": dict(base.get("samples") or {}), "probes": dict(base.get("probes") or {}),
                           "environment": dict(base.get("environment") or {})}
    out["environment"].update({"ranks": {str(r): v for r, v in ranks.items()}, "launcher_exit_code": launcher_exit_code})
    missing = sorted(set(expected or []) - set(docs))
    if failing:
        rank, doc = failing[0]
        others = [f"rank {r}: {d.get('error_class')}" for r, d in failing[1:]]
        out["error"] = f"rank {rank}: {doc.get('error')}" + (f" (then {', '.join(others)})" if others else "")
        return out
    problem = None
    if launcher_problem:
        problem = ("timeout", f"{launcher_problem}; no rank reported a failure"
                   + (f", rank(s) {missing} wrote no document" if missing else ""))
    elif not docs:
        problem = ("crash", f"launcher exited {launcher_exit_code} and no rank wrote a result document")
    elif missing:
        problem = ("crash", f"rank(s) {missing} wrote no result document (launcher exited {launcher_exit_code})")
    elif launcher_exit_code != 0:
        problem = ("crash", f"launcher exited {launcher_exit_code} although every rank reported passed")
    else:
        for key, where in [(k, "environment") for k in _AGREE_ENV] + [(k, "metrics") for k in _AGREE_METRICS]:
            values = {r: (d.get(where) or {}).get(key) for r, d in docs.items()}
            if len({json.dumps(v, sort_keys=True) for v in values.values()}) > 1:
                problem = ("crash", f"ranks disagree on {key}: {values}")
                break
    if problem:
        out.update(status="error", error_class=problem[0], error=problem[1])
    return out

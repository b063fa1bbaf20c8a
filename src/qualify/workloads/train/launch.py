"""Process launch for the training workload: one process, or a relaunch per device.

Standard library only. The command builders are pure functions (tested without
running anything); `relaunch` runs the command and hands back rank 0's document.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from typing import Any, Mapping

from qualify.workloads.procs import kill_group
from qualify.workloads.settings import LAUNCHED_MARK, WorkloadSettings

MODULE = "qualify.workloads.train"


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
        return [python, "-m", "torch.distributed.run",
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


def single_process_env(environ: Mapping[str, str] | None = None, port: int | None = None) -> dict[str, str]:
    """The rendezvous variables a lone process needs (only those not set already)."""
    present = _settings(environ).rendezvous
    wanted = {"MASTER_ADDR": "127.0.0.1", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
    out = {k: v for k, v in wanted.items() if k not in present}
    if "MASTER_PORT" not in present:
        out["MASTER_PORT"] = str(port or free_port())
    return out


def relaunch(cmd: list[str], timeout_s: float | None, log) -> tuple[int, str]:
    """Run the launcher; stderr streams through, stdout (rank 0's document) is returned."""
    env = dict(os.environ)
    env[LAUNCHED_MARK] = "1"
    log.info("relaunching: %s", " ".join(cmd))
    # Own process group: on a timeout the launcher and every worker it started go.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=None, text=True, env=env,
                            start_new_session=True)
    try:
        stdout, _ = proc.communicate(timeout=timeout_s)
    except BaseException:
        # The launcher forwards SIGTERM to its workers; give them time to stop.
        kill_group(proc, grace_s=15, kill_wait_s=5)
        raise
    return proc.returncode, stdout


def launch_info(launcher: str, cmd: list[str] | None) -> dict[str, Any]:
    return {"launcher": launcher, "launch_command": " ".join(cmd) if cmd else None}

"""Local executor: a Python interpreter stands for the image (the embedded default).

The workload gets the driver's environment without qualify's secrets
(qualify.executors.environment), a scratch folder of its own as TMPDIR (removed afterwards,
whatever happened), and is tracked with everything it starts: a timeout or a normal exit
leaves no process of it behind (qualify.executors.base.run_command).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from qualify.settings import Settings
from qualify.executors.base import ExecutionOutcome, case_json, outcome_from_command, run_command
from qualify.executors.environment import workload_environment

# The directory that holds the `qualify` package: the workloads are imported from here, so
# the interpreter needs nothing of qualify installed (only what the "image" ships).
WORKLOAD_ROOT = str(Path(__file__).resolve().parents[2])
SCRATCH_PREFIX = "qualify-case-"


@dataclass(frozen=True)
class LocalExecutor:
    python: str = sys.executable
    workload_root: str = WORKLOAD_ROOT
    extra_env: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        return f"local interpreter {self.python}"

    def environment(self, gpu_ids: Sequence[str], scratch: str | None = None) -> dict[str, str]:
        env = workload_environment()
        env["PYTHONPATH"] = self.workload_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        cache = Settings.load().cache_dir
        env.setdefault("QUALIFY_CACHE_DIR", str(cache))
        env.setdefault("TORCH_EXTENSIONS_DIR", str(cache / "torch_extensions"))
        env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache / "inductor"))
        env.setdefault("PYTHONUNBUFFERED", "1")
        # Honour the devices Ray assigned to this case, and only those.
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_ids) if gpu_ids else env.get("CUDA_VISIBLE_DEVICES", "")
        if not gpu_ids and env["CUDA_VISIBLE_DEVICES"] == "":
            env.pop("CUDA_VISIBLE_DEVICES")
        if scratch:
            env.update(TMPDIR=scratch, TMP=scratch, TEMP=scratch)
        env.update(self.extra_env)
        return env

    def run(self, case_doc: dict[str, Any], *, timeout_s: float, gpu_ids: Sequence[str] = ()) -> ExecutionOutcome:
        kind = case_doc["kind"]
        argv = [self.python, "-m", f"qualify.workloads.{kind}"]
        remove_stale_scratch()
        scratch = tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-")
        try:
            res = run_command(argv, case_json(case_doc), timeout_s, env=self.environment(gpu_ids, scratch))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return outcome_from_command(case_doc, res, argv, timeout_s)


def remove_stale_scratch(root: str | None = None) -> list[str]:
    """Remove the scratch folders of executors that are gone (killed before they could): their
    name holds the executor's pid. Returns what was removed."""
    root = root or tempfile.gettempdir()
    removed = []
    try:
        names = os.listdir(root)
    except OSError:
        return removed
    for name in names:
        if not name.startswith(SCRATCH_PREFIX):
            continue
        pid = name[len(SCRATCH_PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or _alive(int(pid)):
            continue
        path = os.path.join(root, name)
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

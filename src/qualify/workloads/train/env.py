"""The training workload's process environment: caches, recorded variables, device
facts and the memory limit. Standard library; torch is passed in or imported lazily."""

from __future__ import annotations

import os
import platform
import re
import resource
import subprocess
from typing import Any, Mapping

from qualify.workloads.secrets import redact_env
from qualify.workloads.train.models import estimate_state_bytes

# Variables worth recording even when the case did not pass them (communication
# libraries and the image's optimisation switches, e.g. CHECKPOINT_OPTIMIZATION).
_RECORDED = re.compile(r"^(NCCL_|ACCL_|PCCL_|CHECKPOINT_OPTIMIZATION|TORCH_|TORCHINDUCTOR_|"
                       r"OMP_|KMP_|CUDA_VISIBLE_DEVICES|DS_)")


# DeepSpeed's op build takes ~85 s here; a build lock this old was left by a build that was killed.
STALE_BUILD_LOCK_S = 900.0


def clear_stale_build_locks(extensions_dir: str, now: float | None = None,
                            older_than_s: float = STALE_BUILD_LOCK_S) -> list[str]:
    """Remove op-build lock files older than older_than_s under TORCH_EXTENSIONS_DIR; the removed paths.

    torch's extension builder serialises builds with a plain lock file (cpp_extension's FileBaton) and waits for it
    without limit. A build killed midway (a case timeout, a SIGKILL of the run) leaves the file behind, and every
    later training launch on the machine then sleeps until its case times out."""
    import time

    now = time.time() if now is None else now
    removed: list[str] = []
    try:
        names = os.listdir(extensions_dir)
    except OSError:
        return removed
    for name in names:
        lock = os.path.join(extensions_dir, name, "lock")
        try:
            if now - os.stat(lock).st_mtime > older_than_s:
                os.remove(lock)
                removed.append(lock)
        except OSError:  # no lock there, or another launch removed it first
            continue
    return removed


def share_precompiled_headers(inductor_cache_dir: str | None) -> str | None:
    """Keep inductor's precompiled C++ headers in the compile cache, not in the launch's scratch TMPDIR.

    torch._inductor.codecache puts them under tempfile.gettempdir() at import (`_HEADER_DIR`, "global" by
    design), and every launch has its own TMPDIR (executors/local.py), so each compile launch rebuilt a 150 MB
    header for about 4 s, even when every kernel came from the cache. Their file names hash the compiler and
    its flags, so launches may share them as they share the kernels. Returns the folder used (None: left
    alone, when torch has no such attribute or no cache folder is set).
    """
    if not inductor_cache_dir:
        return None
    from torch._inductor import codecache

    if not hasattr(codecache, "_HEADER_DIR"):
        return None
    folder = os.path.join(inductor_cache_dir, "precompiled_headers")
    codecache._HEADER_DIR = folder
    if hasattr(codecache, "_HEADER_LOCK_DIR"):
        codecache._HEADER_LOCK_DIR = os.path.join(folder, "locks")
    return folder


def redact(env: dict[str, Any]) -> dict[str, str]:
    """Secret-looking names and credential-shaped values as "<redacted>" (qualify.workloads.secrets)."""
    return {k: str(v) for k, v in redact_env(env).items()}


def recorded_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables that shape a run (a record of the environment, not settings)."""
    env = os.environ if environ is None else environ
    return redact({k: v for k, v in env.items() if _RECORDED.match(k)})


def device_facts(torch, device) -> dict[str, Any]:
    facts: dict[str, Any] = {"cuda_version": torch.version.cuda}
    if device.type == "cuda":
        facts["device_name"] = torch.cuda.get_device_name(device)
        facts["device_count"] = torch.cuda.device_count()
        facts["driver_version"] = _nvidia_driver()
    else:
        facts["device_name"] = _cpu_name()
        facts["device_count"] = 1
        facts["driver_version"] = None
    return facts


def _nvidia_driver() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[0] if out.returncode == 0 and lines else None


def _cpu_name() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def limit_memory(limit_gb: float | None, n_params: int, dtype: str, zero_stage: int, world: int,
                 device, env: dict[str, Any], torch):
    """Apply memory_limit_gb; returns the function that lifts the limit again.

    First a refusal before anything is allocated when the training state alone
    (weights, grads, fp32 master, Adam) cannot fit. Then a real limit: on CUDA the
    caching allocator's fraction of the device, on CPU RLIMIT_AS (soft limit only, so
    the limit can be lifted to write the result document).
    """
    if limit_gb is None:
        return lambda: None
    limit = int(limit_gb * 2**30)
    need = estimate_state_bytes(n_params, dtype, zero_stage, world)
    env["memory_limit_bytes"] = limit
    env["memory_state_estimate_bytes"] = need
    if need > limit:
        raise MemoryError(f"out of memory: weights+grads+optimizer state need at least "
                          f"{need / 2**30:.1f} GiB, memory_limit_gb is {limit_gb}")
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, limit / total), device)
        env["memory_limit_kind"] = "torch.cuda.set_per_process_memory_fraction"
        return lambda: torch.cuda.set_per_process_memory_fraction(1.0, device)
    # Start the OpenMP pool before the limit: a thread that cannot start aborts the
    # process instead of raising.
    torch.ones(1 << 16).mul(2).sum()
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    new_soft = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (new_soft, hard))
    env["memory_limit_kind"] = "RLIMIT_AS (whole process address space)"
    return lambda: resource.setrlimit(resource.RLIMIT_AS, (soft, hard))

"""Component probe: report what the image contains (runs inside the candidate).

params: packages (distribution names to look up; empty = all installed), commands
({name: argv} whose output is returned for the orchestrator's regex), env (variable names).
Secret-looking variables and credential-shaped output are reported as "<redacted>"
(qualify.workloads.secrets): a secret never leaves the image.
Reports OS release, Python version, package versions (importlib.metadata), torch's CUDA
version, the CUDA runtime and the driver where present.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import re
import shutil
import subprocess
import sys
from typing import Any

from qualify.workloads import protocol
from qualify.workloads.secrets import redact_value, scrub_text


def os_release(path: str = "/etc/os-release") -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                key, sep, value = line.strip().partition("=")
                if sep:
                    out[key] = value.strip().strip('"')
    except OSError:
        pass
    return out


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_packages() -> dict[str, str]:
    packages: dict[str, str] = {}
    for dist in md.distributions():
        name = dist.metadata.get("Name")
        if name:
            packages[_norm(name)] = dist.version
    return packages


def torch_facts() -> dict[str, Any]:
    try:
        import torch  # noqa: PLC0415 - optional in the image
    except Exception as exc:  # noqa: BLE001
        return {"torch_import_error": f"{type(exc).__name__}: {exc}"}
    facts: dict[str, Any] = {"torch": torch.__version__, "torch_cuda": torch.version.cuda}
    try:
        if torch.cuda.is_available():
            facts["device_count"] = torch.cuda.device_count()
            facts["device_name"] = torch.cuda.get_device_name(0)
            facts["cuda_runtime"] = ".".join(str(x) for x in divmod(torch.cuda.runtime_version() // 10, 100)) \
                if hasattr(torch.cuda, "runtime_version") else torch.version.cuda
    except Exception as exc:  # noqa: BLE001
        facts["cuda_error"] = f"{type(exc).__name__}: {exc}"
    return facts


def driver_version() -> str | None:
    """The accelerator driver's version from the kernel module or nvidia-smi; None when neither answers.

    Never from the image's environment: an image could claim its own driver that way. The
    driver side reports the node's driver facts; inside the image an unknown stays unknown.
    """
    try:
        with open("/proc/driver/nvidia/version", encoding="utf-8") as fh:
            m = re.search(r"Kernel Module\s+(\S+)", fh.read())
            if m:
                return m.group(1)
    except OSError:
        pass
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=30)
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip().splitlines()[0]
        except (OSError, subprocess.SubprocessError):
            pass
    return None


def run_commands(commands: dict[str, list[str]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, argv in commands.items():
        try:
            res = subprocess.run(argv, capture_output=True, text=True, timeout=60)
            out[name] = {"returncode": res.returncode, "output": scrub_text((res.stdout + res.stderr)[:4000])}
        except (OSError, subprocess.SubprocessError) as exc:
            out[name] = {"returncode": None, "output": "", "error": scrub_text(str(exc))}
    return out


def handler(case: dict[str, Any], log: Any) -> dict[str, Any]:
    params = case.get("params") or {}
    rel = os_release()
    facts: dict[str, Any] = {
        "os": {"id": rel.get("ID"), "version_id": rel.get("VERSION_ID"), "pretty_name": rel.get("PRETTY_NAME")},
        "python": platform.python_version(),
        "python_full": sys.version,
        "packages": installed_packages(),
        "driver": driver_version(),  # None: unknown from inside the image
        # A secret never leaves the image: names and values that look secret are "<redacted>".
        "env": {name: redact_value(name, os.environ.get(name)) for name in params.get("env", [])},
        "commands": run_commands(params.get("commands", {})),
    }
    if params.get("torch", True):
        facts.update(torch_facts())
    env = protocol.environment_base()
    env["facts"] = facts
    return {"status": "passed", "environment": env}


if __name__ == "__main__":
    protocol.exit_now(protocol.run_workload("probe", handler))

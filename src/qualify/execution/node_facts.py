"""Facts about a Ray node read on its host side, outside the candidate image: the accelerator driver.

The driver belongs to the node, not to the image: what the probe reports from inside the
candidate (an environment variable, a bundled `nvidia-smi`, a file the image ships) is the
image's claim and is never used to judge a `source: driver` component. The Ray task on the node
(a process of the host, next to the executor, not in the container) reads these facts; where no
vendor answers, the driver is None: unknown on this node, never guessed.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any, Callable

import ray

# (vendor, file, regex with the version as group 1). The kernel modules' own version files.
_MODULE_FILES = (
    ("nvidia", "proc/driver/nvidia/version", r"Kernel Module\s+(?:for\s+\S+\s+)?(\d+(?:\.\d+)+)"),
    ("amd", "sys/module/amdgpu/version", r"(\S+)"),
)
# (vendor, argv) of the vendors' tools, asked when no module file answers.
_TOOLS = (
    ("nvidia", ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]),
)
TOOL_TIMEOUT_S = 30


def _from_module_files(root: Path) -> dict[str, Any] | None:
    for vendor, rel, pattern in _MODULE_FILES:
        try:
            text = (root / rel).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        m = re.search(pattern, text)
        if m:
            return {"driver": m.group(1), "driver_vendor": vendor, "driver_source": f"/{rel}"}
    return None


def _from_tools(which: Callable[[str], str | None]) -> dict[str, Any] | None:
    for vendor, argv in _TOOLS:
        path = which(argv[0])
        if not path:
            continue
        try:
            out = subprocess.run([path, *argv[1:]], capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
        except (OSError, subprocess.SubprocessError):
            continue
        lines = out.stdout.strip().splitlines()
        if out.returncode == 0 and lines:
            return {"driver": lines[0].strip(), "driver_vendor": vendor, "driver_source": path}
    return None


def driver_facts(root: Path = Path("/"), which: Callable[[str], str | None] = shutil.which) -> dict[str, Any]:
    """{driver, driver_vendor, driver_source} of this host; driver None when nothing answers."""
    found = _from_module_files(root) or _from_tools(which)
    return found or {"driver": None, "driver_vendor": None,
                     "driver_source": "no accelerator driver answered on this node"}


def this_node() -> dict[str, Any]:
    """The host's driver facts with where they were read (inside a Ray task: its node)."""
    facts = driver_facts()
    facts["host"] = socket.gethostname()
    if ray.is_initialized():
        facts["ray_node_id"] = ray.get_runtime_context().get_node_id()
    return facts


@ray.remote(num_cpus=0, max_retries=0)
def _read_on_node() -> dict[str, Any]:
    return this_node()


def facts_of_node(node_id: str | None, timeout_s: float = 120) -> dict[str, Any]:
    """The driver facts of a Ray node (this process's own host when Ray is off; unknown when the
    probe never reached a node)."""
    if not ray.is_initialized():
        return this_node()
    if node_id is None:
        return {"driver": None, "driver_vendor": None, "driver_source": "the probe ran on no Ray node"}
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    strategy = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
    return ray.get(_read_on_node.options(scheduling_strategy=strategy).remote(), timeout=timeout_s)


def gpu_ids_of(context: Any) -> list[str]:
    """The GPUs Ray gave the running task."""
    try:
        return [str(x) for x in context.get_accelerator_ids().get("GPU", [])]
    except Exception:  # noqa: BLE001 - older Ray: fall back to the GPU ids API
        return [str(x) for x in ray.get_gpu_ids()]

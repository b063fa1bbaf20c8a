"""What the orchestrator pays to import workload and manifest code: the modules it imports from the
workloads, and manifest validation, never pull torch or another image package into the driver (checked in
a fresh interpreter, so nothing an earlier test imported hides it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
IMAGE_PACKAGES = {"torch", "deepspeed", "transformers", "torchao", "vllm", "numpy", "safetensors"}
# Imported by the orchestrator too (manifest, cases, executors): standard library at import time.
STDLIB_AT_IMPORT = ("qualify.workloads.protocol", "qualify.workloads.settings", "qualify.workloads.procs",
                    "qualify.workloads.merge", "qualify.workloads.infer.params", "qualify.workloads.infer.catalog",
                    "qualify.workloads.infer.engines", "qualify.workloads.train.params")


def test_orchestrator_side_modules_import_only_the_standard_library() -> None:
    # manifest.py, cases.py and the executors import these: importing them must not pull
    # torch or another image package into the orchestrator.
    code = (f"import sys\nimport {', '.join(STDLIB_AT_IMPORT)}\n"
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {sorted(IMAGE_PACKAGES)!r}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_validating_a_manifest_imports_no_torch() -> None:
    """The orchestrator validates model names from the workloads' standard-library catalog: no torch import."""
    code = ("import sys; from qualify.manifest.load import load_manifest; "
            f"load_manifest({str(REPO / 'releases' / 'cpu-smoke.yaml')!r}); "
            "load_manifest(" + repr(str(REPO / "releases" / "training-xpu-pytorch-25.05.yaml")) + "); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stdout + out.stderr

"""Everything under src/qualify/workloads/ runs inside the candidate image: it may import only
the standard library and what the image ships, never the orchestrator's packages.

The walker goes through the whole workloads tree (every subpackage) and reads each file's
imports with `ast`: top-level and function-level imports, relative imports (resolved to
absolute names) and importlib.import_module / __import__ calls with a literal name."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WORKLOADS = REPO / "src" / "qualify" / "workloads"
WORKLOADS_PACKAGE = "qualify.workloads"
IMAGE_PACKAGES = {"torch", "deepspeed", "transformers", "torchao", "vllm", "numpy", "safetensors",
                  # the vllm-cpu image's quantizer environment (infer/compress.py runs there)
                  "llmcompressor", "compressed_tensors", "datasets"}
# Imported by the orchestrator too (manifest, cases, executors): standard library at import time.
STDLIB_AT_IMPORT = ("qualify.workloads.protocol", "qualify.workloads.settings", "qualify.workloads.procs",
                    "qualify.workloads.merge", "qualify.workloads.infer.params",
                    "qualify.workloads.infer.engines", "qualify.workloads.train.params")


def workload_files(root: Path = WORKLOADS) -> list[Path]:
    """Every Python file under root, in every subpackage."""
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def _package_of(path: Path, root: Path, root_package: str) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = [root_package, *rel.parts]
    # A module's package is its parent; a package's __init__ is its own package.
    return ".".join(parts[:-1])


def _imports(path: Path, root: Path = WORKLOADS, root_package: str = WORKLOADS_PACKAGE) -> set[str]:
    package = _package_of(path, root, root_package)
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                names.add(node.module or "")
                continue
            base = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
            # `from . import x` imports the submodule base.x
            names.update([base] if node.module else [f"{base}.{alias.name}" for alias in node.names])
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and getattr(node.func, "id", getattr(node.func, "attr", None)) in ("import_module", "__import__")):
            names.add(node.args[0].value)
    return names


def boundary_problems(path: Path, root: Path = WORKLOADS, root_package: str = WORKLOADS_PACKAGE) -> list[str]:
    problems = []
    for name in sorted(_imports(path, root, root_package)):
        top = name.split(".")[0]
        if top == "qualify":
            ok = name == WORKLOADS_PACKAGE or name.startswith(WORKLOADS_PACKAGE + ".")
        else:
            ok = top in sys.stdlib_module_names or top in IMAGE_PACKAGES
        if not ok:
            problems.append(f"{path.relative_to(root)} imports {name}")
    return problems


@pytest.mark.parametrize("path", workload_files(), ids=lambda p: str(p.relative_to(WORKLOADS)))
def test_workload_imports_only_stdlib_and_image_packages(path: Path) -> None:
    assert boundary_problems(path) == []


def test_walker_sees_every_subpackage() -> None:
    seen = {str(p.relative_to(WORKLOADS)) for p in workload_files()}
    assert {"protocol.py", "settings.py", "procs.py", "merge.py", "train/__main__.py", "train/runner.py",
            "infer/__main__.py", "infer/engines/__init__.py", "infer/engines/hf.py",
            "infer/engines/vllm_adapter.py"} <= seen


def test_walker_catches_a_forbidden_import_in_a_nested_file(tmp_path: Path) -> None:
    root = tmp_path / "workloads"
    files = {
        "ok.py": "import json\nfrom qualify.workloads import protocol\n",
        "infer/__init__.py": "",
        "infer/engines/__init__.py": "",
        "infer/engines/x.py": "import os\n\ndef run():\n    import pydantic\n",
        "infer/engines/y.py": "from ....metrics import Direction\nfrom .. import params\n",
        "a/b/c/deep.py": "import importlib\nimportlib.import_module('sqlalchemy.orm')\n",
        "a/b/c/deeper/deepest.py": "from qualify.manifest.cases import Case\n",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    found = {str(p.relative_to(root)) for p in workload_files(root)}
    assert found == set(files)
    problems = [msg for p in workload_files(root) for msg in boundary_problems(p, root)]
    assert problems == [
        "a/b/c/deep.py imports sqlalchemy.orm",
        "a/b/c/deeper/deepest.py imports qualify.manifest.cases",
        "infer/engines/x.py imports pydantic",
        # ....metrics from qualify.workloads.infer.engines is qualify.metrics (the orchestrator's)
        "infer/engines/y.py imports qualify.metrics",
    ]




def test_only_settings_reads_the_environment() -> None:
    # WorkloadSettings is the one reader of os.environ / os.getenv under workloads/, apart from
    # the writes (protocol applies the case's env; train exports caches and rendezvous), the
    # relaunch handing its environment to the workers, the record of the run's variables
    # (train/env.recorded_env) and the probe's case-named variables.
    # The vllm engine writes vLLM's folder variables (scratch folder) and restores them, and sets
    # 0.8.5's VLLM_CPU_KVCACHE_SPACE. The GPU check's harness is a command a person runs (scripts/gpu-check.sh),
    # not a case's workload: it reads its own GPU_CHECK_* switches and hands its environment to its runs.
    allowed = {"settings.py": 1, "protocol.py": 1, "train/runner.py": 2, "train/ranks.py": 1,
               "train/env.py": 1, "probe.py": 1, "infer/engines/vllm_adapter.py": 3, "gpucheck/harness.py": 6}
    counts = {}
    for path in workload_files():
        n = sum(1 for node in ast.walk(ast.parse(path.read_text(), str(path)))
                if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "environb")
                and isinstance(node.value, ast.Name) and node.value.id == "os")
        if n:
            counts[str(path.relative_to(WORKLOADS))] = n
    assert counts == allowed


def test_package_root_imports_nothing() -> None:
    # The image gets qualify/__init__.py and qualify/workloads/ only.
    assert _imports(WORKLOADS.parent / "__init__.py", WORKLOADS.parent, "qualify") == set()


def test_domain_library_knows_nothing_of_prefect() -> None:
    # src/qualify is the domain library; Prefect belongs in tasks/ and flows/.
    for path in sorted(WORKLOADS.parent.rglob("*.py")):
        for name in _imports(path, WORKLOADS.parent, "qualify"):
            assert name.split(".")[0] != "prefect", f"{path.relative_to(WORKLOADS.parent)} imports {name}"

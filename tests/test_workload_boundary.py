"""Everything under src/qualify/workloads/ runs inside the candidate image: it may import only
the standard library and what the image ships, never the orchestrator's packages."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

WORKLOADS = Path(__file__).resolve().parents[1] / "src" / "qualify" / "workloads"
IMAGE_PACKAGES = {"torch", "deepspeed", "transformers", "torchao", "vllm", "numpy", "safetensors"}


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("path", sorted(WORKLOADS.glob("*.py")), ids=lambda p: p.name)
def test_workload_imports_only_stdlib_and_image_packages(path: Path) -> None:
    for name in _imports(path):
        top = name.split(".")[0]
        if top == "qualify":
            assert name == "qualify.workloads" or name.startswith("qualify.workloads."), f"{path.name}: {name}"
            continue
        assert top in sys.stdlib_module_names or top in IMAGE_PACKAGES, f"{path.name} imports {name}"


def test_package_root_imports_nothing() -> None:
    # The image gets qualify/__init__.py and qualify/workloads/ only.
    assert _imports(WORKLOADS.parent / "__init__.py") == set()


def test_domain_library_knows_nothing_of_prefect() -> None:
    # src/qualify is the domain library; Prefect belongs in tasks/ and flows/.
    for path in sorted(WORKLOADS.parent.rglob("*.py")):
        for name in _imports(path):
            assert name.split(".")[0] != "prefect", f"{path.relative_to(WORKLOADS.parent)} imports {name}"

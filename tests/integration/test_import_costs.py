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


def test_gate_check_imports_only_what_a_check_needs(tmp_path: Path) -> None:
    """`qualify gate check` is what a CI job asks after every build (issue 27): the console script builds only the
    command it runs, so a check never loads the run launcher, Prefect, Ray, the service, the report renderer, the
    gate's statistics (scipy), the registry client (a digest is not resolved) or, for a digest nobody judged, the
    manifest model and alembic."""
    db = f"sqlite:///{tmp_path / 'q.db'}"
    assert subprocess.run([sys.executable, "-m", "qualify", "db", "upgrade", "--db", db], capture_output=True,
                          timeout=300, cwd=REPO).returncode == 0
    heavy = ["scipy", "prefect", "ray", "fastapi", "matplotlib", "qualify.launcher", "qualify.gate.checks",
             "qualify.report.html", "qualify.manifest.model", "alembic", "qualify.pipeline",
             "qualify.registry.client"]  # a digest needs no registry call
    code = ("import sys, runpy\n"
            f"sys.argv = ['qualify', 'gate', 'check', '127.0.0.1:5000/q/never@sha256:' + 'a' * 64, '--db', {db!r}]\n"
            "try:\n    runpy.run_module('qualify', run_name='__main__')\nexcept SystemExit as exc:\n    code = exc.code\n"
            f"print('LOADED', sorted(m for m in {heavy!r} if m in sys.modules), 'EXIT', code, file=sys.stderr)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert "LOADED [] EXIT 1" in out.stderr, out.stderr[-3000:]  # never judged: refused, and nothing heavy loaded


def test_gate_check_of_a_judged_digest_in_its_own_repository_parses_no_manifest(tmp_path: Path) -> None:
    """The check CI makes after a build, on a judged digest: its repository is the run's own, so the stored manifest
    (the promotion targets) is never parsed and the manifest model never imported."""
    from support.gate import manifest_text, seed_run

    from qualify.gate.judging import evaluate_and_commit
    from qualify.store.engine import open_database

    db = f"sqlite:///{tmp_path / 'q.db'}"
    engine, sessions = open_database(db)
    digest = "sha256:" + "b" * 64
    with sessions() as s:
        run_id = seed_run(s, manifest_text(release_extra={"previous_tag": None}), digest=digest).id
        s.commit()
    assert evaluate_and_commit(sessions, run_id).judgement.verdict == "PASS"
    engine.dispose()
    heavy = ["qualify.manifest.model", "qualify.manifest.load", "scipy", "prefect", "ray"]
    code = ("import sys, runpy\n"
            f"sys.argv = ['qualify', 'gate', 'check', '127.0.0.1:5000/qualify/demo@{digest}', '--db', {db!r}]\n"
            "try:\n    runpy.run_module('qualify', run_name='__main__')\nexcept SystemExit as exc:\n    code = exc.code\n"
            f"print('LOADED', sorted(m for m in {heavy!r} if m in sys.modules), 'EXIT', code, file=sys.stderr)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert "LOADED [] EXIT 0" in out.stderr, out.stdout + out.stderr[-3000:]

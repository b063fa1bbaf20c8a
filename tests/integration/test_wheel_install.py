"""qualify installed as a plain wheel (not editable), run from outside the checkout, opens its database:
the migrations ship as package data, and the launcher entry point resolves."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

from support.flows import sleep_manifest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_plain_wheel_migrates_and_checks_from_outside_the_checkout(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(wheels), str(REPO)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    wheel = next(wheels.glob("qualify-*.whl"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = next((venv / "lib").glob("python*/site-packages"))
    # The dependencies come from the project's environment (a .pth adds its site-packages, whose own .pth
    # files -- the editable install's finder among them -- are not processed); qualify itself only from
    # the wheel, unpacked as pip would install it.
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q",
                              "--target", str(site), str(wheel)], capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr
    # Nothing under a generic top-level name: the Prefect folders live in qualify_prefect.
    top_level = {p.name for p in site.iterdir() if p.is_dir() and not p.name.endswith((".dist-info", ".egg-info"))}
    assert top_level & {"flows", "tasks", "driver"} == set(), top_level
    assert {"qualify", "qualify_prefect"} <= top_level, top_level
    assert {p.name for p in (site / "qualify_prefect").iterdir()} >= {"flows", "tasks", "driver"}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "QUALIFY_DATABASE_URL")}
    python = str(venv / "bin" / "python")

    def qualify(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([python, "-m", "qualify", *args], capture_output=True, text=True, env=env,
                              cwd=elsewhere, timeout=300)

    where = subprocess.run([python, "-c", "import qualify, qualify.store.engine as e; print(qualify.__file__); "
                            "print(e.MIGRATIONS_DIR)"], capture_output=True, text=True, env=env, cwd=elsewhere)
    assert where.returncode == 0 and str(site) in where.stdout and str(REPO) not in where.stdout, where.stdout
    db = f"sqlite:///{tmp_path / 'q.db'}"
    upgraded = qualify("db", "upgrade", "--db", db)
    assert upgraded.returncode == 0 and "database at head" in upgraded.stdout, upgraded.stderr
    checked = qualify("gate", "check", "example.com/x/y@sha256:" + "c" * 64, "--db", db)
    assert checked.returncode == 1 and "NO DECISION" in checked.stdout, checked.stderr
    listed = qualify("runs", "list", "--db", db, "--json")
    assert listed.returncode == 0 and listed.stdout.strip() == "[]", listed.stderr
    # A whole run through the installed launcher (entry point -> qualify_prefect.driver -> the flow), from
    # outside the checkout, with the interpreter of that environment running the sleep case.
    manifest = sleep_manifest(elsewhere / "m.yaml", [{"name": "nap", "kind": "sleep", "params": {"duration_s": 0.2}}],
                              extra={"build": {"builder": "local", "python": python}})
    ray_temp = tempfile.mkdtemp(prefix="qw-")  # Ray's socket paths must stay under 107 bytes
    run_env = {**env, "QUALIFY_DATA_DIR": str(tmp_path / "data"), "QUALIFY_RAY_TEMP": ray_temp}
    try:
        ran = subprocess.run([python, "-m", "qualify", "run", str(manifest), "--db", db, "--json"],
                             capture_output=True, text=True, env=run_env, cwd=elsewhere, timeout=600)
    finally:
        shutil.rmtree(ray_temp, ignore_errors=True)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert json.loads(ran.stdout)["verdict"] == "PASS", ran.stdout

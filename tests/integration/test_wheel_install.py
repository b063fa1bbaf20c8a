"""qualify installed as a plain wheel (not editable), run from outside the checkout, opens its database:
the migrations ship as package data, and the launcher entry point resolves."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

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

"""The venv cache (scripts/venv-cache.sh): a new checkout on a machine that bootstrapped the same pins takes that
venv by hard links and re-points qualify's editable install to itself, leaving the template and every other
venv as they were; other pins make another key. Real bootstrap, real pip, the suite's own venv as the one saved."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SUITE_VENV = Path(sys.prefix)
# What bootstrap.sh and an editable install of qualify read.
CHECKOUT = ("pyproject.toml", "setup.py", "constraints.txt", "README.md", "scripts", "src", "flows", "tasks", "driver")

pytestmark = pytest.mark.skipif(not (SUITE_VENV / "pyvenv.cfg").is_file(), reason="the suite does not run in a venv")


def _checkout(to: Path) -> Path:
    to.mkdir()
    for name in CHECKOUT:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, to / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, to / name)
    return to


def _script(cwd: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _shebang(venv: Path) -> str:
    return (venv / "bin" / "qualify").read_text().splitlines()[0]


def _editable_target(venv: Path) -> str:
    finder = next((venv / "lib").glob("python3*/site-packages/__editable___qualify_*_finder.py"))
    text = finder.read_text()
    start = text.index("'qualify': '") + len("'qualify': '")
    return text[start:text.index("'", start)]


def test_a_new_checkout_takes_the_cached_venv_and_points_it_at_itself(tmp_path: Path) -> None:
    env = {**os.environ, "QUALIFY_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("QUALIFY_NO_VENV_CACHE", None)
    suite_shebang, suite_editable = _shebang(SUITE_VENV), _editable_target(SUITE_VENV)
    first = _checkout(tmp_path / "first")
    saved = _script(first, "scripts/venv-cache.sh", "save", str(SUITE_VENV), "--test", env=env)
    assert saved.returncode == 0, saved.stderr
    key = _script(first, "scripts/venv-cache.sh", "key", "--test", env=env).stdout.strip()
    template = tmp_path / "cache" / "venvs" / key
    assert _shebang(template) == f"#!{template}/bin/python3"
    # Saving rewrote the template's copies, not the suite's venv (they share every other file).
    assert _shebang(SUITE_VENV) == suite_shebang

    second = _checkout(tmp_path / "second")
    boot = _script(second, "scripts/bootstrap.sh", "--test", env=env)
    assert boot.returncode == 0, boot.stdout[-2000:] + boot.stderr[-2000:]
    assert f"from the venv cache (key {key})" in boot.stdout
    venv = second / ".venv"
    assert _shebang(venv) == f"#!{venv}/bin/python3"
    assert _editable_target(venv) == str(second / "src" / "qualify")
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import qualify, torch; print(qualify.__file__)"],
                           capture_output=True, text=True, cwd=tmp_path)
    assert where.returncode == 0 and where.stdout.strip() == str(second / "src" / "qualify" / "__init__.py"), where
    helped = subprocess.run([str(venv / "bin" / "qualify"), "--help"], capture_output=True, text=True, cwd=tmp_path)
    assert helped.returncode == 0 and "Usage" in helped.stdout
    # The big files are links to the template's; the template and the suite's venv still point where they did.
    torch_init = next((venv / "lib").glob("python3*/site-packages/torch/__init__.py"))
    assert torch_init.stat().st_nlink >= 2
    assert _shebang(template) == f"#!{template}/bin/python3"
    assert _editable_target(template) == _editable_target(SUITE_VENV) == suite_editable
    assert not list(second.glob(".venv.restoring.*"))


def test_other_pins_make_another_key_and_find_no_template(tmp_path: Path) -> None:
    env = {**os.environ, "QUALIFY_CACHE_DIR": str(tmp_path / "cache")}
    one = _checkout(tmp_path / "one")
    assert _script(one, "scripts/venv-cache.sh", "save", str(SUITE_VENV), "--test", env=env).returncode == 0
    key = _script(one, "scripts/venv-cache.sh", "key", "--test", env=env).stdout.strip()
    assert _script(one, "scripts/venv-cache.sh", "key", env=env).stdout.strip() != key  # without the test tools
    with (one / "constraints.txt").open("a") as f:
        f.write("six==1.16.0\n")
    other = _script(one, "scripts/venv-cache.sh", "key", "--test", env=env).stdout.strip()
    assert len(other) == 16 and other != key
    restored = _script(one, "scripts/venv-cache.sh", "restore", str(one / ".venv"), "--test", env=env)
    assert restored.returncode == 1 and not (one / ".venv").exists()
    # A pyproject.toml change outside the dependencies (a pytest option, say) keeps the key.
    (one / "constraints.txt").write_text((REPO / "constraints.txt").read_text())
    with (one / "pyproject.toml").open("a") as f:
        f.write("\n# a comment\n")
    assert _script(one, "scripts/venv-cache.sh", "key", "--test", env=env).stdout.strip() == key


def test_only_the_three_most_recently_used_templates_are_kept(tmp_path: Path) -> None:
    env = {**os.environ, "QUALIFY_CACHE_DIR": str(tmp_path / "cache")}
    one = _checkout(tmp_path / "one")
    keys = []
    for k in range(4):
        with (one / "constraints.txt").open("a") as f:
            f.write(f"# pins {k}\n")
        assert _script(one, "scripts/venv-cache.sh", "save", str(SUITE_VENV), "--test", env=env).returncode == 0
        keys.append(_script(one, "scripts/venv-cache.sh", "key", "--test", env=env).stdout.strip())
        time.sleep(0.05)  # distinct modification times: the order is by them
    kept = sorted(p.name for p in (tmp_path / "cache" / "venvs").iterdir())
    assert kept == sorted(keys[1:]) and len(set(keys)) == 4

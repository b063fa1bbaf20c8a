"""Helpers and fixtures for the container tests (real podman/buildah/skopeo/docker-registry).

A test module imports the fixtures it uses (``from container_support import ...``). Without the
tools (or without root) the tests skip with the reason; with CI set they fail instead, because CI
installs them (apt-get install -y --no-install-recommends buildah podman skopeo docker-registry
runc umoci debootstrap).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from support.cli import run_cli
from support.net import free_port
from support.registry import RegistryProcess

REPO = Path(__file__).resolve().parents[2]
APT_PACKAGES = "buildah podman skopeo docker-registry runc umoci debootstrap"
BASE_IMAGE = "localhost/qualify-bookworm-py-base"
NO_PYTHON_IMAGE = "localhost/qualify-test-no-python"


def unavailable(reason: str) -> None:
    """Skip, or fail under CI (which must provide what the test needs)."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set: the container tests must run there, not skip)")
    pytest.skip(reason)


def require_tools(*tools: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        unavailable(f"{', '.join(missing)} not installed (apt-get install -y --no-install-recommends {APT_PACKAGES})")
    if os.geteuid() != 0:
        unavailable("the container tests need root (qualify's container store and debootstrap)")




def Registry(storage: Path, workdir: Path, preferred_port: int | None = None) -> RegistryProcess:  # noqa: N802
    """The shared loopback registry fixture's process, with storage where the caller keeps it."""
    storage.mkdir(parents=True, exist_ok=True)
    return RegistryProcess(root=workdir, port=free_port(preferred_port), storage=storage).start(timeout=30)


def skopeo_digest(reference: str) -> str:
    res = subprocess.run(["skopeo", "inspect", "--tls-verify=false", "--format", "{{.Digest}}",
                          f"docker://{reference}"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def cache_root() -> Path:
    return Path(os.environ.get("QUALIFY_CACHE_DIR", str(Path.home() / ".cache" / "qualify"))).expanduser()


def ensure_base_image() -> str:
    """The debootstrap base (scripts/base-image.sh: cached in the store and as a tarball)."""
    require_tools("podman", "debootstrap")
    res = subprocess.run(["bash", str(REPO / "scripts" / "base-image.sh")], capture_output=True, text=True,
                         timeout=1200)
    if res.returncode != 0:
        pytest.fail(f"scripts/base-image.sh failed:\n{res.stderr[-4000:]}")
    return res.stdout.strip().splitlines()[-1]


def ensure_no_python_image() -> str:
    """A scratch image with one file and no python3 (buildah from scratch)."""
    from qualify.build.containers import container_store

    store = container_store()
    env = store.env()
    podman = ["podman", *store.global_args("podman")]
    if subprocess.run([*podman, "image", "exists", NO_PYTHON_IMAGE], env=env).returncode == 0:
        return NO_PYTHON_IMAGE
    buildah = ["buildah", *store.global_args("buildah")]
    ctr = subprocess.run([*buildah, "from", "scratch"], env=env, capture_output=True, text=True,
                         check=True).stdout.strip()
    try:
        note = cache_root() / "containers" / "no-python.txt"
        note.write_text("an image without python3, for qualify's tests\n")
        subprocess.run([*buildah, "copy", ctr, str(note), "/README"], env=env, check=True, capture_output=True)
        subprocess.run([*buildah, "commit", "--quiet", ctr, NO_PYTHON_IMAGE], env=env, check=True,
                       capture_output=True)
    finally:
        subprocess.run([*buildah, "rm", ctr], env=env, capture_output=True)
    return NO_PYTHON_IMAGE


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def base_image() -> str:
    require_tools("podman", "buildah", "debootstrap", "runc")
    return ensure_base_image()


@pytest.fixture(scope="session")
def container_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """A throw-away registry (storage in a tmp dir)."""
    require_tools("docker-registry", "skopeo")
    work = tmp_path_factory.mktemp("registry")
    registry = Registry(work / "storage", work)
    yield registry
    registry.stop()


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def python_m_qualify(*args: str, env: dict[str, str] | None = None, timeout: float = 1800,
                     cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, env=env, timeout=timeout, cwd=cwd)

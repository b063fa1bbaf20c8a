"""Registry fixtures: the real Distribution registry (Debian's docker-registry) on loopback.

* ``registry`` (session): one registry on a free 127.0.0.1 port, filesystem storage in a tmp dir.
* ``registry_factory`` (function): start more registries (``.stop()`` / ``.start()`` them to
  simulate an outage; storage survives a restart; ``notifications=[endpoint, ...]`` adds webhook
  endpoints to the config); all are stopped at teardown.
* ``make_image(registry, repo, tag)``: a tiny image written by hand as an OCI layout (one small
  layer tar, a config, a manifest) and pushed with ``skopeo copy``; returns its digest.
* ``skopeo_digest(ref)``: an independent check, ``skopeo inspect`` of a reference's Digest.

Without docker-registry or skopeo the tests are skipped, except in CI (env CI set), where
they are installed and their absence is a failure.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import httpx
import pytest

from support.net import free_port

REGISTRY_BIN = os.environ.get("QUALIFY_TEST_REGISTRY_BIN", "/usr/bin/docker-registry")


def _require_tools() -> None:
    missing = [name for name, path in (("docker-registry", shutil.which(REGISTRY_BIN) or
                                        (REGISTRY_BIN if Path(REGISTRY_BIN).exists() else None)),
                                       ("skopeo", shutil.which("skopeo"))) if not path]
    if missing:
        message = (f"{' and '.join(missing)} not installed "
                   "(apt-get install -y --no-install-recommends docker-registry skopeo)")
        if os.environ.get("CI"):
            pytest.fail(message + ": CI must have them")
        pytest.skip(message)




@dataclass
class RegistryProcess:
    root: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    # (username, password): htpasswd (Basic) auth, as the Debian package's own config sets up
    auth: tuple[str, str] | None = None
    # Blob storage (default root/data); a persistent folder lets a test reuse pushed layers.
    storage: Path | None = None
    # notifications.endpoints of the registry's config (e.g. a webhook on loopback), as dicts
    notifications: list[dict] | None = None
    # Distribution's maintenance mode: reads answer, every write is refused (a registry that fails a push)
    readonly: bool = False

    @property
    def host(self) -> str:
        """host:port, the registry part of an image reference."""
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    def ref(self, repository: str, tag: str | None = None, digest: str | None = None) -> str:
        out = f"{self.host}/{repository}"
        if tag:
            out += f":{tag}"
        if digest:
            out += f"@{digest}"
        return out

    def start(self, timeout: float = 20.0) -> "RegistryProcess":
        if self.proc is not None and self.proc.poll() is None:
            return self
        self.root.mkdir(parents=True, exist_ok=True)
        config = self.root / "config.yml"
        text = ("version: 0.1\n"
                "log: {level: error, accesslog: {disabled: true}}\n"
                f"storage: {{filesystem: {{rootdirectory: {self.storage or self.root / 'data'}}}, "
                "delete: {enabled: true}" + (", maintenance: {readonly: {enabled: true}}" if self.readonly else "")
                + "}\n"
                f"http: {{addr: '{self.host}'}}\n")
        if self.auth:
            htpasswd = self.root / "htpasswd"
            htpasswd.write_text(f"{self.auth[0]}:{bcrypt_hash(self.auth[1])}\n")
            text += f"auth: {{htpasswd: {{realm: qualify-test, path: {htpasswd}}}}}\n"
        if self.notifications:
            text += f"notifications: {json.dumps({'endpoints': self.notifications})}\n"  # JSON is YAML
        config.write_text(text)
        log = open(self.root / "registry.log", "ab")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen([REGISTRY_BIN, "serve", str(config)], stdout=log, stderr=log,
                                     stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = (self.root / "registry.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"docker-registry exited with {self.proc.returncode}: {tail}")
            try:
                if httpx.get(f"{self.url}/v2/", timeout=1, trust_env=False).status_code in (200, 401):
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"docker-registry did not answer on {self.host} within {timeout}s")

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def bcrypt_hash(password: str) -> str:
    """A bcrypt hash for htpasswd with the standard library (crypt exists up to Python 3.12)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            import crypt  # noqa: PLC0415
        except ImportError:
            pytest.skip("no crypt module to make an htpasswd bcrypt hash")
        hashed = crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16))  # cost 4: fast tests
    if not hashed or not hashed.startswith("$2"):
        pytest.skip("libcrypt cannot make bcrypt hashes")
    return hashed


def _start_with_retry(root: Path, auth: tuple[str, str] | None = None,
                      notifications: list[dict] | None = None) -> RegistryProcess:
    last: Exception | None = None
    for _ in range(3):  # a free port can be taken between probing and binding
        try:
            return RegistryProcess(root, auth=auth, notifications=notifications).start()
        except RuntimeError as exc:
            last = exc
    raise RuntimeError(f"could not start docker-registry: {last}")


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryProcess]:
    _require_tools()
    server = _start_with_retry(tmp_path_factory.mktemp("registry"))
    yield server
    server.stop()


@pytest.fixture
def registry_factory(tmp_path: Path) -> Iterator[Callable[[], RegistryProcess]]:
    _require_tools()
    started: list[RegistryProcess] = []

    def start(auth: tuple[str, str] | None = None, notifications: list[dict] | None = None) -> RegistryProcess:
        server = _start_with_retry(tmp_path / f"registry-{len(started)}", auth, notifications)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


# --------------------------------------------------------------------------- images


def _blob(layout: Path, data: bytes) -> dict:
    digest = hashlib.sha256(data).hexdigest()
    path = layout / "blobs" / "sha256" / digest
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def write_oci_layout(layout: Path, tag: str, content: bytes) -> str:
    """A one-layer OCI image (tiny file in an uncompressed tar) as an OCI layout; returns the
    manifest digest."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("qualify-test.txt")
        info.size, info.mtime, info.mode = len(content), 0, 0o644
        tar.addfile(info, io.BytesIO(content))
    layer_bytes = buf.getvalue()
    diff_id = "sha256:" + hashlib.sha256(layer_bytes).hexdigest()
    layer = {"mediaType": "application/vnd.oci.image.layer.v1.tar", **_blob(layout, layer_bytes)}
    config_doc = {"architecture": "amd64", "os": "linux", "config": {"Labels": {"qualify.test": tag}},
                  "rootfs": {"type": "layers", "diff_ids": [diff_id]}}
    config = {"mediaType": "application/vnd.oci.image.config.v1+json",
              **_blob(layout, json.dumps(config_doc, sort_keys=True).encode())}
    manifest_doc = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "config": config, "layers": [layer]}
    manifest_bytes = json.dumps(manifest_doc, sort_keys=True, separators=(",", ":")).encode()
    manifest = {"mediaType": "application/vnd.oci.image.manifest.v1+json", **_blob(layout, manifest_bytes),
                "annotations": {"org.opencontainers.image.ref.name": tag}}
    (layout / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [manifest]}))
    return manifest["digest"]


def write_oci_index(layout: Path, tag: str, contents: list[bytes]) -> tuple[str, list[str]]:
    """An OCI image index over one tiny image per content (amd64, arm64, ...); returns the index
    digest and the child manifest digests."""
    children = []
    for k, content in enumerate(contents):
        sub = layout.parent / f"child-{k}"
        digest = write_oci_layout(sub, f"{tag}-{k}", content)
        for blob in (sub / "blobs" / "sha256").iterdir():
            target = layout / "blobs" / "sha256" / blob.name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(blob.read_bytes())
        size = (sub / "blobs" / "sha256" / digest.split(":")[1]).stat().st_size
        children.append({"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest,
                         "size": size, "platform": {"architecture": ["amd64", "arm64", "ppc64le"][k % 3],
                                                    "os": "linux"}})
    index_doc = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": children}
    index_bytes = json.dumps(index_doc, sort_keys=True, separators=(",", ":")).encode()
    index = {"mediaType": "application/vnd.oci.image.index.v1+json", **_blob(layout, index_bytes),
             "annotations": {"org.opencontainers.image.ref.name": tag}}
    (layout / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [index]}))
    return index["digest"], [c["digest"] for c in children]


def push_index(server: RegistryProcess, repository: str, tag: str, workdir: Path, n: int = 2) -> tuple[str, list[str]]:
    """Push a multi-platform index (skopeo copy --all); returns (index digest, child digests)."""
    import tempfile

    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        layout = Path(tmp) / "layout"
        digest, children = write_oci_index(layout, tag, [f"{repository} {k} {uuid.uuid4().hex}".encode()
                                                         for k in range(n)])
        proc = skopeo("copy", "--quiet", "--all", "--preserve-digests", "--dest-tls-verify=false",
                      f"oci:{layout}:{tag}", f"docker://{server.host}/{repository}:{tag}")
        if proc.returncode != 0:
            raise RuntimeError(f"skopeo copy --all to {server.host}/{repository}:{tag} failed: {proc.stderr.strip()}")
    return digest, children


def skopeo(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["skopeo", *args], capture_output=True, text=True, timeout=timeout)


def push_image(server: RegistryProcess | str, repository: str, tag: str, content: bytes | None = None,
               workdir: Path | None = None) -> str:
    server_auth = server.auth if isinstance(server, RegistryProcess) else None
    """Write a tiny unique image and push it to server/repository:tag; returns its digest."""
    host = server.host if isinstance(server, RegistryProcess) else server
    content = content if content is not None else f"{repository}:{tag} {uuid.uuid4().hex}\n".encode()
    import tempfile

    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        layout = Path(tmp) / "layout"
        digest = write_oci_layout(layout, tag, content)
        creds = ["--dest-creds", f"{server_auth[0]}:{server_auth[1]}"] if server_auth else []
        proc = skopeo("copy", "--quiet", "--preserve-digests", "--dest-tls-verify=false", *creds,
                      f"oci:{layout}:{tag}", f"docker://{host}/{repository}:{tag}")
        if proc.returncode != 0:
            raise RuntimeError(f"skopeo copy to {host}/{repository}:{tag} failed: {proc.stderr.strip()}")
    return digest


def skopeo_digest(reference: str) -> str | None:
    """Independent check: the Digest `skopeo inspect` reports (None when the image is absent)."""
    proc = skopeo("inspect", "--tls-verify=false", "--no-tags", f"docker://{reference}")
    if proc.returncode != 0:
        return None
    return json.loads(proc.stdout)["Digest"]


@pytest.fixture
def make_image(tmp_path: Path) -> Callable[..., str]:
    _require_tools()

    def make(server: RegistryProcess | str, repository: str, tag: str, content: bytes | None = None) -> str:
        return push_image(server, repository, tag, content, workdir=tmp_path)

    return make

"""Copies across registries with `skopeo copy --preserve-digests`; each side gets only its own credentials."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator, Mapping

from qualify.imageref import ImageRef
from qualify.registry.credentials import ENV_PASSWORD, ENV_USERNAME, find_credentials
from qualify.registry.errors import CopyFailed, ImageNotFound, RegistryError, RegistryUnauthorized, RegistryUnreachable


class NeedSkopeo(Exception):
    """The registry API cannot do this copy (a blob mount was refused): fall back to skopeo."""


def skopeo_copy(src: ImageRef, dst: ImageRef, *, env: Mapping[str, str], src_plain_http: bool, dst_plain_http: bool,
                skopeo: str = "skopeo", timeout_s: float = 3600.0) -> None:
    exe = shutil.which(skopeo)
    if exe is None:
        raise CopyFailed(f"copy {src} to {dst}: skopeo is not installed (needed to copy between registries)")
    cmd = [exe, "copy", "--preserve-digests", "--quiet"]
    if src_plain_http:
        cmd.append("--src-tls-verify=false")
    if dst_plain_http:
        cmd.append("--dest-tls-verify=false")
    with _auth_files(src, dst, env) as auth_args, _policy_args() as policy_args:
        cmd += auth_args + policy_args + [f"docker://{src}", f"docker://{dst}"]
        # skopeo reads the private auth files; the secret itself stays out of its environment
        clean_env = {k: v for k, v in env.items() if k not in (ENV_USERNAME, ENV_PASSWORD)}
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=clean_env)
        except subprocess.TimeoutExpired:
            raise RegistryUnreachable(f"copy {src} to {dst}: skopeo timed out after {timeout_s:g}s") from None
    if proc.returncode != 0:
        raise _skopeo_error(f"copy {src} to {dst}", proc.stderr)


@contextlib.contextmanager
def _auth_files(src: ImageRef, dst: ImageRef, env: Mapping[str, str]) -> Iterator[list[str]]:
    """Credentials from the environment go to skopeo in private auth files (never argv), one per side,
    each holding only that side's registry; auth files skopeo already reads are left to it."""
    if not (env.get(ENV_USERNAME) and env.get(ENV_PASSWORD) is not None):
        yield []
        return
    with tempfile.TemporaryDirectory(prefix="qualify-auth-") as tmp:
        args: list[str] = []
        for side, ref in (("src", src), ("dest", dst)):
            creds = find_credentials(ref.registry, ref.repository, env)
            if creds is None:
                continue
            path = Path(tmp) / f"{side}-auth.json"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                token = base64.b64encode(f"{creds.username}:{creds.password}".encode()).decode()
                json.dump({"auths": {ref.registry: {"auth": token}}}, fh)
            args += [f"--{side}-authfile", str(path)]
        yield args


@contextlib.contextmanager
def _policy_args() -> Iterator[list[str]]:
    """skopeo refuses to run without a signature policy; the system's is used when present."""
    home = Path.home() / ".config" / "containers" / "policy.json"
    if Path("/etc/containers/policy.json").exists() or home.exists():
        yield []
        return
    with tempfile.TemporaryDirectory(prefix="qualify-policy-") as tmp:
        path = Path(tmp) / "policy.json"
        path.write_text(json.dumps({"default": [{"type": "insecureAcceptAnything"}]}))
        yield ["--policy", str(path)]


def _skopeo_error(what: str, stderr: str) -> RegistryError:
    lines = [line.strip() for line in (stderr or "").splitlines() if line.strip()]
    tail = lines[-1] if lines else "no message"
    tail = re.sub(r"(?i)(authorization|password|token)[=:]\s*\S+", r"\1=<redacted>", tail)[:500]
    low = (stderr or "").lower()
    if "connection refused" in low or "no such host" in low or "i/o timeout" in low or "server gave http response" in low:
        return RegistryUnreachable(f"{what}: a registry is unreachable: {tail}")
    if "unauthorized" in low or "authentication required" in low or "denied" in low:
        return RegistryUnauthorized(f"{what}: access refused: {tail}")
    if "manifest unknown" in low or "not found" in low:
        return ImageNotFound(f"{what}: not found: {tail}")
    return CopyFailed(f"{what}: skopeo failed: {tail}")

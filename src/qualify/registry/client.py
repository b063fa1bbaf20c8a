"""A small client of the registry HTTP API (OCI Distribution): resolve references to digests, and copy
by digest without re-serialising (GET the exact bytes, PUT them back; blobs mounted across
repositories; skopeo across registries). Every copy is resolved again and must keep its digest."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import httpx

from qualify.imageref import DEFAULT_REGISTRY, ImageRef, InvalidReference, parse_reference
from qualify.registry.copier import NeedSkopeo, skopeo_copy
from qualify.registry.credentials import Credentials, find_credentials
from qualify.registry.errors import (CopyFailed, DigestMismatch, ImageNotFound, RegistryError, RegistryUnauthorized,
                                     RegistryUnreachable)
from qualify.registry.transport import is_loopback, plain_http

LOG = logging.getLogger(__name__)

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
MANIFEST_TYPES = (OCI_INDEX, OCI_MANIFEST, DOCKER_LIST, DOCKER_MANIFEST)
INDEX_TYPES = (OCI_INDEX, DOCKER_LIST)
ACCEPT = ", ".join(MANIFEST_TYPES)


@dataclass(frozen=True)
class ImageManifest:
    body: bytes
    media_type: str
    digest: str

    def json(self) -> dict[str, Any]:
        return json.loads(self.body)

    @property
    def is_index(self) -> bool:
        return self.media_type in INDEX_TYPES


@dataclass(frozen=True)
class CopyResult:
    source: str
    target: str
    digest: str
    method: str  # "api" | "api+mount" | "skopeo"


def sha256_digest(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()



def _as_ref(ref: ImageRef | str) -> ImageRef:
    if isinstance(ref, ImageRef):
        return ref
    try:
        return parse_reference(ref)
    except InvalidReference as exc:
        raise RegistryError(str(exc)) from None


def _challenge(header: str) -> tuple[str, dict[str, str]]:
    scheme, _, rest = header.strip().partition(" ")
    params = {k.lower(): v for k, v in re.findall(r'(\w+)="([^"]*)"', rest)}
    return scheme.lower(), params


class RegistryClient:
    """Registry API calls for one process; thread-compatible but not shared across threads."""

    def __init__(self, insecure: Iterable[str] = (), *, timeout: float = 60.0,
                 env: Mapping[str, str] | None = None, skopeo: str = "skopeo",
                 skopeo_timeout: float = 3600.0, transport: httpx.BaseTransport | None = None) -> None:
        self.insecure = {h.strip() for h in insecure if h and h.strip()}
        self.timeout = timeout
        self.env = dict(os.environ if env is None else env)
        self.skopeo = skopeo
        self.skopeo_timeout = skopeo_timeout
        self._transport = transport
        self._clients: dict[str, httpx.Client] = {}
        self._tokens: dict[tuple[str, str], str] = {}

    # ----------------------------------------------------------------- plumbing

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()

    def __enter__(self) -> "RegistryClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def is_insecure(self, registry: str) -> bool:
        return plain_http(registry, self.insecure)

    def base_url(self, registry: str) -> str:
        host = "registry-1.docker.io" if registry == DEFAULT_REGISTRY else registry
        return f"{'http' if self.is_insecure(registry) else 'https'}://{host}"

    def _client(self, registry: str) -> httpx.Client:
        if registry not in self._clients:
            # Loopback registries never go through a proxy from the environment.
            self._clients[registry] = httpx.Client(timeout=self.timeout, verify=True, follow_redirects=True,
                                                   trust_env=not is_loopback(registry),
                                                   transport=self._transport)
        return self._clients[registry]

    @staticmethod
    def _may_send_secrets(url: str) -> bool:
        """Credentials travel only over TLS, or over plain HTTP to a loopback host (a local test registry)."""
        parsed = httpx.URL(url)
        return parsed.scheme == "https" or (parsed.scheme == "http" and is_loopback(parsed.netloc.decode()))

    def _credentials(self, ref: ImageRef) -> Credentials | None:
        return find_credentials(ref.registry, ref.repository, self.env)

    def _request(self, method: str, ref: ImageRef, path: str, *, what: str, actions: str = "pull",
                 extra_scopes: tuple[str, ...] = (), headers: dict[str, str] | None = None,
                 content: bytes | None = None, params: dict[str, str] | None = None) -> httpx.Response:
        url = f"{self.base_url(ref.registry)}/v2/{path}"
        scope = f"repository:{ref.repository}:{actions}"
        key = (ref.registry, " ".join((scope, *extra_scopes)))
        base_headers = dict(headers or {})
        if key in self._tokens:
            base_headers["Authorization"] = self._tokens[key]
        response = self._send(method, url, ref, what, base_headers, content, params)
        if response.status_code == 401:
            auth = self._authorise(ref, response, scope, extra_scopes, what)
            if auth:
                self._tokens[key] = auth
                base_headers["Authorization"] = auth
                response = self._send(method, url, ref, what, base_headers, content, params)
        if response.status_code in (401, 403):
            creds = self._credentials(ref)
            raise RegistryUnauthorized(
                f"{what}: registry {ref.registry} refused access (HTTP {response.status_code}"
                + (f", as user {creds.username!r} from {creds.source}" if creds else ", no credentials found")
                + f"){_error_detail(response)}")
        if response.status_code >= 500:
            raise RegistryUnreachable(f"{what}: registry {ref.registry} answered HTTP {response.status_code}"
                                      f"{_error_detail(response)}")
        return response

    def _send(self, method: str, url: str, ref: ImageRef, what: str, headers: dict[str, str],
              content: bytes | None, params: dict[str, str] | None) -> httpx.Response:
        try:
            return self._client(ref.registry).request(method, url, headers=headers, content=content, params=params)
        except httpx.TimeoutException:
            raise RegistryUnreachable(f"{what}: registry {ref.registry} timed out after {self.timeout:g}s") from None
        except httpx.TransportError as exc:
            hint = ""
            text = str(exc)
            if "SSL" in text or "TLS" in text or "certificate" in text.lower():
                hint = " (TLS failed: a plain-HTTP registry must be listed as insecure)"
            raise RegistryUnreachable(f"{what}: registry {ref.registry} is unreachable: "
                                      f"{type(exc).__name__}: {text or 'no detail'}{hint}") from None

    def _authorise(self, ref: ImageRef, response: httpx.Response, scope: str, extra_scopes: tuple[str, ...],
                   what: str) -> str | None:
        scheme, params = _challenge(response.headers.get("WWW-Authenticate", ""))
        creds = self._credentials(ref)
        if scheme == "basic":
            if creds and not self._may_send_secrets(self.base_url(ref.registry)):
                raise RegistryUnauthorized(f"{what}: registry {ref.registry} asks for credentials over plain HTTP; "
                                           "refusing to send them to a host that is not loopback")
            return creds.basic_header() if creds else None
        if scheme != "bearer" or "realm" not in params:
            return None
        realm = params["realm"]
        if creds and not self._may_send_secrets(realm):
            raise RegistryUnauthorized(f"{what}: registry {ref.registry} asks for credentials over plain HTTP "
                                       f"({realm.split('?')[0]}); refusing to send them")
        query: list[tuple[str, str]] = []
        if params.get("service"):
            query.append(("service", params["service"]))
        scopes = [params.get("scope") or scope, *extra_scopes]
        query.extend(("scope", s) for s in dict.fromkeys(scopes))
        headers = {"Authorization": creds.basic_header()} if creds else {}
        try:
            with httpx.Client(timeout=self.timeout, verify=True, trust_env=not is_loopback(ref.registry),
                              transport=self._transport) as client:
                token_resp = client.get(realm, params=query, headers=headers)
        except httpx.HTTPError as exc:
            raise RegistryUnreachable(f"{what}: token service of {ref.registry} is unreachable: "
                                      f"{type(exc).__name__}") from None
        if token_resp.status_code in (401, 403):
            raise RegistryUnauthorized(f"{what}: token service of {ref.registry} refused "
                                       + (f"user {creds.username!r} from {creds.source}" if creds else "anonymous access")
                                       + f" (HTTP {token_resp.status_code})")
        if token_resp.status_code != 200:
            raise RegistryUnreachable(f"{what}: token service of {ref.registry} answered HTTP {token_resp.status_code}")
        try:
            data = token_resp.json()
        except ValueError:
            raise RegistryUnreachable(f"{what}: token service of {ref.registry} sent no JSON") from None
        token = data.get("token") or data.get("access_token")
        return f"Bearer {token}" if token else None

    # ----------------------------------------------------------------- manifests

    def get_manifest(self, ref: ImageRef | str) -> ImageManifest:
        """The manifest's exact bytes, media type and verified digest."""
        ref = _as_ref(ref)
        what = f"get {ref}"
        resp = self._request("GET", ref, f"{ref.repository}/manifests/{ref.reference}", what=what,
                             headers={"Accept": ACCEPT})
        if resp.status_code == 404:
            raise ImageNotFound(f"{ref} not found in registry {ref.registry}{_error_detail(resp)}")
        if resp.status_code != 200:
            raise RegistryError(f"{what}: HTTP {resp.status_code}{_error_detail(resp)}")
        body = resp.content
        digest = sha256_digest(body)
        header = resp.headers.get("Docker-Content-Digest")
        if header and header != digest:
            raise DigestMismatch(f"{ref}: registry says {header} but the manifest bytes hash to {digest}")
        if ref.digest and ref.digest != digest:
            raise DigestMismatch(f"{ref}: the manifest bytes hash to {digest}, not the requested digest")
        media_type = resp.headers.get("Content-Type", "").split(";")[0].strip()
        if not media_type:
            try:
                media_type = json.loads(body).get("mediaType", "")
            except ValueError:
                media_type = ""
        return ImageManifest(body, media_type, digest)

    def resolve(self, ref: ImageRef | str) -> str:
        """The digest a reference points to now, verified against the manifest bytes."""
        return self.get_manifest(ref).digest

    def digest_if_exists(self, ref: ImageRef | str) -> str | None:
        """HEAD: the digest a tag points to, or None when the tag (or repository) does not exist."""
        ref = _as_ref(ref)
        what = f"check {ref}"
        resp = self._request("HEAD", ref, f"{ref.repository}/manifests/{ref.reference}", what=what,
                             headers={"Accept": ACCEPT})
        if resp.status_code == 404:
            return None
        if resp.status_code != 200:
            raise RegistryError(f"{what}: HTTP {resp.status_code}")
        header = resp.headers.get("Docker-Content-Digest")
        if header:
            return header
        try:
            return self.resolve(ref)
        except ImageNotFound:
            return None

    def put_manifest(self, ref: ImageRef | str, manifest: ImageManifest) -> str:
        """PUT the exact bytes under ref's tag (or digest); returns the digest the registry stored."""
        ref = _as_ref(ref)
        what = f"push manifest to {ref}"
        resp = self._request("PUT", ref, f"{ref.repository}/manifests/{ref.reference}", what=what,
                             actions="pull,push", headers={"Content-Type": manifest.media_type},
                             content=manifest.body)
        if resp.status_code == 404:
            raise ImageNotFound(f"{what}: the registry is missing something the manifest references"
                                f"{_error_detail(resp)}")
        if resp.status_code not in (200, 201, 202):
            raise CopyFailed(f"{what}: HTTP {resp.status_code}{_error_detail(resp)}")
        stored = resp.headers.get("Docker-Content-Digest") or manifest.digest
        if stored != manifest.digest:
            raise DigestMismatch(f"{what}: the registry stored {stored}, expected {manifest.digest}")
        return stored

    # ----------------------------------------------------------------- blobs

    def blob_exists(self, ref: ImageRef, digest: str) -> bool:
        resp = self._request("HEAD", ref, f"{ref.repository}/blobs/{digest}", what=f"check blob {digest} in {ref.name}")
        return resp.status_code == 200

    def mount_blob(self, target: ImageRef, digest: str, source_repository: str) -> bool:
        """Cross-repository mount within one registry; False when the registry started an upload
        instead (that upload is cancelled)."""
        what = f"mount {digest} from {source_repository} into {target.name}"
        resp = self._request("POST", target, f"{target.repository}/blobs/uploads/", what=what,
                             actions="pull,push", extra_scopes=(f"repository:{source_repository}:pull",),
                             params={"mount": digest, "from": source_repository}, content=b"")
        if resp.status_code == 201:
            return True
        if resp.status_code == 202 and resp.headers.get("Location"):
            location = resp.headers["Location"]
            if location.startswith("/"):
                location = self.base_url(target.registry) + location
            with contextlib.suppress(RegistryError, httpx.HTTPError):
                self._client(target.registry).delete(location)
        return False

    def get_blob(self, ref: ImageRef | str, digest: str, *, max_bytes: int = 16 << 20) -> bytes:
        """A small blob's bytes (attestation envelopes, configs), verified against its digest."""
        ref = _as_ref(ref)
        what = f"get blob {digest} of {ref.name}"
        resp = self._request("GET", ref, f"{ref.repository}/blobs/{digest}", what=what)
        if resp.status_code == 404:
            raise ImageNotFound(f"{what}: not found{_error_detail(resp)}")
        if resp.status_code != 200:
            raise RegistryError(f"{what}: HTTP {resp.status_code}{_error_detail(resp)}")
        if len(resp.content) > max_bytes:
            raise RegistryError(f"{what}: larger than {max_bytes} bytes")
        if sha256_digest(resp.content) != digest:
            raise DigestMismatch(f"{what}: the bytes hash to {sha256_digest(resp.content)}")
        return resp.content

    def upload_blob(self, ref: ImageRef | str, data: bytes) -> str:
        """Upload a small blob to ref's repository in one request (POST, then PUT with the digest); a blob
        already there is not sent again. Returns its digest."""
        ref = _as_ref(ref)
        digest = sha256_digest(data)
        if self.blob_exists(ref, digest):
            return digest
        what = f"upload blob {digest} to {ref.name}"
        resp = self._request("POST", ref, f"{ref.repository}/blobs/uploads/", what=what, actions="pull,push")
        location = resp.headers.get("Location")
        if resp.status_code != 202 or not location:
            raise CopyFailed(f"{what}: HTTP {resp.status_code}{_error_detail(resp)}")
        url = httpx.URL(location if not location.startswith("/") else self.base_url(ref.registry) + location)
        base = httpx.URL(self.base_url(ref.registry))
        if (url.scheme, url.netloc) != (base.scheme, base.netloc) or not url.path.startswith("/v2/"):
            raise CopyFailed(f"{what}: the registry sent the upload elsewhere ({url.scheme}://{url.host}); "
                             "not supported for attestations")
        params = dict(url.params.multi_items())
        params["digest"] = digest
        resp = self._request("PUT", ref, url.path[len("/v2/"):], what=what, actions="pull,push", params=params,
                             headers={"Content-Type": "application/octet-stream"}, content=data)
        if resp.status_code not in (201, 204):
            raise CopyFailed(f"{what}: HTTP {resp.status_code}{_error_detail(resp)}")
        return digest

    def referrers(self, ref: ImageRef | str, digest: str) -> dict[str, Any] | None:
        """The OCI 1.1 referrers index of `digest` in ref's repository, or None when the registry has no
        referrers API (Distribution 2.x answers 404; an API that exists answers an image index)."""
        ref = _as_ref(ref)
        what = f"list referrers of {digest} in {ref.name}"
        resp = self._request("GET", ref, f"{ref.repository}/referrers/{digest}", what=what,
                             headers={"Accept": OCI_INDEX})
        if resp.status_code != 200:
            return None
        if resp.headers.get("Content-Type", "").split(";")[0].strip() != OCI_INDEX:
            return None
        try:
            doc = resp.json()
        except ValueError:
            return None
        return doc if isinstance(doc, dict) and isinstance(doc.get("manifests"), list) else None

    def delete_manifest(self, ref: ImageRef | str, digest: str) -> bool:
        """DELETE a manifest by digest; False when the registry does not allow it."""
        ref = _as_ref(ref)
        resp = self._request("DELETE", ref, f"{ref.repository}/manifests/{digest}", what=f"delete {digest}",
                             actions="pull,push,delete")
        return resp.status_code in (200, 202)

    # ----------------------------------------------------------------- copies

    def copy(self, source: ImageRef | str, target: ImageRef | str) -> CopyResult:
        """Copy source (which must carry a digest) to target's tag, keeping the digest; then
        resolve the target and check it has the source digest."""
        src, dst = _as_ref(source), _as_ref(target)
        if not src.digest:
            raise RegistryError(f"copy from {src}: the source must be a digest reference")
        if not dst.tag or dst.digest:
            raise RegistryError(f"copy to {dst}: the target must be a tag reference")
        method = "skopeo"
        if src.registry == dst.registry:
            try:
                method = self._copy_within(src, dst)
            except NeedSkopeo as exc:
                LOG.info("copy %s -> %s: %s; using skopeo", src, dst, exc)
                skopeo_copy(src, dst, env=self.env, src_plain_http=self.is_insecure(src.registry),
                            dst_plain_http=self.is_insecure(dst.registry), skopeo=self.skopeo, timeout_s=self.skopeo_timeout)
        else:
            skopeo_copy(src, dst, env=self.env, src_plain_http=self.is_insecure(src.registry),
                            dst_plain_http=self.is_insecure(dst.registry), skopeo=self.skopeo, timeout_s=self.skopeo_timeout)
        landed = self.resolve(dst)
        if landed != src.digest:
            raise DigestMismatch(f"after copying {src} to {dst}, the target resolves to {landed}")
        return CopyResult(str(src), str(dst), landed, method)

    def _copy_within(self, src: ImageRef, dst: ImageRef) -> str:
        manifest = self.get_manifest(src)
        mounted = False
        if src.repository != dst.repository:
            mounted = self._ensure_referenced(src, dst, manifest)
        self.put_manifest(dst, manifest)
        return "api+mount" if mounted else "api"

    def _ensure_referenced(self, src: ImageRef, dst: ImageRef, manifest: ImageManifest) -> bool:
        """Make every blob and child manifest of `manifest` exist in dst's repository."""
        doc = manifest.json()
        mounted = False
        if manifest.is_index or "manifests" in doc:
            for child in doc.get("manifests", []):
                child_ref = src.with_digest(child["digest"])
                child_manifest = self.get_manifest(child_ref)
                mounted |= self._ensure_referenced(src, dst, child_manifest)
                self.put_manifest(dst.with_digest(child["digest"]), child_manifest)
            return mounted
        blobs = [doc.get("config", {}).get("digest")] + [layer.get("digest") for layer in doc.get("layers", [])
                                                          if not layer.get("urls")]
        for digest in filter(None, dict.fromkeys(blobs)):
            if self.blob_exists(dst, digest):
                continue
            if not self.mount_blob(dst, digest, src.repository):
                raise NeedSkopeo(f"registry {dst.registry} did not mount {digest}")
            mounted = True
        return mounted

    # ----------------------------------------------------------------- skopeo


def _error_detail(response: httpx.Response) -> str:
    """The registry's own error code, e.g. MANIFEST_UNKNOWN (never request headers)."""
    try:
        errors = response.json().get("errors") or []
    except (ValueError, AttributeError):
        return ""
    codes = [f"{e.get('code')}: {e.get('message')}" for e in errors if isinstance(e, dict)]
    return f" ({'; '.join(codes)[:300]})" if codes else ""

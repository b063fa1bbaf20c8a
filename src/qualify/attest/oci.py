"""Attestations stored next to the image, in the layout cosign writes and reads.

cosign (`cosign attest`, pkg/oci/static + pkg/oci/empty) stores the attestations of an image as one OCI image
manifest whose layers are the DSSE envelopes: layer media type `application/vnd.dsse.envelope.v1+json`, layer
annotations `predicateType` and `dev.cosignproject.cosign/signature` (empty: the signature is inside the
envelope), an image config whose rootfs lists the layers. Where it lives:

* `<repository>:sha256-<hex>.att` (the tag scheme; Distribution 2.x, e.g. Debian's docker-registry, has nothing
  else), or
* a manifest with `subject` = the image, found through the OCI 1.1 referrers API, where the registry answers it.

Writing replaces the layers of qualify's predicate types and keeps anyone else's (cosign `attest --replace`
semantics), so the stored attestation is always about the digest's latest decision: an admission controller
accepts any layer that verifies, and a stale PASS must not stay beside a newer FAIL.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any, Iterable

from qualify.imageref import ImageRef
from qualify.registry import ImageManifest, ImageNotFound, RegistryClient, sha256_digest
from qualify.registry.client import OCI_MANIFEST

LOG = logging.getLogger(__name__)

DSSE_MEDIA_TYPE = "application/vnd.dsse.envelope.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
PREDICATE_ANNOTATION = "predicateType"
SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"
EPOCH = "0001-01-01T00:00:00Z"  # go-containerregistry's zero time, as cosign's images carry


def att_tag(digest: str) -> str:
    algorithm, _, hex_ = digest.partition(":")
    return f"{algorithm}-{hex_}.att"


@dataclass(frozen=True)
class Layer:
    predicate_type: str
    envelope: bytes
    where: str  # the manifest it was read from (tag or referrer digest)


def _descriptor(media_type: str, body: bytes, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"mediaType": media_type, "size": len(body), "digest": sha256_digest(body)}
    if annotations:
        out["annotations"] = annotations
    return out


def build_manifest(layers: list[tuple[dict[str, Any], bytes]],
                   subject: dict[str, Any] | None = None) -> tuple[ImageManifest, bytes]:
    """The attestation image: (manifest, config bytes). `layers` are (descriptor, blob) pairs."""
    config = {"architecture": "", "config": {}, "created": EPOCH,
              "history": [{"created": EPOCH} for _ in layers], "os": "",
              "rootfs": {"type": "layers", "diff_ids": [d["digest"] for d, _ in layers]}}
    config_bytes = json.dumps(config, separators=(",", ":")).encode()
    doc: dict[str, Any] = {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                           "config": _descriptor(OCI_CONFIG, config_bytes), "layers": [d for d, _ in layers]}
    if subject is not None:
        doc["subject"] = subject
    body = json.dumps(doc, separators=(",", ":")).encode()
    return ImageManifest(body, OCI_MANIFEST, sha256_digest(body)), config_bytes


def envelope_layer(predicate_type: str, envelope: bytes) -> tuple[dict[str, Any], bytes]:
    return _descriptor(DSSE_MEDIA_TYPE, envelope, {SIGNATURE_ANNOTATION: "", PREDICATE_ANNOTATION: predicate_type}), envelope


def _layers_of(client: RegistryClient, repo: ImageRef, manifest: ImageManifest, where: str) -> list[Layer]:
    out = []
    for layer in manifest.json().get("layers", []):
        if layer.get("mediaType") != DSSE_MEDIA_TYPE:
            continue
        ptype = (layer.get("annotations") or {}).get(PREDICATE_ANNOTATION, "")
        out.append(Layer(ptype, client.get_blob(repo, layer["digest"]), where))
    return out


def read(client: RegistryClient, repo: ImageRef, digest: str) -> list[Layer]:
    """Every DSSE layer stored about `digest` in repo's repository (tag scheme, then referrers), oldest first."""
    out: list[Layer] = []
    tag_ref = repo.with_tag(att_tag(digest))
    try:
        manifest = client.get_manifest(tag_ref)
    except ImageNotFound:
        manifest = None
    if manifest is not None:
        out += _layers_of(client, repo, manifest, str(tag_ref))
    index = client.referrers(repo, digest)
    for entry in (index or {}).get("manifests", []):
        if entry.get("artifactType") not in (None, DSSE_MEDIA_TYPE, OCI_CONFIG):
            continue
        ref = repo.with_digest(entry["digest"])
        out += _layers_of(client, repo, client.get_manifest(ref), str(ref))
    return out


@dataclass(frozen=True)
class Written:
    reference: str  # where it was stored
    scheme: str  # "referrers" | "tag"
    manifest_digest: str


def write(client: RegistryClient, repo: ImageRef, digest: str, envelopes: list[tuple[str, bytes]],
          replace: Iterable[str]) -> Written:
    """Store `envelopes` ((predicate type, envelope bytes)) about `digest` in repo's repository, replacing the
    layers whose predicate type is in `replace` and keeping the others."""
    replace = set(replace)
    index = client.referrers(repo, digest)
    if index is not None:
        return _write_referrer(client, repo, digest, envelopes, replace, index)
    tag_ref = repo.with_tag(att_tag(digest))
    kept: list[tuple[dict[str, Any], bytes | None]] = []
    try:
        existing = client.get_manifest(tag_ref).json()
    except ImageNotFound:
        existing = {}
    for layer in existing.get("layers", []):
        if (layer.get("annotations") or {}).get(PREDICATE_ANNOTATION) not in replace:
            kept.append((layer, None))  # already in this repository
    new = [envelope_layer(ptype, body) for ptype, body in envelopes]
    manifest, config = build_manifest([(d, b or b"") for d, b in kept] + new)
    for _, body in new:
        client.upload_blob(repo, body)
    client.upload_blob(repo, config)
    client.put_manifest(tag_ref, manifest)
    return Written(str(tag_ref), "tag", manifest.digest)


def _write_referrer(client: RegistryClient, repo: ImageRef, digest: str, envelopes: list[tuple[str, bytes]],
                    replace: set[str], index: dict[str, Any]) -> Written:
    subject_manifest = client.get_manifest(repo.with_digest(digest))
    subject = {"mediaType": subject_manifest.media_type, "size": len(subject_manifest.body), "digest": digest}
    new = [envelope_layer(ptype, body) for ptype, body in envelopes]
    manifest, config = build_manifest(new, subject=subject)
    for _, body in new:
        client.upload_blob(repo, body)
    client.upload_blob(repo, config)
    client.put_manifest(repo.with_digest(manifest.digest), manifest)
    # The older referrers that carry only our predicate types are removed (replace semantics).
    for entry in index.get("manifests", []):
        if entry.get("digest") == manifest.digest:
            continue
        try:
            old = client.get_manifest(repo.with_digest(entry["digest"])).json()
        except ImageNotFound:
            continue
        types = {(layer.get("annotations") or {}).get(PREDICATE_ANNOTATION) for layer in old.get("layers", [])}
        if types and types <= replace and not client.delete_manifest(repo, entry["digest"]):
            LOG.warning("attestation %s of %s could not be deleted: the registry refuses deletes", entry["digest"],
                        digest)
    return Written(str(repo.with_digest(manifest.digest)), "referrers", manifest.digest)

"""The OCI 1.1 referrers path of qualify.attest.oci. No registry that answers the referrers API can run here
(Debian's docker-registry is Distribution 2.8), so a small in-memory registry stands in for one, through
httpx.MockTransport (no socket): it stores blobs and manifests by digest, lists a manifest with `subject` as a
referrer, and deletes by digest, as the OCI distribution spec 1.1 says. The tag scheme runs against the real
registry in tests/integration/test_attest.py."""

from __future__ import annotations

import hashlib
import json
import re
import uuid

import httpx

from qualify.attest import oci, statement
from qualify.imageref import ImageRef
from qualify.registry import RegistryClient

OCI_INDEX = "application/vnd.oci.image.index.v1+json"


class ReferrersRegistry:
    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self.manifests: dict[str, tuple[bytes, str]] = {}  # digest -> (body, media type)
        self.tags: dict[str, str] = {}

    @staticmethod
    def digest(body: bytes) -> str:
        return "sha256:" + hashlib.sha256(body).hexdigest()

    def handle(self, request: httpx.Request) -> httpx.Response:  # noqa: C901 - one route table
        path, method = request.url.path, request.method
        if m := re.fullmatch(r"/v2/(.+)/referrers/(sha256:[0-9a-f]+)", path):
            entries = []
            for d, (body, mt) in self.manifests.items():
                doc = json.loads(body)
                if (doc.get("subject") or {}).get("digest") == m.group(2):
                    entries.append({"mediaType": mt, "digest": d, "size": len(body),
                                    "artifactType": doc.get("artifactType") or doc["config"]["mediaType"]})
            return httpx.Response(200, headers={"Content-Type": OCI_INDEX},
                                  json={"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries})
        if m := re.fullmatch(r"/v2/(.+)/blobs/uploads/([0-9a-f]*)", path):
            if method == "POST":
                return httpx.Response(202, headers={"Location": f"/v2/{m.group(1)}/blobs/uploads/{uuid.uuid4().hex}"})
            body = request.read()
            assert self.digest(body) == request.url.params["digest"]
            self.blobs[request.url.params["digest"]] = body
            return httpx.Response(201)
        if m := re.fullmatch(r"/v2/(.+)/blobs/(sha256:[0-9a-f]+)", path):
            if m.group(2) not in self.blobs:
                return httpx.Response(404)
            return httpx.Response(200, content=self.blobs[m.group(2)] if method == "GET" else b"")
        if m := re.fullmatch(r"/v2/(.+)/manifests/(.+)", path):
            ref = m.group(2)
            if method == "PUT":
                body = request.read()
                d = self.digest(body)
                self.manifests[d] = (body, request.headers["Content-Type"])
                if not ref.startswith("sha256:"):
                    self.tags[ref] = d
                return httpx.Response(201, headers={"Docker-Content-Digest": d})
            d = self.tags.get(ref, ref)
            if method == "DELETE":
                return httpx.Response(202 if self.manifests.pop(d, None) else 404)
            if d not in self.manifests:
                return httpx.Response(404)
            body, mt = self.manifests[d]
            return httpx.Response(200, content=body if method == "GET" else b"",
                                  headers={"Content-Type": mt, "Docker-Content-Digest": d})
        return httpx.Response(404)


def test_with_a_referrers_api_the_attestation_is_a_referrer_and_a_rewrite_replaces_it() -> None:
    registry = ReferrersRegistry()
    image = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                        "config": {}, "layers": []}).encode()
    image_digest = registry.digest(image)
    registry.manifests[image_digest] = (image, "application/vnd.oci.image.manifest.v1+json")
    repo = ImageRef("127.0.0.1:5999", "q/demo")
    with RegistryClient(["127.0.0.1:5999"], transport=httpx.MockTransport(registry.handle)) as client:
        first = oci.write(client, repo, image_digest, [(t, f"one {t}".encode()) for t in statement.PREDICATE_TYPES],
                          replace=statement.PREDICATE_TYPES)
        assert first.scheme == "referrers" and oci.att_tag(image_digest) not in registry.tags
        stored = json.loads(registry.manifests[first.manifest_digest][0])
        assert stored["subject"] == {"mediaType": "application/vnd.oci.image.manifest.v1+json",
                                     "size": len(image), "digest": image_digest}
        assert [layer.envelope for layer in oci.read(client, repo, image_digest)] == [
            f"one {t}".encode() for t in statement.PREDICATE_TYPES]
        second = oci.write(client, repo, image_digest, [(t, f"two {t}".encode()) for t in statement.PREDICATE_TYPES],
                           replace=statement.PREDICATE_TYPES)
        assert second.manifest_digest != first.manifest_digest and first.manifest_digest not in registry.manifests
        assert [layer.envelope for layer in oci.read(client, repo, image_digest)] == [
            f"two {t}".encode() for t in statement.PREDICATE_TYPES]


def test_without_a_referrers_api_the_tag_scheme_is_used() -> None:
    registry = ReferrersRegistry()

    def no_referrers(request: httpx.Request) -> httpx.Response:
        if "/referrers/" in request.url.path:
            return httpx.Response(404)
        return registry.handle(request)

    digest = "sha256:" + "ab" * 32
    with RegistryClient(["127.0.0.1:5999"], transport=httpx.MockTransport(no_referrers)) as client:
        written = oci.write(client, ImageRef("127.0.0.1:5999", "q/demo"), digest, [("x", b"e")], replace=["x"])
    assert written.scheme == "tag" and registry.tags[oci.att_tag(digest)] == written.manifest_digest

"""The registry client against the real Distribution registry, plus credential and auth-flow units."""

from __future__ import annotations

import base64
import json

import httpx
import pytest
from support.registry import push_index, skopeo_digest

from qualify.registry import (
    ACCEPT,
    DigestMismatch,
    ImageNotFound,
    RegistryClient,
    RegistryError,
    RegistryUnauthorized,
    RegistryUnreachable,
    find_credentials,
    sha256_digest,
)

# --------------------------------------------------------------------------- real registry


@pytest.mark.registry
def test_resolve_tag_and_digest(registry, make_image):
    digest = make_image(registry, "team/app", "v1")
    with RegistryClient([registry.host]) as client:
        assert client.resolve(registry.ref("team/app", "v1")) == digest
        assert client.resolve(registry.ref("team/app", digest=digest)) == digest
        assert client.digest_if_exists(registry.ref("team/app", "v1")) == digest
        assert client.digest_if_exists(registry.ref("team/app", "nope")) is None
        assert client.digest_if_exists(registry.ref("team/none", "v1")) is None
        with pytest.raises(ImageNotFound, match="team/app:nope"):
            client.resolve(registry.ref("team/app", "nope"))
        other = "sha256:" + "0" * 64
        with pytest.raises(ImageNotFound, match=other):
            client.resolve(registry.ref("team/app", digest=other))
    assert skopeo_digest(registry.ref("team/app", "v1")) == digest


@pytest.mark.registry
def test_copy_same_repository_new_tag_keeps_digest(registry, make_image):
    digest = make_image(registry, "team/retag", "rc1")
    with RegistryClient([registry.host]) as client:
        result = client.copy(registry.ref("team/retag", digest=digest), registry.ref("team/retag", "1.0"))
    assert result.method == "api" and result.digest == digest
    assert skopeo_digest(registry.ref("team/retag", "1.0")) == digest


@pytest.mark.registry
def test_copy_other_repository_mounts_blobs(registry, make_image):
    digest = make_image(registry, "team/src", "rc1")
    with RegistryClient([registry.host]) as client:
        result = client.copy(registry.ref("team/src", digest=digest), registry.ref("public/dst", "1.0"))
    assert result.method == "api+mount"
    assert skopeo_digest(registry.ref("public/dst", "1.0")) == digest


@pytest.mark.registry
def test_copy_index_keeps_index_digest(registry, tmp_path):
    digest, children = push_index(registry, "team/multi", "rc1", tmp_path)
    with RegistryClient([registry.host]) as client:
        assert client.get_manifest(registry.ref("team/multi", "rc1")).is_index
        result = client.copy(registry.ref("team/multi", digest=digest), registry.ref("public/multi", "1.0"))
        assert result.digest == digest
        for child in children:  # the platform manifests came along, by digest
            assert client.resolve(registry.ref("public/multi", digest=child)) == child
    assert skopeo_digest(registry.ref("public/multi", "1.0")) == digest


@pytest.mark.registry
def test_copy_across_registries_with_skopeo(registry, registry_factory, make_image):
    other = registry_factory()
    digest = make_image(registry, "team/cross", "rc1")
    with RegistryClient([registry.host, other.host]) as client:
        result = client.copy(registry.ref("team/cross", digest=digest), other.ref("mirror/cross", "1.0"))
    assert result.method == "skopeo" and result.digest == digest
    assert skopeo_digest(other.ref("mirror/cross", "1.0")) == digest


@pytest.mark.registry
def test_unreachable_registry_names_the_reference(registry_factory):
    server = registry_factory()
    server.stop()
    ref = server.ref("team/app", "v1")
    with RegistryClient([server.host], timeout=3) as client, pytest.raises(RegistryUnreachable) as info:
        client.resolve(ref)
    assert server.host in str(info.value) and "team/app:v1" in str(info.value)


@pytest.mark.registry
def test_tls_is_verified_unless_listed_insecure(registry, make_image):
    make_image(registry, "team/tls", "v1")
    with RegistryClient([], timeout=5) as client, pytest.raises(RegistryUnreachable, match="insecure"):
        client.resolve(registry.ref("team/tls", "v1"))


@pytest.mark.registry
def test_basic_auth_registry_with_credentials_from_env(registry_factory, make_image):
    user, password = "qualify", "pa55-w0rd-xyz"
    server = registry_factory(auth=(user, password))
    digest = make_image(server, "private/app", "v1")
    ref = server.ref("private/app", "v1")
    with RegistryClient([server.host], env={}) as anonymous, pytest.raises(RegistryUnauthorized) as info:
        anonymous.resolve(ref)
    assert "no credentials" in str(info.value) and password not in str(info.value)
    env = {"QUALIFY_REGISTRY_USERNAME": user, "QUALIFY_REGISTRY_PASSWORD": password, "HOME": "/nonexistent",
           "QUALIFY_REGISTRY_HOST": server.host}
    with RegistryClient([server.host], env=env) as client:
        assert client.resolve(ref) == digest
        # cross-repository copy within the authenticated registry (mount needs pull on the source)
        result = client.copy(server.ref("private/app", digest=digest), server.ref("private/pub", "1.0"))
        assert result.digest == digest
    wrong = {**env, "QUALIFY_REGISTRY_PASSWORD": "not-it-123"}
    with RegistryClient([server.host], env=wrong) as client, pytest.raises(RegistryUnauthorized) as info:
        client.resolve(ref)
    assert "not-it-123" not in str(info.value) and "qualify" in str(info.value)


@pytest.mark.registry
def test_skopeo_copy_with_env_credentials(registry_factory, make_image):
    user, password = "ci", "s3cret-value-42"
    src = registry_factory(auth=(user, password))
    dst = registry_factory(auth=(user, password))
    digest = make_image(src, "team/app", "rc1")
    env = {"QUALIFY_REGISTRY_USERNAME": user, "QUALIFY_REGISTRY_PASSWORD": password, "HOME": "/nonexistent",
           "PATH": "/usr/bin:/bin", "QUALIFY_REGISTRY_HOST": f"{src.host},{dst.host}"}
    with RegistryClient([src.host, dst.host], env=env) as client:
        assert client.copy(src.ref("team/app", digest=digest), dst.ref("team/app", "1.0")).method == "skopeo"
        assert client.resolve(dst.ref("team/app", "1.0")) == digest


# --------------------------------------------------------------------------- credentials


def _auth(user: str, password: str) -> str:
    return base64.b64encode(f"{user}:{password}".encode()).decode()


def test_env_credentials_are_bound_to_their_registry(tmp_path):
    env = {"QUALIFY_REGISTRY_USERNAME": "u", "QUALIFY_REGISTRY_PASSWORD": "p", "HOME": str(tmp_path)}
    assert find_credentials("reg.example.com", env=env) is None  # no host named: sent nowhere
    env["QUALIFY_REGISTRY_HOST"] = "reg.example.com"
    creds = find_credentials("reg.example.com", env=env)
    assert creds is not None and (creds.username, creds.password) == ("u", "p")
    assert find_credentials("attacker.example.net", env=env) is None
    assert find_credentials("reg.example.com:5000", env=env) is None  # another port is another registry
    assert "'p'" not in repr(creds)  # the password is never printed


def test_credentials_from_auth_files(tmp_path):
    home = tmp_path / "home"
    (home / ".docker").mkdir(parents=True)
    (home / ".docker" / "config.json").write_text(json.dumps({"auths": {
        "https://index.docker.io/v1/": {"auth": _auth("hub", "hubpw")},
        "reg.example.com": {"auth": _auth("reg", "regpw")},
        "reg.example.com/team": {"auth": _auth("team", "teampw")},
        "https://other.example.com": {"username": "o", "password": "opw"},
    }}))
    env = {"HOME": str(home)}
    assert find_credentials("docker.io", "library/python", env=env).username == "hub"
    assert find_credentials("reg.example.com", "x/y", env=env).username == "reg"
    assert find_credentials("reg.example.com", "team/app", env=env).username == "team"  # most specific
    assert find_credentials("other.example.com", env=env).password == "opw"
    assert find_credentials("unknown.example.com", env=env) is None
    # REGISTRY_AUTH_FILE (containers auth.json) comes before the docker config
    auth_json = tmp_path / "auth.json"
    auth_json.write_text(json.dumps({"auths": {"reg.example.com": {"auth": _auth("podman", "ppw")}}}))
    assert find_credentials("reg.example.com", "x/y", env={**env, "REGISTRY_AUTH_FILE": str(auth_json)}).username == "podman"


# --------------------------------------------------------------------------- auth flows (mock transport)


MANIFEST = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "config": {"digest": "sha256:" + "1" * 64, "size": 1}, "layers": []}).encode()


def _bearer_registry(seen: list[httpx.Request], *, token_status: int = 200, header_digest: str | None = None):
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.host == "auth.example.com":
            if request.headers.get("Authorization") != "Basic " + _auth("robot", "tok3n-pw"):
                return httpx.Response(401)
            if token_status != 200:
                return httpx.Response(token_status)
            return httpx.Response(200, json={"token": "T-123"})
        if request.headers.get("Authorization") != "Bearer T-123":
            return httpx.Response(401, headers={"WWW-Authenticate":
                                                'Bearer realm="https://auth.example.com/token",'
                                                'service="reg.example.com",scope="repository:team/app:pull"'})
        assert ACCEPT == request.headers["Accept"]
        return httpx.Response(200, content=MANIFEST, headers={
            "Content-Type": "application/vnd.oci.image.manifest.v1+json",
            "Docker-Content-Digest": header_digest or sha256_digest(MANIFEST)})
    return httpx.MockTransport(handler)


ENV = {"QUALIFY_REGISTRY_USERNAME": "robot", "QUALIFY_REGISTRY_PASSWORD": "tok3n-pw", "HOME": "/nonexistent",
       "QUALIFY_REGISTRY_HOST": "reg.example.com"}


def test_bearer_token_flow():
    seen: list[httpx.Request] = []
    with RegistryClient(env=ENV, transport=_bearer_registry(seen)) as client:
        assert client.resolve("reg.example.com/team/app:v1") == sha256_digest(MANIFEST)
        assert client.resolve("reg.example.com/team/app:v1") == sha256_digest(MANIFEST)
    token_requests = [r for r in seen if r.url.host == "auth.example.com"]
    assert len(token_requests) == 1  # the token is reused
    assert token_requests[0].url.params["scope"] == "repository:team/app:pull"
    assert token_requests[0].url.params["service"] == "reg.example.com"
    assert all(r.url.scheme == "https" for r in seen)


def test_bearer_refused_names_user_not_password():
    with RegistryClient(env=ENV, transport=_bearer_registry([], token_status=403)) as client:
        with pytest.raises(RegistryUnauthorized) as info:
            client.resolve("reg.example.com/team/app:v1")
    assert "robot" in str(info.value) and "tok3n-pw" not in str(info.value)


def test_digest_header_mismatch_is_detected():
    transport = _bearer_registry([], header_digest="sha256:" + "f" * 64)
    with RegistryClient(env=ENV, transport=transport) as client, pytest.raises(DigestMismatch, match="team/app:v1"):
        client.resolve("reg.example.com/team/app:v1")


def test_digest_reference_must_hash_to_itself():
    wrong = "sha256:" + "a" * 64
    transport = _bearer_registry([], header_digest=wrong)
    with RegistryClient(env=ENV, transport=transport) as client, pytest.raises(DigestMismatch):
        client.resolve(f"reg.example.com/team/app@{wrong}")


def test_invalid_reference_is_a_registry_error():
    with RegistryClient() as client, pytest.raises(RegistryError, match="not a valid image reference"):
        client.resolve("Not A Reference")

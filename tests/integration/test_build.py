"""Container builders: planning and errors (no engine needed) and real buildah/podman builds
pushed to a throw-away loopback registry (marked container)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from support.containers import (  # noqa: F401
    base_image,
    container_registry,
    require_tools,
    skopeo_digest,
    unique,
)

from qualify.build import BuildError, BuildInputError, build_candidate
from qualify.build.containers import (
    BuildLog,
    component_pins,
    container_store,
    engine_available,
    is_insecure,
    local_base_images,
    plan_build,
)
from qualify.manifest import ReleaseManifest

# The shape of a PEM certificate: build.ca_bundle must hold certificates (and no private key).
FAKE_CERT = "-----BEGIN CERTIFICATE-----\nMIIBfakefakefake\n-----END CERTIFICATE-----\n"

def _release(tmp: Path, *, builder: str = "buildah", repository: str = "127.0.0.1:5000/qualify/t",
             build: dict[str, Any] | None = None, components: list[dict] | None = None,
             insecure: list[str] | None = None) -> ReleaseManifest:
    spec: dict[str, Any] = {"builder": builder}
    if builder != "prebuilt":
        spec["containerfile"] = "Containerfile"
    spec.update(build or {})
    return ReleaseManifest.model_validate({
        "release": {"name": "build-test", "repository": repository, "tag": "1.0", "candidate_tag": "1.0-rc1"},
        "build": spec,
        "components": components or [],
        "custom_cases": [{"name": "nap", "kind": "sleep"}],
        # The loopback registry the test pushes to is listed: plain HTTP needs an explicit opt-in.
        "promotion": {"insecure_registries": insecure if insecure is not None else [repository.split("/")[0]]},
    })


# --------------------------------------------------------------------------- no engine needed


def test_missing_containerfile_names_the_path(tmp_path: Path) -> None:
    release = _release(tmp_path, build={"containerfile": "images/nope/Containerfile"})
    with pytest.raises(BuildError) as err:
        build_candidate(release, data_dir=tmp_path / "data", manifest_dir=tmp_path)
    expected = str((tmp_path / "images" / "nope" / "Containerfile").resolve())
    assert expected in str(err.value) and "not found" in str(err.value)
    assert err.value.log_path and Path(err.value.log_path).parent == tmp_path / "data" / "builds"
    assert expected in err.value.log_tail


def test_missing_context_and_ca_bundle(tmp_path: Path) -> None:
    (tmp_path / "Containerfile").write_text("FROM scratch\n")
    release = _release(tmp_path, build={"context": "ctx"})
    with pytest.raises(BuildError, match="build context .*ctx is not a directory"):
        build_candidate(release, data_dir=tmp_path / "data", manifest_dir=tmp_path)
    release = _release(tmp_path, build={"ca_bundle": "/nonexistent/ca.pem"})
    with pytest.raises(BuildError, match="ca_bundle /nonexistent/ca.pem is not a file"):
        build_candidate(release, data_dir=tmp_path / "data", manifest_dir=tmp_path)
    release = _release(tmp_path, build={"build_args": {"context:wheels": "no-such-dir"}})
    with pytest.raises(BuildError, match="build context 'wheels'"):
        build_candidate(release, data_dir=tmp_path / "data", manifest_dir=tmp_path)


def test_plan_build_args_pins_contexts_and_bundle(tmp_path: Path) -> None:
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "Containerfile").write_text("FROM scratch\n")
    (tmp_path / "wheels").mkdir()
    (tmp_path / "ca.pem").write_text(FAKE_CERT)
    release = _release(tmp_path, build={
        "containerfile": "img/Containerfile", "base_image": "localhost/base",
        "build_args": {"context:wheels": "wheels", "EXTRA": "1", "TORCH_VERSION": "2.13.0+cpu"},
        "ca_bundle": "ca.pem"}, components=[
        {"name": "torch", "expected": "2.13.0", "match": "public"},
        {"name": "flash-attn", "expected": "2.5.7", "match": "exact"},
        {"name": "ray", "expected": "2.43", "match": "prefix"},
        {"name": "python", "source": "python", "expected": "3.11", "match": "prefix"}])
    plan = plan_build(release, tmp_path, BuildLog(tmp_path / "data", "t"))
    assert plan.context == (tmp_path / "img").resolve()
    # Explicit build_args win over component pins; prefix rules and non-packages are no pins.
    assert plan.build_args == {"TORCH_VERSION": "2.13.0+cpu", "FLASH_ATTN_VERSION": "2.5.7", "EXTRA": "1",
                               "BASE_IMAGE": "localhost/base"}
    assert plan.contexts == {"wheels": str((tmp_path / "wheels").resolve())}
    assert plan.ca_bundle == (tmp_path / "ca.pem").resolve()
    assert plan.target == "127.0.0.1:5000/qualify/t:1.0-rc1"
    assert component_pins(release) == {"TORCH_VERSION": "2.13.0", "FLASH_ATTN_VERSION": "2.5.7"}


def test_local_base_images_are_found(tmp_path: Path) -> None:
    (tmp_path / "Containerfile").write_text(
        "ARG BASE_IMAGE=localhost/default-base\nARG OTHER\n"
        "FROM ${BASE_IMAGE} AS builder\nRUN true\n"
        "FROM builder\nFROM docker.io/library/debian:12\nFROM $OTHER\n")
    release = _release(tmp_path, build={"build_args": {"OTHER": "localhost/other:1"}})
    plan = plan_build(release, tmp_path, BuildLog(tmp_path / "data", "t"))
    assert local_base_images(plan) == ["localhost/default-base", "localhost/other:1"]
    release = _release(tmp_path, build={"base_image": "localhost/chosen", "build_args": {"OTHER": "x/y"}})
    plan = plan_build(release, tmp_path, BuildLog(tmp_path / "data", "t"))
    assert local_base_images(plan) == ["localhost/chosen"]


@pytest.mark.parametrize("ref,listed,insecure", [
    ("127.0.0.1:5555/q/img:1", [], False),
    ("127.0.0.1:5555/q/img:1", ["127.0.0.1:5555"], True),
    ("localhost:5000/q/img@sha256:" + "a" * 64, ["localhost:5000"], True),
    ("localhost:5000/q/img@sha256:" + "a" * 64, ["localhost:5001"], False),
    ("registry.example.com/q/img:1", [], False),
    ("registry.example.com:5000/q/img:1", ["registry.example.com:5000"], True),
    ("docker.io/library/python:3", ["registry.example.com"], False),
])
def test_plain_http_only_for_listed_registries(ref: str, listed: list[str], insecure: bool) -> None:
    assert is_insecure(ref, listed) is insecure


def test_docker_without_engine_is_a_clear_error(tmp_path: Path) -> None:
    if engine_available("docker") is None:
        pytest.skip("a Docker engine answers here")
    (tmp_path / "Containerfile").write_text("FROM scratch\n")
    with pytest.raises(BuildError, match="builder 'docker' cannot run: .*(docker info|not installed)"):
        build_candidate(_release(tmp_path, builder="docker"), data_dir=tmp_path / "data", manifest_dir=tmp_path)


def test_build_step_timeout_kills_the_group(tmp_path: Path) -> None:
    log = BuildLog(tmp_path / "data", "t")
    start = time.monotonic()
    with pytest.raises(BuildError, match="exceeded its timeout of 1 s") as err:
        log.run(["sh", "-c", "echo started-step; sleep 30 & wait"], env=None, timeout_s=1, what="slow step")
    assert time.monotonic() - start < 15
    assert "started-step" in err.value.log_tail and "$ sh -c" in err.value.log_tail


def test_store_and_containers_conf(tmp_path: Path) -> None:
    store = container_store(tmp_path / "cache")
    conf = Path(store.conf).read_text()
    for line in ('runtime = "runc"', 'cgroup_manager = "cgroupfs"', 'events_logger = "file"', "nofile=20000:20000"):
        assert line in conf
    assert store.root == str((tmp_path / "cache" / "containers" / "root").resolve())
    assert store.global_args("buildah") == ["--root", store.root, "--runroot", store.runroot]
    assert store.global_args("podman")[:4] == ["--root", store.root, "--runroot", store.runroot]
    assert store.env({})["CONTAINERS_CONF"] == store.conf
    Path(store.conf).write_text("edited")
    assert Path(container_store(tmp_path / "cache").conf).read_text() == conf  # rewritten when it differs


# --------------------------------------------------------------------------- real builds


def _write(context: Path, containerfile: str, **files: str) -> None:
    context.mkdir(parents=True, exist_ok=True)
    (context / "Containerfile").write_text(containerfile)
    for name, text in files.items():
        (context / name).write_text(text)


@pytest.mark.container
def test_failing_run_step_gives_the_log_tail_and_leaves_no_working_container(tmp_path: Path,
                                                                            base_image: str) -> None:  # noqa: F811
    require_tools("buildah", "runc")
    # FROM a tag of the base of this test's own: buildah names the working container after it, so this build's is
    # told from whatever the other test worker builds from the base meanwhile.
    store = container_store()
    buildah = ["buildah", *store.global_args("buildah")]
    own_base = f"localhost/{unique('qualify-failing-base')}"
    subprocess.run([*buildah, "tag", base_image, own_base], env=store.env(), check=True, capture_output=True)
    try:
        _write(tmp_path, f"FROM {own_base}\nRUN echo qualify-marker-before-failure && ls /no/such/dir\n")
        release = _release(tmp_path, repository=f"127.0.0.1:9/{unique('qualify/fail')}")
        with pytest.raises(BuildError) as err:
            build_candidate(release, data_dir=tmp_path / "data", manifest_dir=tmp_path)
        assert "buildah build" in str(err.value) and "failed" in str(err.value)
        tail = err.value.log_tail
        assert "qualify-marker-before-failure" in tail and "/no/such/dir" in tail
        assert Path(err.value.log_path).read_text().endswith(tail[-200:])
        # The failed build's working container is gone, and its overlay with it (buildah keeps it by default).
        listing = subprocess.run([*buildah, "containers", "--format", "{{.ContainerName}}"], env=store.env(),
                                 check=True, capture_output=True, text=True).stdout.split()
        left = [name for name in listing if name.startswith(own_base.split("/", 1)[1])]
        assert left == [], left
    finally:
        subprocess.run([*buildah, "rmi", own_base], env=store.env(), capture_output=True)


@pytest.mark.container
def test_missing_local_base_image_says_how_to_make_it(tmp_path: Path, base_image: str) -> None:  # noqa: F811
    _write(tmp_path, "FROM localhost/qualify-no-such-base\nRUN true\n")
    release = _release(tmp_path, repository=f"127.0.0.1:9/{unique('qualify/nobase')}")
    with pytest.raises(BuildError, match="scripts/base-image.sh"):
        build_candidate(release, data_dir=tmp_path / "data", manifest_dir=tmp_path)


@pytest.mark.container
@pytest.mark.parametrize("builder", ["buildah", "podman"])
def test_build_push_and_digest(tmp_path: Path, base_image: str, container_registry, builder: str) -> None:  # noqa: F811
    require_tools(builder, "skopeo", "runc")
    marker = "QUALIFY-TEST-CA-" + unique("x")
    bundle = tmp_path / "extra-ca.pem"
    bundle.write_text(f"# {marker}\n{FAKE_CERT}")
    (tmp_path / "extra").mkdir()
    (tmp_path / "extra" / "payload.txt").write_text("from a named build context\n")
    _write(tmp_path / "img",
           "ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\nARG GREETING\nARG PIP_CERT\nARG TORCH_VERSION\n"
           "COPY hello.txt /hello.txt\n"
           # The bundle is visible to RUN steps, and PIP_CERT points at it ...
           f"RUN grep -q {marker} \"$PIP_CERT\" && echo \"$GREETING torch=$TORCH_VERSION\" > /greeting\n"
           "RUN --mount=type=bind,from=extra,target=/extra cp /extra/payload.txt /payload.txt\n"
           # ... and not stored: the image keeps its own bundle.
           "CMD [\"cat\", \"/greeting\"]\n",
           **{"hello.txt": "hello\n"})
    repo = f"{container_registry.host}/{unique('qualify/tiny-' + builder)}"
    release = _release(tmp_path, builder=builder, repository=repo, build={
        "containerfile": "img/Containerfile", "context": "img", "base_image": base_image,
        "build_args": {"GREETING": "hi", "context:extra": "extra"}, "ca_bundle": str(bundle)},
        components=[{"name": "torch", "expected": "2.13.0", "match": "public"}])
    store = container_store()
    podman = ["podman", *store.global_args("podman")]
    try:
        _build_push_and_check(tmp_path, release, repo, builder, marker, podman, store)
    finally:  # the test's images leave the store (their layers are the base's, plus a few bytes)
        image_id = subprocess.run([*podman, "image", "inspect", "--format", "{{.Id}}", f"{repo}:1.0-rc1"],
                                  capture_output=True, text=True, env=store.env()).stdout.strip()
        if image_id:
            subprocess.run([*podman, "rmi", "--force", image_id], capture_output=True, env=store.env())


def _build_push_and_check(tmp_path: Path, release: ReleaseManifest, repo: str, builder: str, marker: str,
                          podman: list[str], store: Any) -> None:
    result = build_candidate(release, data_dir=tmp_path / "data", manifest_dir=tmp_path)
    assert result.builder == builder and result.repository == repo and result.tag == "1.0-rc1"
    assert result.digest == skopeo_digest(f"{repo}:1.0-rc1")
    assert result.image_ref == f"{repo}@{result.digest}"
    log = Path(result.log_path)
    assert log.parent == tmp_path / "data" / "builds" and log.name.endswith("-build-test.log")
    assert "--layers" in log.read_text() and result.log_tail

    # What was built: the arguments, the named context, and no trace of the CA bundle.
    out = subprocess.run([*podman, "run", "--rm", "--network", "none", "--tls-verify=false", result.image_ref,
                          "sh", "-c", "cat /greeting /payload.txt; grep -c " + marker +
                          " /etc/ssl/certs/ca-certificates.crt || true"],
                         capture_output=True, text=True, env=store.env(), timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split("\n")
    assert lines[0] == "hi torch=2.13.0" and lines[1] == "from a named build context" and lines[2] == "0"

    # Nothing changed: the layers come from the cache and the same digest is pushed again.
    again = build_candidate(release, data_dir=tmp_path / "data", manifest_dir=tmp_path)
    assert "Using cache" in Path(again.log_path).read_text()
    assert again.digest == skopeo_digest(f"{repo}:1.0-rc1")

    # prebuilt resolves the reference's digest and builds nothing.
    pre = _release(tmp_path, builder="prebuilt", repository=repo, build={"reference": f"{repo}:1.0-rc1"})
    resolved = build_candidate(pre, data_dir=tmp_path / "data", manifest_dir=tmp_path)
    assert resolved.builder == "prebuilt" and resolved.digest == again.digest
    assert resolved.image_ref == f"{repo}@{again.digest}"


class _Listener:
    """A loopback TCP service (stands for PostgreSQL, the Prefect API, Ray) that counts its connections."""

    def __init__(self) -> None:
        import socket
        import threading

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()


@pytest.mark.container
def test_run_steps_reach_no_loopback_service_unless_the_manifest_asks(tmp_path: Path, base_image: str,
                                                                     container_registry) -> None:  # noqa: F811
    require_tools("buildah", "skopeo", "runc")
    listener = _Listener()
    try:
        for mode in ("isolated", "host"):
            # The RUN text differs per mode: --layers would otherwise reuse the first build's layer.
            _write(tmp_path / mode, f"FROM {base_image}\nRUN python3 -c \"import socket; s = socket.socket(); "
                   f"s.settimeout(5); print('{mode}-connect', s.connect_ex(('127.0.0.1', {listener.port})))\"\n")
            repo = f"{container_registry.host}/{unique('qualify/net-' + mode)}"
            release = _release(tmp_path, repository=repo, build={
                "containerfile": f"{mode}/Containerfile", "network": mode})
            before = listener.connections
            result = build_candidate(release, data_dir=tmp_path / "data", manifest_dir=tmp_path)
            log = Path(result.log_path).read_text()
            assert result.network == mode and f"# build network: {mode}" in log
            if mode == "isolated":
                assert listener.connections == before, "a RUN step reached a loopback service"
                assert "--network none" in log and "isolated-connect 0" not in log
            else:
                assert listener.connections == before + 1 and "host-connect 0" in log
                assert any("build.network: host" in note for note in result.opt_ins)
    finally:
        listener.close()


@pytest.mark.container
def test_prebuilt_unknown_reference(tmp_path: Path, container_registry) -> None:  # noqa: F811
    require_tools("skopeo")
    ref = f"{container_registry.host}/qualify/absent:1"
    release = _release(tmp_path, builder="prebuilt", repository=f"{container_registry.host}/qualify/absent",
                       build={"reference": ref})
    with pytest.raises(BuildInputError, match="cannot resolve"):
        build_candidate(release, data_dir=tmp_path / "data", manifest_dir=tmp_path)

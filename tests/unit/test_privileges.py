"""A manifest cannot widen privileges silently (issue 13): build networking, container options,
plain-HTTP registries and build paths. Validation names the field; the builder and the container
executor refuse again at run time. No engine needed (the real builds and runs: test_build.py,
test_container_executor.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from support.paths import REPO

from qualify import container_policy
from qualify.build import BuildInputError
from qualify.build.base import BuildResult
from qualify.build.containers import (
    BuildLog,
    _build_argv,
    container_store,
    manifest_repository,
    plan_build,
)
from qualify.executors.container import ContainerExecutor
from qualify.manifest import ReleaseManifest
from qualify.manifest.load import ManifestError, load_manifest, load_manifest_text
from qualify.workloads import protocol

CERT = "-----BEGIN CERTIFICATE-----\nMIIBfakefakefake\n-----END CERTIFICATE-----\n"


def _release(build: dict[str, Any] | None = None, container: dict[str, Any] | None = None,
             promotion: dict[str, Any] | None = None) -> ReleaseManifest:
    doc: dict[str, Any] = {
        "release": {"name": "p", "repository": "127.0.0.1:5000/q/p", "tag": "1", "candidate_tag": "1-rc1"},
        "custom_cases": [{"name": "nap", "kind": "sleep"}],
    }
    if build is not None:
        doc["build"] = {"builder": "buildah", "containerfile": "Containerfile", **build}
    if container is not None:
        doc["execution"] = {"executor": "container", "container": container}
    if promotion is not None:
        doc["promotion"] = promotion
    return ReleaseManifest.model_validate(doc)


def _problems(yaml_text: str) -> list[str]:
    with pytest.raises(ManifestError) as err:
        load_manifest_text(yaml_text, "m.yaml")
    return [f"{p.field}: {p.message}" for p in err.value.problems]


HEAD = """
release: {name: p, repository: 127.0.0.1:5000/q/p, tag: "1", candidate_tag: "1-rc1"}
custom_cases: [{name: nap, kind: sleep}]
"""


# --------------------------------------------------------------------------- 1. build network


def test_builds_are_isolated_unless_the_manifest_asks_for_host_networking(tmp_path: Path) -> None:
    (tmp_path / "Containerfile").write_text("FROM scratch\n")
    store = container_store(tmp_path / "cache")
    for tool in ("buildah", "podman"):
        plan = plan_build(_release(build={}), tmp_path, BuildLog(tmp_path / "data", "t"))
        argv = _build_argv(tool, store, plan, tmp_path / "iid")
        assert argv[argv.index("--network") + 1] == "none" and plan.network == "isolated"
        assert plan.opt_ins == ()
    plan = plan_build(_release(build={"network": "host"}), tmp_path, BuildLog(tmp_path / "data", "t"))
    argv = _build_argv("buildah", store, plan, tmp_path / "iid")
    assert argv[argv.index("--network") + 1] == "host"
    assert plan.network == "host" and any("build.network: host" in n for n in plan.opt_ins)
    assert {"network", "opt_ins"} <= set(BuildResult.__dataclass_fields__)  # what the report reads


def test_the_cpu_image_says_it_needs_the_network_and_its_wheel_folder() -> None:
    build = load_manifest(REPO / "releases" / "cpu-image.yaml").release.build
    assert build.network == "host"
    assert [h.path for h in build.host_paths] == ["/opt/wheels"]
    assert len(build.opt_in_notes()) == 2


# --------------------------------------------------------------------------- 2. container privileges


def test_the_issue_manifest_is_refused_field_by_field() -> None:
    problems = _problems(HEAD + """
execution:
  executor: container
  container:
    extra_args: [--network, host, -v, "/:/host"]
    privileged: true
    device_template: "/dev/mem{index}"
promotion:
  insecure_registries: ["registry.example.com:5000"]
""")
    text = "\n".join(problems)
    assert "execution.container.privileged:" in text and "opt_ins" in text
    assert "execution.container.extra_args: [0]: '--network' is not allowed: use execution.container.network" in text
    assert "[2]: -v mounts a host path: it needs the opt-in" in text
    assert "execution.container.device_template:" in text
    assert "promotion.insecure_registries: [0]: 'registry.example.com:5000' is not on loopback" in text


def test_reasoned_opt_ins_allow_widening_and_the_report_can_show_them() -> None:
    release = _release(container={
        "privileged": True, "network": "host", "ipc_host": True,
        "extra_args": ["--volume", "/data/models:/models:ro", "--shm-size=8g", "--ulimit", "memlock=-1",
                       "--cap-drop", "ALL", "--security-opt=no-new-privileges", "--pids-limit", "4096", "--init"],
        "device_template": "/dev/ppu{index}",
        "opt_ins": [{"what": "privileged", "reason": "the PPU driver needs raw device access"},
                    {"what": "host-network", "reason": "RDMA between nodes uses the host's interfaces"},
                    {"what": "host-ipc", "reason": "ranks share memory through --ipc=host"},
                    {"what": "host-mounts", "reason": "real weights are read from /data/models"}]},
        promotion={"insecure_registries": ["mirror.corp:5000", "127.0.0.1:5555"],
                   "opt_ins": [{"registry": "mirror.corp:5000", "reason": "the lab mirror has no TLS"}]})
    notes = release.execution.container.opt_in_notes() + release.promotion.opt_in_notes()
    assert len(notes) == 5 and "privileged (the PPU driver needs raw device access)" in notes[0]
    ex = ContainerExecutor.from_manifest(release, "127.0.0.1:5000/q/p@sha256:" + "a" * 64)
    assert ex.policy_problems() == [] and "opt-ins:" in ex.describe()


@pytest.mark.parametrize("container,expected", [
    ({"privileged": True, "opt_ins": [{"what": "privileged", "reason": "short"}]}, "at least 10 characters"),
    ({"opt_ins": [{"what": "privileged", "reason": "not needed at all here"}]}, "is not used"),
    ({"network": "default"}, "default-network"),
    ({"opt_ins": [{"what": "root", "reason": "a reason that is long"}]}, "'privileged', 'host-network'"),
    ({"extra_args": ["-v", "/:/host"],
      "opt_ins": [{"what": "host-mounts", "reason": "mount the whole host"}]}, "other than '/'"),
    ({"extra_args": ["--volume=/run/podman/podman.sock:/s"],
      "opt_ins": [{"what": "host-mounts", "reason": "drive the engine from inside"}]}, "never mounted"),
    ({"extra_args": ["--cap-add", "SYS_ADMIN"]}, "'--cap-add' is not allowed"),
    ({"extra_args": ["--security-opt", "seccomp=unconfined"]}, "not a value qualify allows"),
    ({"extra_args": ["--entrypoint=/bin/sh"]}, "'--entrypoint' is not allowed"),
    ({"extra_args": ["--env-host"]}, "'--env-host' is not allowed"),
    ({"extra_args": ["img2"]}, "is not an option"),
    ({"device_template": "/dev/ppu0"}, "no {index} or {id} placeholder"),
    ({"device_template": "/dev/ppu{index}/../mem"}, "no '..'"),
    ({"device_template": "/dev/{index.__class__}"}, "unknown placeholder"),
    ({"device_template": "/dev/nvme{index}"}, "disk, memory or terminal"),
    ({"device_template": "/tmp/x{index}"}, "under /dev"),
])
def test_container_options_refused(container: dict[str, Any], expected: str) -> None:
    with pytest.raises(ValidationError, match=expected.replace("(", r"\(").replace("{", r"\{")):
        _release(container=container)


@pytest.mark.parametrize("registry,ok", [("127.0.0.1:5555", True), ("localhost:5000", True), ("[::1]:5000", True),
                                         ("registry.example.com", False), ("10.0.0.5:5000", False)])
def test_plain_http_only_on_loopback_unless_opted_in(registry: str, ok: bool) -> None:
    if ok:
        _release(promotion={"insecure_registries": [registry]})
    else:
        with pytest.raises(ValidationError, match="is not on loopback"):
            _release(promotion={"insecure_registries": [registry]})
        _release(promotion={"insecure_registries": [registry],
                            "opt_ins": [{"registry": registry, "reason": "a lab registry without TLS"}]})
    with pytest.raises(ValidationError, match="not in insecure_registries"):
        _release(promotion={"opt_ins": [{"registry": registry, "reason": "a lab registry without TLS"}]})


@pytest.mark.parametrize("options", [
    {"privileged": True},
    {"network": "host"},
    {"ipc_host": True},
    {"extra_args": ("-v", "/:/host")},
    {"extra_args": ("--network", "host")},
    {"device_template": "/dev/mem{index}"},
])
def test_the_executor_refuses_at_run_time_what_the_manifest_could_not_ask(options: dict[str, Any]) -> None:
    # An executor built by hand (or from a stored manifest) is held to the same rule: a bad_case
    # document, and the engine is never started (it does not even exist here).
    ex = ContainerExecutor(image="img", runtime="/nonexistent/podman", cache_root=None, **options)
    outcome = ex.run(protocol.make_case("sleep/x", "sleep", {}), timeout_s=5, gpu_ids=["0"])
    assert outcome.doc["error_class"] == "bad_case", outcome.doc
    assert "execution.container" in outcome.doc["error"] and outcome.command == []


def test_device_ids_cannot_escape_the_template() -> None:
    assert container_policy.device_for("/dev/ppu{index}", "3") == "/dev/ppu3"
    with pytest.raises(ValueError, match="not a plain id"):
        container_policy.device_for("/dev/ppu{index}", "../mem")


# --------------------------------------------------------------------------- 4. build paths


def _repo(tmp_path: Path) -> Path:
    """A git work tree with a manifest folder and an image folder."""
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "releases").mkdir()
    (repo / "images" / "x").mkdir(parents=True)
    (repo / "images" / "x" / "Containerfile").write_text("FROM scratch\n")
    return repo


def test_paths_are_not_expanded_and_a_secret_never_reaches_errors_or_logs(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUALIFY_REGISTRY_PASSWORD", "hunter2-s3cret")
    with pytest.raises(ValidationError, match="build.containerfile"):
        _release(build={"containerfile": "$QUALIFY_REGISTRY_PASSWORD/Containerfile"})
    # The builder refuses again (a ReleaseManifest that skipped validation).
    release = _release(build={})
    release = release.model_copy(update={"build": release.build.model_copy(
        update={"containerfile": "${QUALIFY_REGISTRY_PASSWORD}/Containerfile"})})
    log = BuildLog(tmp_path / "data", "t")
    with pytest.raises(BuildInputError) as err:
        plan_build(release, tmp_path, log)
    assert "build.containerfile" in str(err.value)
    assert "hunter2-s3cret" not in str(err.value) and "hunter2-s3cret" not in log.path.read_text()


@pytest.mark.parametrize("field,value", [
    ("context", "../../outside"),
    ("context", "/etc"),
    ("containerfile", "/etc/hostname"),
    ("context:wheels", "/opt"),
    ("context", "../images/escape"),  # a symlink inside the repository that points outside
])
def test_build_paths_stay_in_the_manifests_repository(tmp_path: Path, field: str, value: str) -> None:
    repo = _repo(tmp_path)
    (tmp_path / "outside").mkdir()
    (repo / "images" / "escape").symlink_to(tmp_path / "outside")
    build: dict[str, Any] = {"containerfile": "../images/x/Containerfile"}
    if field.startswith("context:"):
        build["build_args"] = {field: value}
    else:
        build[field] = value
    with pytest.raises(BuildInputError, match="outside the manifest's repository") as err:
        plan_build(_release(build=build), repo / "releases", BuildLog(tmp_path / "data", "t"))
    name = f"build.build_args['{field}']" if field.startswith("context:") else f"build.{field}"
    assert name in str(err.value) and str(repo) in str(err.value)


def test_inside_the_repository_and_named_host_paths_are_allowed(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    bundle = tmp_path / "corp-ca.pem"  # a host CA file by design: absolute, outside the repository
    bundle.write_text(CERT)
    release = _release(build={
        "containerfile": "../images/x/Containerfile", "context": "../images/x", "ca_bundle": str(bundle),
        "build_args": {"context:wheels": str(wheels)},
        "host_paths": [{"path": str(wheels), "reason": "the torch wheel lies on disk here"}]})
    plan = plan_build(release, repo / "releases", BuildLog(tmp_path / "data", "t"))
    assert plan.context == repo / "images" / "x" and plan.contexts == {"wheels": str(wheels)}
    assert plan.ca_bundle == bundle and any(str(wheels) in n for n in plan.opt_ins)
    assert manifest_repository(repo / "releases") == repo
    assert manifest_repository(tmp_path / "outside-no-git") == tmp_path / "outside-no-git"


@pytest.mark.parametrize("content,problem", [
    ('{"auths": {"registry.example.com": {"auth": "dXNlcjpwYXNz"}}}', "holds no PEM certificate"),
    (CERT + "-----BEGIN PRIVATE KEY-----\nMII\n-----END PRIVATE KEY-----\n", "holds a private key"),
])
def test_ca_bundle_must_be_certificates(tmp_path: Path, content: str, problem: str) -> None:
    (tmp_path / "Containerfile").write_text("FROM scratch\n")
    (tmp_path / "config.json").write_text(content)
    release = _release(build={"ca_bundle": str(tmp_path / "config.json")})
    with pytest.raises(BuildInputError, match=problem):
        plan_build(release, tmp_path, BuildLog(tmp_path / "data", "t"))


def test_host_paths_are_absolute_and_never_the_root(tmp_path: Path) -> None:
    for bad in ("relative/dir", "/", "/opt/../etc", "$HOME/wheels"):
        with pytest.raises(ValidationError, match="build.host_paths"):
            _release(build={"host_paths": [{"path": bad, "reason": "some long enough reason"}]})
    os.symlink("/", tmp_path / "root-link")
    (tmp_path / "Containerfile").write_text("FROM scratch\n")
    release = _release(build={"host_paths": [{"path": str(tmp_path / "root-link"), "reason": "looks harmless"}]})
    with pytest.raises(BuildInputError, match="whole file system"):
        plan_build(release, tmp_path, BuildLog(tmp_path / "data", "t"))

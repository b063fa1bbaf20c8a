"""The container executor: command lines (no engine needed) and real podman runs (marked container).

The real runs use the debootstrap base image (Debian 12, Python 3.11; scripts/base-image.sh,
cached in QUALIFY_CACHE_DIR) and a scratch image without python3.
"""

from __future__ import annotations

import pickle
import subprocess
from pathlib import Path

import pytest
from support.containers import base_image, ensure_no_python_image, require_tools  # noqa: F401 - fixtures

from qualify.executors.container import ContainerExecutor, leftover_containers
from qualify.manifest import Component
from qualify.manifest.load import load_manifest
from qualify.verify import compare_components, probe_case
from qualify.workloads import protocol

# alone: under -n 2 this module has the machine to itself (no container of qualify's left in the shared store: tests/support/machine_share.py).
pytestmark = [pytest.mark.alone, pytest.mark.workload]

REPO = Path(__file__).resolve().parents[2]


def _case(kind: str = "sleep", params: dict | None = None, env: dict | None = None) -> dict:
    return protocol.make_case(f"{kind}/test", kind, params or {}, env=env)


def _flag_value(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]


# --------------------------------------------------------------------------- command lines


def test_least_privilege_by_default() -> None:
    ex = ContainerExecutor(image="127.0.0.1:5000/q/img@sha256:" + "a" * 64, cache_root="/tmp/cache")
    argv = ex.run_argv(_case(env={"NCCL_ALGO": "Ring"}), "qualify-x")
    assert argv[:2] == ["podman", "run"] or "run" in argv
    assert _flag_value(argv, "--network") == ["none"]
    assert "--privileged" not in argv and "--ipc=host" not in argv
    assert "--rm" not in argv and "-i" in argv and _flag_value(argv, "--name") == ["qualify-x"]
    assert not any(a.startswith("--device") or a == "--gpus" for a in argv)
    volumes = _flag_value(argv, "--volume")
    # Only the workload package (read-only) and the cache; nothing else of qualify.
    assert any(v.endswith(":/opt/qualify/qualify/workloads:ro") for v in volumes)
    assert any(v.endswith(":/opt/qualify/qualify/__init__.py:ro") for v in volumes)
    assert "/tmp/cache:/var/cache/qualify" in volumes and len(volumes) == 3
    env = _flag_value(argv, "--env")
    # The case's variables are named on the command line; their values travel in the engine's environment.
    assert "PYTHONPATH=/opt/qualify" in env and "NCCL_ALGO" in env and "Ring" not in " ".join(argv)
    assert ex.run_plan(_case(env={"NCCL_ALGO": "Ring"}), "qualify-x")[1] == {"NCCL_ALGO": "Ring"}
    assert "TORCH_EXTENSIONS_DIR=/var/cache/qualify/torch_extensions" in env
    assert not any(e.startswith("CUDA_VISIBLE_DEVICES=") for e in env)
    assert argv[-4:] == [ex.image, "python3", "-m", "qualify.workloads.sleep"]


def test_options_only_when_asked() -> None:
    ex = ContainerExecutor(image="img", network="host", ipc_host=True, privileged=True, shm_size="8g",
                           extra_args=("--ulimit", "memlock=-1"), workload_root=None, cache_root=None,
                           opt_ins=("host-network", "host-ipc", "privileged"))
    argv = ex.run_argv(_case(), "qualify-y")
    assert _flag_value(argv, "--network") == ["host"]
    assert "--ipc=host" in argv and "--privileged" in argv and _flag_value(argv, "--shm-size") == ["8g"]
    assert argv[argv.index("--ulimit") + 1] == "memlock=-1"
    assert "--volume" not in argv  # the image bakes the workloads in
    assert "PYTHONPATH=/opt/qualify" not in _flag_value(argv, "--env")


@pytest.mark.parametrize("mode,expected", [
    ("cdi", ["--device", "nvidia.com/gpu=2", "--device", "nvidia.com/gpu=3"]),
    ("gpus-flag", ["--gpus", '"device=2,3"']),
])
def test_nvidia_devices_restricted_to_assigned(mode: str, expected: list[str]) -> None:
    ex = ContainerExecutor(image="img", gpu_mode=mode)
    argv = ex.run_argv(_case(), "qualify-z", gpu_ids=["2", "3"])
    joined = " ".join(argv)
    assert " ".join(expected) in joined
    assert "nvidia.com/gpu=0" not in joined and "nvidia.com/gpu=1" not in joined
    env = _flag_value(argv, "--env")
    # The container numbers its devices from 0.
    assert "CUDA_VISIBLE_DEVICES=0,1" in env and "QUALIFY_ASSIGNED_DEVICES=2,3" in env


def test_device_template_for_other_accelerators() -> None:
    ex = ContainerExecutor(image="img", gpu_mode="none", device_template="/dev/ppu{index}", ipc_host=True,
                           opt_ins=("host-ipc",))
    argv = ex.run_argv(_case(), "qualify-p", gpu_ids=["1", "5"])
    assert _flag_value(argv, "--device") == ["/dev/ppu1", "/dev/ppu5"]
    assert "CUDA_VISIBLE_DEVICES=0,1" in _flag_value(argv, "--env")
    ex_all = ContainerExecutor(image="img", gpu_mode="none", privileged=True, opt_ins=("privileged",))
    argv = ex_all.run_argv(_case(), "qualify-q", gpu_ids=["1", "5"])
    assert "--device" not in argv and "CUDA_VISIBLE_DEVICES=1,5" in _flag_value(argv, "--env")


def test_from_manifest_and_pickle() -> None:
    release = load_manifest(REPO / "releases" / "cpu-image.yaml").release
    ref = "127.0.0.1:5555/qualify/cpu-image@sha256:" + "b" * 64
    ex = ContainerExecutor.from_manifest(release, ref)
    assert ex.image == ref and ex.network == "none" and not ex.tls_verify  # loopback: plain HTTP
    assert ex.storage_root and ex.storage_root.endswith("containers/root")
    argv = ex.run_argv(_case(), "qualify-m")
    assert "--tls-verify=false" in argv and argv[argv.index("--root") + 1] == ex.storage_root
    assert pickle.loads(pickle.dumps(ex)) == ex  # Ray ships it to workers
    assert "network none" in ex.describe()
    remote = ContainerExecutor.from_manifest(release, "registry.example.com/q/img@sha256:" + "c" * 64)
    assert remote.tls_verify and "--tls-verify=false" not in remote.run_argv(_case(), "qualify-n")


def test_bad_kind_is_a_document_not_an_exception() -> None:
    ex = ContainerExecutor(image="img", runtime="/nonexistent/podman")
    outcome = ex.run(_case(kind="../etc"), timeout_s=5)
    assert outcome.doc["status"] == "error" and outcome.doc["error_class"] == "bad_case"
    assert protocol.validate_result(outcome.doc) == []


def test_missing_engine_is_infra() -> None:
    ex = ContainerExecutor(image="img", runtime="/nonexistent/podman", cache_root=None)
    outcome = ex.run(_case(), timeout_s=5)
    assert outcome.doc["error_class"] == "infra" and outcome.retryable
    assert protocol.validate_result(outcome.doc) == []


# --------------------------------------------------------------------------- real podman runs


@pytest.fixture(scope="module")
def executor(base_image: str, tmp_path_factory: pytest.TempPathFactory) -> ContainerExecutor:  # noqa: F811
    require_tools("podman", "runc")
    from qualify.build.containers import container_store

    store = container_store()
    return ContainerExecutor(image=base_image, storage_root=store.root, storage_runroot=store.runroot,
                             containers_conf=store.conf,
                             cache_root=str(tmp_path_factory.mktemp("container-cache")))


@pytest.mark.container
def test_sleep_in_container(executor: ContainerExecutor) -> None:
    outcome = executor.run(_case(params={"duration_s": 0.2}), timeout_s=120)
    doc = outcome.doc
    assert protocol.validate_result(doc) == [], doc
    assert doc["status"] == "passed", outcome.stderr_tail
    assert doc["case_id"] == "sleep/test" and doc["metrics"]["wall_s"] >= 0.2
    assert outcome.exit_code == 0 and outcome.command[0] == "podman"


@pytest.mark.container
def test_probe_reports_debian12_python311(executor: ContainerExecutor) -> None:
    components = [
        Component(name="debian", source="os", expected="debian 12", match="prefix"),
        Component(name="python", source="python", expected="3.11", match="prefix"),
        Component(name="pip", expected="23", match="prefix"),
        Component(name="bash", source="command", command=["bash", "--version"],
                  regex=r"version (\d+\.\d+)", expected="5.2", match="prefix"),
        Component(name="ppu-sdk", source="env", env="PPU_SDK_VERSION", expected="1.5.1"),
        # A `cuda` component is what makes the probe import torch (nothing else needs it).
        Component(name="cuda", source="cuda", expected="12", match="prefix", optional=True),
    ]
    case = probe_case(components)
    case["env"] = {"PPU_SDK_VERSION": "1.5.1"}
    outcome = executor.run(case, timeout_s=120)
    assert outcome.doc["status"] == "passed", outcome.doc
    facts = outcome.doc["environment"]["facts"]
    assert facts["os"]["id"] == "debian" and facts["os"]["version_id"] == "12"
    assert facts["python"].startswith("3.11.")
    checks = {c["name"]: c for c in compare_components(components, facts)}
    assert all(c["ok"] for c in checks.values()), checks
    # The image has no torch: the probe says so instead of failing, and the optional cuda component is not there.
    assert "torch_import_error" in facts and checks["cuda"]["actual"] is None
    assert "optional" in checks["cuda"]["detail"]
    wrong = compare_components([Component(name="debian", source="os", expected="ubuntu 24.04", match="prefix")], facts)
    assert not wrong[0]["ok"] and wrong[0]["actual"] == "debian 12"


@pytest.mark.container
def test_nonzero_exit_is_a_crash_document(executor: ContainerExecutor) -> None:
    outcome = executor.run(_case(params={"exit_code": 3}), timeout_s=120)
    doc = outcome.doc
    assert protocol.validate_result(doc) == []
    assert doc["status"] == "error" and doc["error_class"] == "crash" and outcome.exit_code == 3
    assert "exiting with code 3" in doc["log_tail"]
    assert not outcome.retryable
    assert leftover_containers(executor) == []


@pytest.mark.container
def test_failed_workload_keeps_its_document(executor: ContainerExecutor) -> None:
    outcome = executor.run(_case(params={"duration_s": 0, "fail": True}), timeout_s=120)
    assert outcome.doc["status"] == "failed" and outcome.doc["error"] == "asked to fail"


@pytest.mark.container
def test_timeout_kills_and_removes_the_container(executor: ContainerExecutor) -> None:
    outcome = executor.run(_case(params={"hang": True}), timeout_s=4)
    doc = outcome.doc
    assert protocol.validate_result(doc) == []
    # a timeout is retried only when the manifest asks (execution.retry_timeouts, the pipeline decides)
    assert doc["status"] == "error" and doc["error_class"] == "timeout" and not outcome.retryable
    assert outcome.exec_s < 60
    assert leftover_containers(executor) == []
    # and no workload process survives on the host either
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert "qualify.workloads.sleep" not in ps


@pytest.mark.container
def test_image_without_python_is_a_clear_error(executor: ContainerExecutor) -> None:
    image = ensure_no_python_image()
    ex = ContainerExecutor(image=image, storage_root=executor.storage_root,
                           storage_runroot=executor.storage_runroot, containers_conf=executor.containers_conf,
                           cache_root=executor.cache_root)
    outcome = ex.run(_case(), timeout_s=120)
    doc = outcome.doc
    assert protocol.validate_result(doc) == []
    assert doc["status"] == "error" and doc["error_class"] == "crash"
    assert image in doc["error"] and "python3" in doc["error"]
    assert leftover_containers(executor) == []


@pytest.mark.container
def test_unpullable_image_is_infra(executor: ContainerExecutor) -> None:
    ex = ContainerExecutor(image="127.0.0.1:9/qualify/none@sha256:" + "0" * 64, tls_verify=False,
                           storage_root=executor.storage_root, storage_runroot=executor.storage_runroot,
                           containers_conf=executor.containers_conf, cache_root=executor.cache_root)
    outcome = ex.run(_case(), timeout_s=120)
    assert outcome.doc["error_class"] == "infra" and ex.image in outcome.doc["error"]


@pytest.mark.container
def test_no_network_inside_by_default(executor: ContainerExecutor) -> None:
    case = protocol.make_case("probe/net", "probe", {"commands": {"netdev": ["cat", "/proc/net/dev"]},
                                                     "torch": False})
    outcome = executor.run(case, timeout_s=120)
    output = outcome.doc["environment"]["facts"]["commands"]["netdev"]["output"]
    interfaces = {line.split(":")[0].strip() for line in output.splitlines()[2:] if ":" in line}
    assert interfaces == {"lo"}, output


@pytest.mark.container
def test_cache_is_mounted_and_writable(executor: ContainerExecutor) -> None:
    case = protocol.make_case("probe/cache", "probe", {
        "commands": {"touch": ["sh", "-c", "touch $TORCH_EXTENSIONS_DIR.probe && echo ok"]},
        "env": ["QUALIFY_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"], "torch": False})
    outcome = executor.run(case, timeout_s=120)
    facts = outcome.doc["environment"]["facts"]
    assert facts["commands"]["touch"]["output"].strip() == "ok"
    assert facts["env"]["QUALIFY_CACHE_DIR"] == "/var/cache/qualify"
    assert (Path(executor.cache_root) / "torch_extensions.probe").exists()


@pytest.mark.container
def test_case_env_reaches_the_container_without_the_command_line(executor: ContainerExecutor,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # Values travel through the engine's environment (--env NAME) or, for a variable the engine reads
    # itself (TZ), a private --env-file; the driver's own secrets reach neither the engine nor the container.
    monkeypatch.setenv("QUALIFY_REGISTRY_PASSWORD", "hunter2-s3cret-pw")
    case = protocol.make_case("probe/env", "probe", {
        "env": ["QUALIFY_TEST_VALUE", "TZ", "QUALIFY_REGISTRY_PASSWORD", "NCCL_ALGO"], "torch": False},
        env={"QUALIFY_TEST_VALUE": "value with spaces = and $signs", "TZ": "Asia/Shanghai", "NCCL_ALGO": "Ring"})
    outcome = executor.run(case, timeout_s=120)
    assert outcome.doc["status"] == "passed", outcome.doc
    env = outcome.doc["environment"]["facts"]["env"]
    assert env == {"QUALIFY_TEST_VALUE": "value with spaces = and $signs", "TZ": "Asia/Shanghai",
                   "QUALIFY_REGISTRY_PASSWORD": None, "NCCL_ALGO": "Ring"}
    command = " ".join(outcome.command)
    assert "value with spaces" not in command and "Asia/Shanghai" not in command and "Ring" not in command
    assert "--env-file" in command and leftover_containers(executor) == []

"""Secrets stay with the driver (issue 13): what a workload's environment keeps, what looks secret,
the driver's redaction before anything is compared or stored, and manifest env values off the
container engine's command line (the real runs: tests/integration/test_secret_hygiene.py)."""

from __future__ import annotations

import json

import pytest

from qualify.executors.container import ContainerExecutor
from qualify.executors.environment import engine_environment, workload_environment
from qualify.manifest import Component
from qualify.verify import compare_components, probe_case
from qualify.workloads import protocol
from qualify.workloads.secrets import (
    REDACTED,
    is_secret_name,
    looks_like_credential,
    scrub_text,
)

PASSWORD = "hunter2-s3cret-pw"
DRIVER_SECRETS = {
    "QUALIFY_REGISTRY_PASSWORD": PASSWORD, "QUALIFY_REGISTRY_USERNAME": "bot", "QUALIFY_REGISTRY_HOST": "r.example",
    "QUALIFY_DATABASE_URL": f"postgresql+psycopg://qualify:{PASSWORD}@db/qualify", "PGPASSWORD": PASSWORD,
    "PGHOST": "127.0.0.1", "DATABASE_URL": "postgres://db/x", "PREFECT_API_KEY": PASSWORD,
    "PREFECT_API_URL": "http://127.0.0.1:4200/api", "AWS_SECRET_ACCESS_KEY": PASSWORD, "AWS_PROFILE": "prod",
    "GITHUB_TOKEN": PASSWORD, "MY_SERVICE_SECRET": PASSWORD, "HTTP_PROXY_URL": f"http://u:{PASSWORD}@proxy:3128",
    "QUALIFY_ACTOR": "alice", "QUALIFY_RAY_ADDRESS": "auto",
}
KEPT = {"PATH": "/usr/bin:/bin", "HOME": "/root", "QUALIFY_CACHE_DIR": "/cache", "QUALIFY_MODELS_DIR": "/models",
        "NCCL_ALGO": "Ring", "TORCH_EXTENSIONS_DIR": "/cache/te", "OMP_NUM_THREADS": "1", "LANG": "C.UTF-8",
        "PPU_SDK_VERSION": "1.5.1", "CUDA_VISIBLE_DEVICES": "0"}


def test_workload_environment_drops_qualifys_secrets_and_keeps_what_workloads_read() -> None:
    env = workload_environment({**DRIVER_SECRETS, **KEPT})
    assert env == KEPT
    engine = engine_environment({**DRIVER_SECRETS, **KEPT, "REGISTRY_AUTH_FILE": "/run/auth.json"})
    assert engine == {**KEPT, "REGISTRY_AUTH_FILE": "/run/auth.json"}  # the engine's own pull credentials


def test_the_driver_redacts_facts_before_comparing_and_storing() -> None:
    # Whatever an image answers: a check's actual and detail never carry the value.
    components = [Component(name="leak", source="env", env="QUALIFY_REGISTRY_PASSWORD", expected="1.0"),
                  Component(name="url", source="env", env="MIRROR", expected="1"),
                  Component(name="sdk", source="env", env="PPU_SDK_VERSION", expected="1.5.1"),
                  Component(name="tool", source="command", command=["tool", "--version"], expected="2.0")]
    facts = {"env": {"QUALIFY_REGISTRY_PASSWORD": PASSWORD, "MIRROR": f"https://u:{PASSWORD}@m/x",
                     "PPU_SDK_VERSION": "1.5.1"},
             "commands": {"tool": {"returncode": 0, "output": f"tool 2.0 token=Bearer {PASSWORD}{PASSWORD}"}}}
    checks = {c["name"]: c for c in compare_components(components, facts)}
    assert PASSWORD not in json.dumps(checks)
    assert checks["leak"]["actual"] == REDACTED and not checks["leak"]["ok"]
    assert "looks like a secret" in checks["leak"]["detail"]
    assert checks["url"]["actual"] == REDACTED
    assert checks["sdk"]["ok"] and checks["tool"]["ok"] and checks["tool"]["actual"] == "2.0"
    assert probe_case(components)["params"]["env"] == ["QUALIFY_REGISTRY_PASSWORD", "MIRROR", "PPU_SDK_VERSION"]


@pytest.mark.parametrize("name,secret", [("QUALIFY_REGISTRY_PASSWORD", True), ("HF_TOKEN", True), ("PGPASSWORD", True),
                                         ("AWS_SECRET_ACCESS_KEY", True), ("SSH_KEY", True), ("API_KEY", True),
                                         ("PREFECT_API_AUTH_STRING", True), ("DATABASE_URL", True),
                                         ("PPU_SDK_VERSION", False), ("NCCL_ALGO", False), ("KEYBOARD", False),
                                         ("CUDA_VERSION", False), ("BYPASS_CACHE", False)])
def test_secret_names(name: str, secret: bool) -> None:
    assert is_secret_name(name) is secret


@pytest.mark.parametrize("value,credential", [("2.6.0+ppu1.5.1", False), ("sha256:" + "a" * 64, False),
                                              ("http://127.0.0.1:5000/v2/", False), ("https://u:p@h/x", True),
                                              ("hf_" + "a" * 34, True), ("AKIAIOSFODNN7EXAMPLE", True),
                                              ("-----BEGIN RSA PRIVATE KEY-----", True)])
def test_credential_values(value: str, credential: bool) -> None:
    assert looks_like_credential(value) is credential
    assert (scrub_text(f"x {value} y") != f"x {value} y") is credential


def test_case_env_values_never_go_on_the_engines_command_line() -> None:
    token = "hf_" + "x" * 34
    ex = ContainerExecutor(image="img", cache_root=None)
    case = protocol.make_case("train/x", "sleep", {}, env={"HF_TOKEN": token, "NCCL_ALGO": "Ring",
                                                           "LD_PRELOAD": "/usr/lib/libtcmalloc.so"})
    assert token not in " ".join(ex.run_argv(case, "qualify-t"))
    argv, via_engine, via_file = ex.run_plan(case, "qualify-t", env_file="/tmp/private/env")
    assert token not in " ".join(argv) and "Ring" not in argv and "/usr/lib/libtcmalloc.so" not in " ".join(argv)
    assert argv[argv.index("HF_TOKEN") - 1] == "--env" and argv[argv.index("NCCL_ALGO") - 1] == "--env"
    assert via_engine == {"HF_TOKEN": token, "NCCL_ALGO": "Ring"}
    # A variable the engine reads for itself (LD_PRELOAD would load into podman) goes in a private file.
    assert via_file == {"LD_PRELOAD": "/usr/lib/libtcmalloc.so"} and "/tmp/private/env" in argv
    assert ex.engine_env(via_engine)["HF_TOKEN"] == token and "LD_PRELOAD" not in ex.engine_env(via_engine)


@pytest.mark.parametrize("name", ["QUALIFY_*", "A B", "X=Y", ""])
def test_env_names_are_plain(name: str) -> None:
    # `podman run --env 'QUALIFY_*'` would hand the container every matching variable of the engine's environment.
    ex = ContainerExecutor(image="img", runtime="/nonexistent/podman", cache_root=None)
    outcome = ex.run(protocol.make_case("sleep/x", "sleep", {}, env={name: "v"}), timeout_s=5)
    assert outcome.doc["error_class"] == "bad_case"

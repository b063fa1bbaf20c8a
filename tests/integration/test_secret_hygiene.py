"""Secrets stay with the driver (issue 13), with real workloads: a local workload does not inherit
the driver's secrets, the probe redacts inside the image, `qualify cases --json` redacts env values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cli import run_cli

from qualify.executors import LocalExecutor
from qualify.workloads import protocol
from qualify.workloads.secrets import REDACTED

pytestmark = [pytest.mark.workload]

PASSWORD = "hunter2-s3cret-pw"
DRIVER_SECRETS = {
    "QUALIFY_REGISTRY_PASSWORD": PASSWORD, "QUALIFY_REGISTRY_USERNAME": "bot", "QUALIFY_REGISTRY_HOST": "r.example",
    "QUALIFY_DATABASE_URL": f"postgresql+psycopg://qualify:{PASSWORD}@db/qualify", "PGPASSWORD": PASSWORD,
    "PGHOST": "127.0.0.1", "DATABASE_URL": "postgres://db/x", "PREFECT_API_KEY": PASSWORD,
    "PREFECT_API_URL": "http://127.0.0.1:4200/api", "AWS_SECRET_ACCESS_KEY": PASSWORD, "AWS_PROFILE": "prod",
    "GITHUB_TOKEN": PASSWORD, "MY_SERVICE_SECRET": PASSWORD, "HTTP_PROXY_URL": f"http://u:{PASSWORD}@proxy:3128",
    "QUALIFY_ACTOR": "alice", "QUALIFY_RAY_ADDRESS": "auto",
}


def test_local_workload_does_not_inherit_the_drivers_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in DRIVER_SECRETS.items():
        monkeypatch.setenv(name, value)
    names = ["QUALIFY_REGISTRY_PASSWORD", "QUALIFY_DATABASE_URL", "PGPASSWORD", "PREFECT_API_URL", "PATH"]
    case = protocol.make_case("probe/components", "probe", {"env": names, "torch": False})
    outcome = LocalExecutor().run(case, timeout_s=120)
    assert outcome.doc["status"] == "passed", outcome.doc
    env = outcome.doc["environment"]["facts"]["env"]
    assert env["PATH"] and all(env[n] is None for n in names[:-1]), env
    assert PASSWORD not in json.dumps(outcome.doc)


def test_the_probe_redacts_inside_the_image() -> None:
    # Variables the image (here: the case) sets that look secret never leave it.
    token = "ghp_" + "A1b2" * 9
    case = protocol.make_case("probe/components", "probe",
                              {"env": ["SERVICE_PASSWORD", "BUILD_ID", "PPU_SDK_VERSION"], "torch": False,
                               "commands": {"leak": ["sh", "-c", f"echo version 1.2.3 {token}"]}},
                              env={"SERVICE_PASSWORD": PASSWORD, "BUILD_ID": token, "PPU_SDK_VERSION": "1.5.1"})
    outcome = LocalExecutor().run(case, timeout_s=120)
    facts = outcome.doc["environment"]["facts"]
    assert facts["env"] == {"SERVICE_PASSWORD": REDACTED, "BUILD_ID": REDACTED, "PPU_SDK_VERSION": "1.5.1"}
    assert token not in facts["commands"]["leak"]["output"] and "1.2.3" in facts["commands"]["leak"]["output"]


def test_cases_json_redacts_secret_looking_env_values(tmp_path: Path) -> None:
    manifest = tmp_path / "m.yaml"
    manifest.write_text(f"""
release: {{name: p, repository: 127.0.0.1:5000/q/p, tag: "1", candidate_tag: "1-rc1", previous_tag: "0"}}
training:
  models: [{{name: tiny, preset: tiny-llama}}]
  variants:
    - name: base
      env: {{HF_TOKEN: "{PASSWORD}", NCCL_ALGO: Ring}}
""")
    res = run_cli("cases", str(manifest), "--json", timeout=120)
    assert res.returncode == 0, res.stderr
    cases = json.loads(res.stdout)
    assert cases[0]["env"] == {"HF_TOKEN": REDACTED, "NCCL_ALGO": "Ring"}
    assert PASSWORD not in res.stdout

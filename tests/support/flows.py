"""Helpers for the flow tests: manifests of sleep cases and running the real CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from sqlalchemy import create_engine, text

from support.cli import cli_env, run_qualify  # noqa: F401 - re-exported for the flow tests

REPO = Path(__file__).resolve().parents[2]


def sleep_manifest(path: Path, cases: list[dict[str, Any]], *, name: str = "sleepy", tag: str = "1.0",
                   previous: str | None = None, timeout_s: int = 60, retries: int = 1,
                   extra: dict[str, Any] | None = None) -> Path:
    data: dict[str, Any] = {
        "apiVersion": "qualify/v1",
        "release": {"name": name, "repository": f"127.0.0.1:5000/q/{name}", "tag": tag,
                    "candidate_tag": f"{tag}-rc1", **({"previous_tag": previous} if previous else {})},
        "execution": {"executor": "local", "case_timeout_s": timeout_s, "infra_retries": retries},
        "components": [{"name": "python", "source": "python", "expected": "3.11", "match": "prefix"}],
        "custom_cases": cases,
    }
    data.update(extra or {})
    if not previous:  # a first release: nothing to compare with, and the manifest must say so
        gate = data["gate"] = dict(data.get("gate") or {})
        gate["regression"] = {"baseline": "optional", **(gate.get("regression") or {})}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def db_rows(db_url: str, sql: str, **params: Any) -> list[dict[str, Any]]:
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(text(sql), params)]
    finally:
        engine.dispose()


def results(db_url: str, run_id: int) -> dict[str, dict[str, Any]]:
    rows = db_rows(db_url, "SELECT case_id, status, error_class, error, attempts, node, environment, "
                           "queue_wait_s, exec_s FROM case_results WHERE run_id = :r", r=run_id)
    out = {}
    for row in rows:
        env = row["environment"]
        row["environment"] = json.loads(env) if isinstance(env, str) else env
        out[row["case_id"]] = row
    return out




def run_json(tmp: Path, db: str, manifest: Path) -> tuple[int, dict[str, Any]]:
    """`qualify run MANIFEST --json`: its exit code and its outcome."""
    res = run_qualify(["run", str(manifest), "--db", db, "--json"], tmp)
    assert "Traceback" not in res.stderr, res.stderr
    return res.returncode, json.loads(res.stdout)


def case_regression(outcome: dict[str, Any]) -> dict[str, Any]:
    """The first per-case regression reason of a `qualify run --json` outcome."""
    return next(r for r in outcome["reasons"] if r["check"] == "regression" and r.get("case_id"))

"""A digest's decisions through the DB-API driver alone (sqlite3, psycopg): the lean `gate check` (issue 27).

A check process that imports SQLAlchemy pays about 0.25 s for it before it asks anything, on a call CI makes after
every build. The two statements of qualify.store.digest_decisions are kept here as the text SQLAlchemy compiles
them to, for SQLite and for PostgreSQL with psycopg; tests/unit/test_lean_check.py compiles the Core statements
and compares, so the two cannot drift. The rows become the same plain rows (qualify.store.decision_rows).

Standard library only at import (the driver is the caller's connection).
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any, Sequence

from qualify.store.decision_rows import COLUMNS, FurtherImageRow, ImageRow, RunRow, DecisionRow, decision_rows, \
    further_runs_of

DIALECTS = ("sqlite", "postgresql")

_SELECT = (
    "SELECT gate_decisions.id, gate_decisions.run_id, gate_decisions.digest, gate_decisions.verdict, "
    "gate_decisions.reasons, gate_decisions.policy_sha256, gate_decisions.baseline_run_id, gate_decisions.decided_at, "
    "runs.release_id, runs.candidate_digest, runs.manifest_text, releases.name AS release_name, "
    "releases.repository AS release_repository, releases.tag AS release_tag, images.repository AS image_repository \n"
    "FROM gate_decisions JOIN runs ON runs.id = gate_decisions.run_id JOIN releases ON releases.id = runs.release_id "
    "LEFT OUTER JOIN images ON images.id = runs.image_id \n"
    "WHERE gate_decisions.id IN (SELECT gate_decisions.id \n"
    "FROM gate_decisions \n"
    "WHERE gate_decisions.digest = {digest} UNION SELECT gate_decisions.id \n"
    "FROM gate_decisions \n"
    "WHERE gate_decisions.run_id IN (SELECT run_images.run_id \n"
    "FROM run_images \n"
    "WHERE run_images.digest = {digest})) ORDER BY gate_decisions.id")
_FURTHER = ("SELECT run_images.run_id, run_images.name, run_images.digest, images.repository \n"
            "FROM run_images JOIN images ON images.id = run_images.image_id \n"
            "WHERE run_images.run_id IN ({runs}) ORDER BY run_images.id")
_DIGEST = {"sqlite": "?", "postgresql": "%(digest)s::VARCHAR"}


def decisions_sql(dialect: str) -> str:
    return _SELECT.format(digest=_DIGEST[dialect])


def further_sql(dialect: str, count: int) -> str:
    marks = (["?"] * count if dialect == "sqlite" else [f"%(runs_{i})s::INTEGER" for i in range(1, count + 1)])
    return _FURTHER.format(runs=", ".join(marks))


def _params(dialect: str, name: str, values: Sequence[Any]) -> Any:
    """sqlite3 takes the values by position; psycopg by name, as SQLAlchemy names them (digest; runs_1, runs_2...)."""
    if dialect == "sqlite":
        return list(values)
    if name == "digest":
        return {"digest": values[0]}
    return {f"runs_{i}": v for i, v in enumerate(values, start=1)}


_REASONS, _DECIDED_AT = COLUMNS.index("reasons"), COLUMNS.index("decided_at")


def _decoded(dialect: str, row: Sequence[Any]) -> tuple[Any, ...]:
    """What SQLAlchemy's column types would have made of a row: SQLite keeps JSON and timestamps as text (a naive
    timestamp, as SQLAlchemy's SQLite DateTime reads it back); psycopg decodes both itself."""
    if dialect != "sqlite":
        return tuple(row)
    values = list(row)
    if isinstance(values[_REASONS], str):
        values[_REASONS] = json.loads(values[_REASONS])
    if isinstance(values[_DECIDED_AT], str):
        values[_DECIDED_AT] = dt.datetime.fromisoformat(values[_DECIDED_AT])
    return tuple(values)


def read(conn: Any, dialect: str, digest: str) -> list[tuple[DecisionRow, RunRow]]:
    """Every decision about `digest` with its run, oldest first: qualify.store.digest_decisions.decisions_for_digest
    over a DB-API connection of `dialect` ('sqlite' or 'postgresql')."""
    digest_values = [digest, digest] if dialect == "sqlite" else [digest]
    rows = [_decoded(dialect, r) for r in conn.execute(decisions_sql(dialect),
                                                         _params(dialect, "digest", digest_values)).fetchall()]
    runs = further_runs_of(rows, digest)
    further: dict[int, list[FurtherImageRow]] = {}
    if runs:
        for run_id, name, image_digest, repository in conn.execute(further_sql(dialect, len(runs)),
                                                                   _params(dialect, "runs", runs)).fetchall():
            further.setdefault(run_id, []).append(FurtherImageRow(name, image_digest, ImageRow(repository)))
    return decision_rows(rows, further)

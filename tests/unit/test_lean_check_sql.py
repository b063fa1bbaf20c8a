"""The lean `gate check` runs the text of the Core statements without SQLAlchemy (issue 27): the text must be what
SQLAlchemy compiles them to for each dialect, so that a change to one statement that forgets the other fails here;
and its argument reading leaves everything unusual to the full command."""

from __future__ import annotations

import pytest
from sqlalchemy.dialects import sqlite
from sqlalchemy.dialects.postgresql import psycopg

from qualify.cli.lean_check import parse
from qualify.store import digest_decisions, digest_decisions_sql
from qualify.store.decision_rows import COLUMNS

pytestmark = pytest.mark.unit

DIALECTS = {"sqlite": sqlite.dialect(), "postgresql": psycopg.dialect()}


@pytest.mark.parametrize("name", sorted(DIALECTS))
def test_the_stored_statements_are_the_compiled_core_statements(name: str) -> None:
    dialect = DIALECTS[name]
    assert digest_decisions_sql.decisions_sql(name) == str(digest_decisions._DECISIONS.compile(dialect=dialect))
    for runs in ([7], [3, 5, 8]):
        compiled = digest_decisions._FURTHER.params(runs=runs).compile(
            dialect=dialect, compile_kwargs={"render_postcompile": True})
        assert digest_decisions_sql.further_sql(name, len(runs)) == str(compiled)


def test_the_row_builder_reads_the_columns_in_the_statements_order() -> None:
    names = [c.name for c in digest_decisions._DECISIONS.selected_columns]
    assert tuple(names) == COLUMNS


@pytest.mark.parametrize("args, expected", [
    (["r@sha256:a"], {"ref": "r@sha256:a", "--json": False}),
    (["--json", "r@sha256:a", "--db=sqlite:///x"], {"ref": "r@sha256:a", "--json": True, "--db": "sqlite:///x"}),
    (["r@sha256:a", "--release", "demo", "--policy", "ab12"],
     {"ref": "r@sha256:a", "--json": False, "--release": "demo", "--policy": "ab12"}),
])
def test_the_arguments_it_answers(args: list[str], expected: dict) -> None:
    assert parse(args) == expected


@pytest.mark.parametrize("args", [[], ["--json"], ["a", "b"], ["a", "--db"], ["a", "--db", "x", "--db", "y"],
                                  ["a", "--attestation"], ["a", "--key", "k"], ["a", "-h"], ["a", "--help"],
                                  ["a", "--insecure-registry", "h:1"], ["a", "--verbose"]])
def test_anything_else_goes_to_the_full_command(args: list[str]) -> None:
    assert parse(args) is None

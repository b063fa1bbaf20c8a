"""`qualify gate check REPO@DIGEST` without the command-line framework or SQLAlchemy: the question CI asks after
every build, answered in about a tenth of a second (issue 27: the check was 0.6 s a call, most of it imports).

Only the common, successful case is answered here: a digest reference, the options `--db`, `--json`, `--release`,
`--policy`, a `sqlite:///FILE` or `postgresql://` database that exists and is at this qualify's schema. Anything
else (a tag, an attestation, `--help`, an unknown option, a database that cannot be opened or is at another
revision, any error at all) returns None, and the full command (qualify.cli.gate) answers it, with its messages
and exit codes: this path never prints an error of its own, so there is one wording of every refusal.

The answer is the full command's: the same rules (qualify.gate.push_check.judge_push), the same rows (the same two
statements, qualify.store.digest_decisions_sql) and the same rendering (qualify.gate.check_answer).
"""

from __future__ import annotations

import os
import sys
from typing import Any, Sequence

FLAGS_WITH_VALUE = ("--db", "--release", "--policy")


def parse(args: Sequence[str]) -> dict[str, Any] | None:
    """The check's arguments, or None for anything this path leaves to the full command."""
    found: dict[str, Any] = {"ref": None, "--json": False}
    i = 0
    while i < len(args):
        arg = args[i]
        name, eq, value = arg.partition("=")
        if name in FLAGS_WITH_VALUE:
            if name in found:
                return None  # given twice: the full command decides what that means
            if not eq:
                if i + 1 >= len(args):
                    return None
                i += 1
                value = args[i]
            found[name] = value
        elif arg == "--json":
            found["--json"] = True
        elif arg.startswith("-") or found["ref"] is not None:
            return None
        else:
            found["ref"] = arg
        i += 1
    return found if found["ref"] else None


def _connect(url: str) -> tuple[Any, str] | None:
    """A DB-API connection and its dialect, for the URLs whose meaning is plain; None for anything else."""
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///"):]
        if not path or any(c in path for c in "?%#") or not os.path.isfile(path):
            return None  # a missing file is the full command's message (it never creates one either)
        import sqlite3

        conn = sqlite3.connect(path, timeout=30.0)
        conn.execute("PRAGMA busy_timeout=30000")
        return conn, "sqlite"
    for prefix in ("postgresql://", "postgresql+psycopg://"):
        if url.startswith(prefix):
            import psycopg

            # libpq reads the URI as SQLAlchemy does (user, password, host, port, database, its query options).
            return psycopg.connect("postgresql://" + url[len(prefix):], autocommit=True), "postgresql"
    return None


def answer(args: Sequence[str]) -> int | None:
    """Answer `gate check ARGS` and return its exit code, or None to let the full command answer."""
    options = parse(args)
    if options is None:
        return None
    try:
        return _answer(options)
    except Exception:  # noqa: BLE001 - whatever went wrong, the full command says it in its words
        return None


def _answer(options: dict[str, Any]) -> int | None:
    from qualify.imageref import parse_reference
    from qualify.settings import Settings
    from qualify.store.schema_head import SCHEMA_HEAD

    ref = parse_reference(options["ref"])
    if ref.tag or not ref.digest:
        return None  # the tag form asks the registry what it points to now
    opened = _connect(Settings.load(database_url=options.get("--db")).database_url)
    if opened is None:
        return None
    conn, dialect = opened
    try:
        version = conn.execute("SELECT version_num FROM alembic_version").fetchall()
        if [tuple(v) for v in version] != [(SCHEMA_HEAD,)]:
            return None
        from qualify.store.digest_decisions_sql import read

        decisions = read(conn, dialect, ref.digest)
    finally:
        conn.close()
    from qualify.gate import check_answer
    from qualify.gate.push_check import judge_push

    result = judge_push(decisions, ref, ref.digest, release_name=options.get("--release"),
                        policy_sha256=options.get("--policy"))
    text = (check_answer.as_json(result, None) if options["--json"]
            else "\n".join(check_answer.lines(result, options["ref"], ref.digest, None)))
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
    return int(check_answer.exit_code(result))

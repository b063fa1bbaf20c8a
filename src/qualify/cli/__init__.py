"""The `qualify` command line: one module per command group, assembled by qualify.cli.commands.

Exit codes (qualify.errors.ExitCode): 0 success/PASS, 1 FAIL or refused, 2 bad input,
3 infrastructure. Errors become exit codes in one place: common.QualifyGroup.

`main` (the console script) imports only the command it runs; `app` is the whole command line, built on first
use (tests and `python -m qualify --help`). `qualify gate check REPO@DIGEST` is first offered to the lean path
(qualify.cli.lean_check: no command-line framework, no SQLAlchemy), which answers the common case or hands it on.
`qualify run` ends without the interpreter's module teardown (qualify.cli.process_end).
"""

from __future__ import annotations

import sys
from typing import Any


def main() -> None:
    args = sys.argv[1:]
    if args[:2] == ["gate", "check"]:
        from qualify.cli.lean_check import answer

        code = answer(args[2:])
        if code is not None:
            sys.exit(code)
    from qualify.cli.commands import main as full

    if args[:1] != ["run"]:
        full()
        return
    from qualify.cli.process_end import end_now, exit_code

    try:
        full()
    except SystemExit as exc:  # the command's end: its exit handlers run, the module teardown is skipped
        end_now(exit_code(exc))


def __getattr__(name: str) -> Any:
    if name == "app":
        from qualify.cli.commands import build

        app = build()
        globals()["app"] = app
        return app
    raise AttributeError(name)


__all__ = ["app", "main"]

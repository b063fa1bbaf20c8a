"""The `qualify` command line: one module per command group, assembled by qualify.cli.commands.

Exit codes (qualify.errors.ExitCode): 0 success/PASS, 1 FAIL or refused, 2 bad input,
3 infrastructure. Errors become exit codes in one place: common.QualifyGroup.

`main` (the console script) imports only the command it runs; `app` is the whole command line, built on first
use (tests and `python -m qualify --help`).
"""

from __future__ import annotations

from typing import Any

from qualify.cli.commands import main


def __getattr__(name: str) -> Any:
    if name == "app":
        from qualify.cli.commands import build

        app = build()
        globals()["app"] = app
        return app
    raise AttributeError(name)


__all__ = ["app", "main"]

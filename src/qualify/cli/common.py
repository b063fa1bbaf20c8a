"""What every command shares: the consoles, common options, the database, and the error handler.

The handler (QualifyGroup.invoke) is the one place where errors become exit codes: commands raise
QualifyError subclasses (qualify.errors) and never choose an exit code for an error themselves.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click
import typer
from rich.console import Console
from sqlalchemy.exc import SQLAlchemyError

from qualify.errors import ExitCode, QualifyError
from qualify.settings import Settings

if TYPE_CHECKING:  # the manifest model and the ORM load when a command uses them (a gate check never does)
    from sqlalchemy.orm import Session, sessionmaker

    from qualify.manifest.load import LoadedManifest

# Pipes and CI logs get wide lines instead of wrapping references mid-word.
# No automatic highlighting: rich colours numbers and hex runs, i.e. parts of a digest, as if they meant something.
out = Console(width=None if sys.stdout.isatty() else 200, highlight=False)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 200, highlight=False)

DbOption = typer.Option(None, "--db", help="database URL (default: QUALIFY_DATABASE_URL or SQLite in the data dir)")
InsecureOption = typer.Option(None, "--insecure-registry", metavar="HOST:PORT",
                              help="registry reached over plain HTTP (repeatable; loopback tests)")
JsonOption = typer.Option(False, "--json", help="print JSON")


def say(text: str) -> None:
    """One line on stdout, never wrapped and never marked up (CI logs grep these): no emoji codes either (a
    release name or a reason holding `:x:` is printed as written)."""
    out.print(text, markup=False, highlight=False, soft_wrap=True, emoji=False)


def warn(text: str) -> None:
    """One unwrapped line on stderr."""
    err.print(text, markup=False, highlight=False, soft_wrap=True, emoji=False)


def exit_with(code: ExitCode) -> NoReturn:
    """End a command with an outcome's exit code (a verdict, a refusal): not for errors."""
    raise typer.Exit(int(code))


def settings(db: str | None = None) -> Settings:
    return Settings.load(database_url=db)


def open_db(db: str | None, *, migrate: bool = True) -> sessionmaker[Session]:
    """The results database. Read-only commands pass migrate=False: they never change the schema."""
    from qualify.store.engine import open_database

    _, sessions = open_database(settings(db).database_url, migrate=migrate)
    return sessions


def load(path: Path) -> LoadedManifest:
    from qualify.manifest.load import load_manifest

    return load_manifest(path)


def _command_line_exceptions() -> tuple[type[BaseException], ...]:
    """What the command-line layer raises for its own handling (usage errors exit 2 with the usage, --help exits 0).

    typer >= 0.2x vendors click as typer._click: its UsageError is not click's, and an unknown command or a bad
    option must never be reported as an infrastructure failure."""
    found: list[type[BaseException]] = [click.exceptions.Exit, click.exceptions.Abort, click.ClickException,
                                         typer.Exit, typer.Abort]
    try:
        from typer._click import exceptions as vendored
    except ImportError:  # a typer that uses click itself
        return tuple(found)
    return tuple(found + [vendored.ClickException])


COMMAND_LINE_EXCEPTIONS = _command_line_exceptions()


class QualifyGroup(typer.core.TyperGroup):
    """The command group whose invoke maps every error to its exit code, once for all commands."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except COMMAND_LINE_EXCEPTIONS:
            raise
        except QualifyError as exc:
            for line in exc.lines:
                warn(line)
            ctx.exit(int(exc.exit_code))
        except SQLAlchemyError as exc:
            first = str(exc).splitlines()[0][:300] if str(exc) else ""
            warn(f"error: database: {type(exc).__name__}: {first}")
            ctx.exit(int(ExitCode.INFRA))
        except KeyboardInterrupt:
            warn("interrupted")
            ctx.exit(int(ExitCode.INFRA))
        except Exception as exc:  # noqa: BLE001 - a bug or an unforeseen infrastructure failure
            if settings().debug:
                traceback.print_exc()
            first = str(exc).splitlines()[0][:500] if str(exc) else ""
            warn(f"infrastructure error: {type(exc).__name__}: {first}"
                 + ("" if settings().debug else " (QUALIFY_DEBUG=1 shows the traceback)"))
            ctx.exit(int(ExitCode.INFRA))


def examples(*lines: str) -> str:
    """A command's --help epilog: one example per paragraph (rich help keeps paragraphs, joins lines)."""
    return "\n\n".join(["Examples:", *lines])


def new_app(**kwargs: Any) -> typer.Typer:
    return typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False, **kwargs)

"""One error hierarchy for qualify; the CLI maps it to exit codes in one place (qualify.cli.common.QualifyGroup).

Raise the most specific class where the problem is known; the message names the file, field or
reference and says what to do. Anything a user can cause derives from QualifyError and is shown
as its message, never as a traceback.
"""

from __future__ import annotations

from enum import IntEnum
from typing import ClassVar


class ExitCode(IntEnum):
    """Process exit codes shared by every command (CI jobs branch on them)."""

    OK = 0  # success, or verdict PASS
    FAIL = 1  # verdict FAIL/INCOMPLETE, a digest without a PASS decision, a refused action
    BAD_INPUT = 2  # a manifest, argument or reference is wrong
    INFRA = 3  # database, registry, Ray, Prefect or executor could not do its part


class QualifyError(Exception):
    """Base of every error qualify reports to a user. `lines` are printed one per line."""

    exit_code: ClassVar[ExitCode] = ExitCode.INFRA
    label: ClassVar[str] = "error"

    @property
    def lines(self) -> list[str]:
        text = str(self) or type(self).__name__
        return [f"{self.label}: {line}" if i == 0 else line for i, line in enumerate(text.splitlines())]


class BadInput(QualifyError):
    """A manifest, argument or reference is wrong (exit 2)."""

    exit_code = ExitCode.BAD_INPUT


class Rejected(QualifyError):
    """The thing asked for was judged and refused: a FAIL, a failed candidate, a refused promotion (exit 1)."""

    exit_code = ExitCode.FAIL
    label = "refused"


class InfraError(QualifyError):
    """Database, registry, Ray, Prefect or an executor could not do its part (exit 3)."""

    exit_code = ExitCode.INFRA


__all__ = ["ExitCode", "QualifyError", "BadInput", "Rejected", "InfraError"]

"""What every builder returns or raises (kept apart from the dispatcher so builders can import it)."""

from __future__ import annotations

from dataclasses import dataclass

from qualify.errors import BadInput, ExitCode, InfraError, Rejected


@dataclass(frozen=True)
class BuildResult:
    repository: str  # where the candidate lives (for local: the release repository, nothing pushed)
    tag: str | None
    digest: str  # sha256:...
    builder: str
    image_ref: str | None  # repository@digest for a real image; None for local
    python: str | None = None  # local builder: the interpreter that stands for the image
    log_path: str | None = None
    log_tail: str | None = None
    # Container builds: the network RUN steps had ("isolated" or "host"), and what the manifest
    # widened for this build (build.network: host, build.host_paths), one line each, for the report.
    network: str | None = None
    opt_ins: tuple[str, ...] = ()


class BuildError(Rejected):
    """The candidate could not be built: the candidate fails (exit 1). Carries the log tail."""

    def __init__(self, message: str, log_tail: str = "", log_path: str | None = None) -> None:
        super().__init__(message)
        self.log_tail = log_tail
        self.log_path = log_path


class BuildInputError(BuildError, BadInput):
    """The manifest's build section points at something that is not there (exit 2)."""

    exit_code = ExitCode.BAD_INPUT


class BuildInfraError(BuildError, InfraError):
    """Infrastructure the build needs did not do its part (a registry that does not answer): not the
    candidate's fault (exit 3)."""

    exit_code = ExitCode.INFRA
    label = "infrastructure error"


class BuilderUnavailable(BuildInfraError):
    """The build tool is missing or cannot run on this machine (exit 3)."""

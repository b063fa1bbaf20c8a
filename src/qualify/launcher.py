"""How the CLI starts a run without knowing the orchestrator: a launcher found by entry point.

The library knows nothing of Prefect (docs/ARCHITECTURE.md). `qualify run` builds a RunRequest and
hands it to the launcher registered under the entry-point group `qualify.launchers` (the package
`driver/`, beside `flows/` and `tasks/`, registers the Prefect one), with a progress callback.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Callable, Protocol

from qualify.errors import InfraError
from qualify.outcomes import RunOutcome
from qualify.progress import Progress
from qualify.settings import Settings

ENTRY_POINT_GROUP = "qualify.launchers"
DEFAULT_LAUNCHER = "prefect"

ProgressCallback = Callable[[Progress], None]


@dataclass(frozen=True)
class RunRequest:
    manifest: Path
    n_cases: int  # sizes the driver's pool: every case's task waits on its Ray task
    ray_address: str | None = None
    resume_run: int | None = None
    wait: bool = False
    promote: bool | None = None
    verbose: bool = False
    triggered_by: str | None = None
    # The run will start a local Ray (no cluster named by flag, environment or manifest; not a resume, which
    # may name its own): the launcher may start it while Prefect starts (qualify.execution.early_ray).
    local_ray: bool = False


class Launcher(Protocol):
    def __call__(self, request: RunRequest, settings: Settings, on_progress: ProgressCallback) -> RunOutcome:
        """Run the qualification flow in this process; raise QualifyError subclasses for expected failures."""
        ...


def find_launcher(name: str = DEFAULT_LAUNCHER) -> Launcher:
    found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    if not found:
        raise InfraError(f"no run launcher {name!r} is installed (entry-point group {ENTRY_POINT_GROUP!r}); "
                         "reinstall qualify with its driver package (scripts/bootstrap.sh)")
    launcher: Launcher = found[0].load()
    return launcher

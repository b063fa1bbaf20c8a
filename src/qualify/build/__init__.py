"""Obtain the candidate: build (or resolve) it and return its identity by digest.

Builders: local (a Python environment stands for the image), prebuilt, buildah,
podman, docker. Each returns a BuildResult or raises BuildError with the log tail.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from qualify.manifest import Release


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


class BuildError(Exception):
    def __init__(self, message: str, log_tail: str = "", log_path: str | None = None) -> None:
        super().__init__(message)
        self.log_tail = log_tail
        self.log_path = log_path


Builder = Callable[[Release, Path, Path], BuildResult]


def build_candidate(release: Release, *, data_dir: Path, manifest_dir: Path) -> BuildResult:
    """Dispatch on build.builder. manifest_dir resolves relative containerfile/context paths."""
    from qualify.build import local

    builders: dict[str, Builder] = {"local": local.build}
    try:  # container builders live in their own module (podman/buildah/docker/prebuilt)
        from qualify.build import containers

        builders.update(containers.BUILDERS)
    except ImportError:
        pass
    name = release.build.builder
    if name not in builders:
        raise BuildError(f"builder {name!r} is not available in this installation")
    return builders[name](release, data_dir, manifest_dir)

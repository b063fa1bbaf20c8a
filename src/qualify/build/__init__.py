"""Obtain the candidate: build (or resolve) it and return its identity by digest.

Builders: local (a Python environment stands for the image), prebuilt, buildah,
podman, docker. Each returns a BuildResult or raises BuildError with the log tail.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from qualify.build import containers, local
from qualify.build.base import (
    BuildError,
    BuilderUnavailable,
    BuildInputError,
    BuildResult,
)
from qualify.manifest import ReleaseManifest

Builder = Callable[[ReleaseManifest, Path, Path], BuildResult]

# The one place a builder is registered (its name is what build.builder says in a manifest).
BUILDERS: dict[str, Builder] = {"local": local.build, **containers.BUILDERS}


def build_candidate(manifest: ReleaseManifest, *, data_dir: Path, manifest_dir: Path) -> BuildResult:
    """Dispatch on build.builder. manifest_dir resolves relative containerfile/context paths."""
    name = manifest.build.builder
    if name not in BUILDERS:
        raise BuilderUnavailable(f"builder {name!r} is not available in this installation")
    return BUILDERS[name](manifest, data_dir, manifest_dir)


__all__ = ["BUILDERS", "BuildError", "BuildInputError", "BuildResult", "BuilderUnavailable", "build_candidate"]

"""Paired cases (gate.regression.baseline: paired): the previous release re-measured beside the candidate.

The driver finds the previous release's image (or, with the local executor, an interpreter whose package
set has its digest): `find_paired_baseline`. The case's one Ray task then runs the candidate's and the
baseline's launches interleaved on one node (`execution.launches.run_paired`), and the candidate's merged
document carries the baseline side, which the gate judges pair by pair.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from qualify.build import BuildError, BuildResult
from qualify.executors import Executor, LocalExecutor
from qualify.manifest import ReleaseManifest
from qualify.manifest.cases import Case
from qualify.store import repo

# --------------------------------------------------------------------------- the baseline side, found on the driver


@dataclass(frozen=True)
class PairedBaseline:
    """The previous release's image (or environment) that paired cases re-measure beside the candidate;
    executor None when it cannot be had, with the reason (the gate then says INCOMPLETE for those cases)."""

    executor: Executor | None
    label: str | None
    reason: str | None = None


def find_paired_baseline(sessions: sessionmaker[Session], manifest: ReleaseManifest,
                         build: BuildResult | None, image: str | None = None) -> PairedBaseline:
    """Find the previous release's image: the digest of its baseline run (the newest run whose latest
    decision is PASS); for one of the release's further images (`image`), that run's image of the same name.
    Container executor: that image by digest. Local executor: an interpreter on this
    machine whose environment has exactly that digest (the local builder's digest is its package set),
    else pairing is refused with the reason."""
    info = manifest.release
    if not info.previous_tag:
        return PairedBaseline(None, None, "no previous release named (release.previous_tag)")
    with sessions() as session:
        base_run = repo.baseline_run(session, info.repository, info.previous_tag)
        if base_run is None or base_run.image is None:
            return PairedBaseline(None, f"{info.repository}:{info.previous_tag}",
                                  f"the previous release {info.previous_tag} has no run whose latest decision is "
                                  "PASS: no image to re-measure")
        base_image = base_run.image
        if image is not None:
            row = next((r for r in repo.run_images(session, base_run.id) if r.name == image), None)
            if row is None:
                return PairedBaseline(None, f"{info.repository}:{info.previous_tag} image {image}",
                                      f"the previous release's run {base_run.id} has no image {image!r}: nothing "
                                      "to re-measure its cases beside")
            base_image = row.image
        digest, repository = base_image.digest, base_image.repository
        label = f"{repository}:{info.previous_tag}@{digest}"
        stored_python = _stored_build_python(base_run, image)
    if manifest.execution.executor == "container":
        from qualify.executors.container import ContainerExecutor

        return PairedBaseline(ContainerExecutor.from_manifest(manifest, f"{repository}@{digest}"), label)
    from qualify.build.local import environment_digest

    tried: list[str] = []
    for python in dict.fromkeys(p for p in (stored_python, build.python if build else None) if p):
        tried.append(python)
        try:
            if environment_digest(python)[0] == digest:
                return PairedBaseline(LocalExecutor(python=python), f"{label} (local interpreter {python})")
        except BuildError:
            continue
    return PairedBaseline(None, label, f"the previous release's environment ({digest[:19]}…) is not on this "
                                       f"machine: no interpreter with that package set (tried {', '.join(tried)})")


def find_reference(manifest: ReleaseManifest, manifest_dir: Path | None = None) -> PairedBaseline | None:
    """gate.reference's side, like the previous release's: the container executor runs the image by digest; the
    local executor runs `reference.python` when its package set has exactly the reference's digest, else the
    reference cases are refused with the reason (INCOMPLETE, never compared with another environment)."""
    ref = manifest.gate.reference
    if ref is None:
        return None
    label = f"{ref.label} ({ref.image})" if ref.label else ref.image
    if manifest.execution.executor == "container":
        from qualify.executors.container import ContainerExecutor

        return PairedBaseline(ContainerExecutor.from_manifest(manifest, ref.image), label)
    from qualify.build.local import environment_digest

    digest = ref.image.rsplit("@", 1)[1]
    python = ref.python or ""
    if manifest_dir is not None and python and not Path(python).is_absolute() and "/" in python:
        python = str((manifest_dir / python).resolve())
    try:
        found = environment_digest(python)[0]
    except BuildError as exc:
        return PairedBaseline(None, label, f"gate.reference.python {python!r}: {exc}")
    if found != digest:
        return PairedBaseline(None, label, f"gate.reference.python {python!r} has the package set {found[:19]}…, "
                                           f"not the reference's {digest[:19]}…: not the reference image")
    return PairedBaseline(LocalExecutor(python=python), f"{label} (local interpreter {python})")


def _stored_build_python(run: Any, image: str | None = None) -> str | None:
    """The interpreter a local-builder run used for an image, from its stored manifest (build.python, else the
    driver's)."""
    try:
        loaded = repo.run_manifest(run)
        python = loaded.release.for_image(image).build.python
    except Exception:  # noqa: BLE001 - an old manifest that no longer validates (or lacks the image): none known
        return None
    if python and not Path(python).is_absolute() and run.manifest_path:
        python = str((Path(run.manifest_path).resolve().parent / python).resolve())
    return python or sys.executable


def baseline_document(case: Case) -> dict[str, Any]:
    """The case as the baseline side runs it: the same document, without the tests' slowdown switch
    (params.slowdown stands for a slower candidate, never for a slower baseline)."""
    doc = case.document()
    doc["params"] = {k: v for k, v in doc["params"].items() if k != "slowdown"}
    return doc


def is_paired_case(paired: PairedBaseline | None, manifest: ReleaseManifest, case: Case) -> bool:
    """Whether this case is judged against a paired baseline (its kind has regression metrics)."""
    return paired is not None and bool(manifest.gate.regression.metrics_for(case.kind))

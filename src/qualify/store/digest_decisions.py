"""Every gate decision about one digest, with what `gate check` reads of its run: a Core read into plain rows.

This is the question CI asks after each build (the service's cold path, `qualify gate check`): one digest nobody
asked about before. Through the ORM (a statement built per call, identity map, joined eager loads, a session per
call) it cost about 2.5 ms of Python a check on the 10,000-run benchmark history; built once and read through
Core into frozen rows, about 0.5 ms (issue 27). The rows carry the attribute names of the ORM objects they
stand for (GateDecision, Run, Release, Image, RunImage), so the standing rules (qualify.gate.standing) and the
repository rules (qualify.gate.push_check) read either.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, bindparam, select, union
from sqlalchemy.orm import Session

from qualify.store.models import GateDecision, Image, Release, Run, RunImage

_decision, _run, _release, _image, _run_image = (GateDecision.__table__, Run.__table__, Release.__table__,
                                                 Image.__table__, RunImage.__table__)


@dataclass(frozen=True)
class ReleaseRow:
    id: int
    name: str
    repository: str
    tag: str


@dataclass(frozen=True)
class ImageRow:
    repository: str


@dataclass(frozen=True)
class FurtherImageRow:
    name: str
    digest: str
    image: ImageRow


@dataclass(frozen=True)
class RunRow:
    id: int
    release_id: int
    candidate_digest: str | None
    manifest_text: str
    release: ReleaseRow
    image: ImageRow | None
    # Read only when the digest asked about is one of them (the run judged it as a further image); else empty.
    further_images: tuple[FurtherImageRow, ...]


@dataclass(frozen=True)
class DecisionRow:
    id: int
    run_id: int
    digest: str | None
    verdict: str
    reasons: list[Any]
    policy_sha256: str
    baseline_run_id: int | None
    decided_at: dt.datetime


# Built once: a digest is judged as a run's candidate (the decision's own digest) or as one of a run's further
# images (run_images), and then that run's decisions are about it too. One statement, each arm on its own index.
_DIGEST = bindparam("digest")
_ABOUT = union(select(_decision.c.id).where(_decision.c.digest == _DIGEST),
               select(_decision.c.id).where(_decision.c.run_id.in_(
                   select(_run_image.c.run_id).where(_run_image.c.digest == _DIGEST))))
_DECISIONS = (
    select(_decision.c.id, _decision.c.run_id, _decision.c.digest, _decision.c.verdict, _decision.c.reasons,
           _decision.c.policy_sha256, _decision.c.baseline_run_id, _decision.c.decided_at,
           _run.c.release_id, _run.c.candidate_digest, _run.c.manifest_text,
           _release.c.name.label("release_name"), _release.c.repository.label("release_repository"),
           _release.c.tag.label("release_tag"), _image.c.repository.label("image_repository"))
    .join(_run, _run.c.id == _decision.c.run_id)
    .join(_release, _release.c.id == _run.c.release_id)
    .outerjoin(_image, _image.c.id == _run.c.image_id)
    .where(_decision.c.id.in_(_ABOUT))
    .order_by(_decision.c.id))
_FURTHER = (select(_run_image.c.run_id, _run_image.c.name, _run_image.c.digest, _image.c.repository)
            .join(_image, _image.c.id == _run_image.c.image_id)
            .where(_run_image.c.run_id.in_(bindparam("runs", expanding=True)))
            .order_by(_run_image.c.id))


def decisions_for_digest(db: Session | Connection, digest: str) -> list[tuple[DecisionRow, RunRow]]:
    """Every decision about `digest` with its run, oldest first by id. A run's further images are read (a second
    statement) only for the runs that judged `digest` as one of them, the only case their rows are asked for."""
    conn = db.connection() if isinstance(db, Session) else db
    rows = conn.execute(_DECISIONS, {"digest": digest}).all()
    further_runs = sorted({r.run_id for r in rows if r.candidate_digest != digest})
    further: dict[int, list[FurtherImageRow]] = {}
    if further_runs:
        for f in conn.execute(_FURTHER, {"runs": further_runs}):
            further.setdefault(f.run_id, []).append(FurtherImageRow(f.name, f.digest, ImageRow(f.repository)))
    runs: dict[int, RunRow] = {}
    out = []
    for r in rows:
        run = runs.get(r.run_id)
        if run is None:
            image = ImageRow(r.image_repository) if r.image_repository is not None else None
            run = runs[r.run_id] = RunRow(
                r.run_id, r.release_id, r.candidate_digest, r.manifest_text,
                ReleaseRow(r.release_id, r.release_name, r.release_repository, r.release_tag), image,
                tuple(further.get(r.run_id, ())))
        out.append((DecisionRow(r.id, r.run_id, r.digest, r.verdict, r.reasons or [], r.policy_sha256,
                                r.baseline_run_id, r.decided_at), run))
    return out

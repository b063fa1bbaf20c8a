"""Every gate decision about one digest, with what `gate check` reads of its run: a Core read into plain rows.

This is the question CI asks after each build (the service's cold path, `qualify gate check`): one digest nobody
asked about before. Through the ORM (a statement built per call, identity map, joined eager loads, a session per
call) it cost about 2.5 ms of Python a check on the 10,000-run benchmark history; built once and read through
Core into frozen rows, about 0.5 ms (issue 27). The rows (qualify.store.decision_rows) carry the attribute names
of the ORM objects they stand for (GateDecision, Run, Release, Image, RunImage), so the standing rules
(qualify.gate.standing) and the repository rules (qualify.gate.push_check) read either. The same two statements,
compiled for SQLite and PostgreSQL, are what the lean `gate check` runs without SQLAlchemy
(qualify.store.digest_decisions_sql; a test pins their text to these).
"""

from __future__ import annotations

from sqlalchemy import Connection, bindparam, select, union
from sqlalchemy.orm import Session

from qualify.store.decision_rows import (DecisionRow, FurtherImageRow, ImageRow, ReleaseRow, RunRow,  # noqa: F401
                                         decision_rows, further_runs_of)
from qualify.store.models import GateDecision, Image, Release, Run, RunImage

_decision, _run, _release, _image, _run_image = (GateDecision.__table__, Run.__table__, Release.__table__,
                                                 Image.__table__, RunImage.__table__)


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
    further_runs = further_runs_of([tuple(r) for r in rows], digest)
    further: dict[int, list[FurtherImageRow]] = {}
    if further_runs:
        for f in conn.execute(_FURTHER, {"runs": further_runs}):
            further.setdefault(f.run_id, []).append(FurtherImageRow(f.name, f.digest, ImageRow(f.repository)))
    return decision_rows([tuple(r) for r in rows], further)

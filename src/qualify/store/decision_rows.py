"""A digest's gate decisions as plain rows: what `gate check`, the service and the webhook read of them and of their
runs. Built from the columns of one statement (qualify.store.digest_decisions through SQLAlchemy; the lean
`gate check`, qualify.store.digest_decisions_sql, through the DB-API driver alone), in one place, so both readers
give the same rows. Standard library only.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Mapping, Sequence


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


# The columns of a decision row, in the statement's order (qualify.store.digest_decisions._DECISIONS).
COLUMNS = ("id", "run_id", "digest", "verdict", "reasons", "policy_sha256", "baseline_run_id", "decided_at",
           "release_id", "candidate_digest", "manifest_text", "release_name", "release_repository", "release_tag",
           "image_repository")
_RUN_ID, _CANDIDATE = COLUMNS.index("run_id"), COLUMNS.index("candidate_digest")


def further_runs_of(rows: Sequence[Sequence[Any]], digest: str) -> list[int]:
    """The runs whose decisions are about `digest` as one of their further images (not their candidate)."""
    return sorted({r[_RUN_ID] for r in rows if r[_CANDIDATE] != digest})


def decision_rows(rows: Sequence[Sequence[Any]], further: Mapping[int, Sequence[FurtherImageRow]]
                  ) -> list[tuple[DecisionRow, RunRow]]:
    """(decision, run) pairs from the statement's rows (in COLUMNS order, oldest decision first) and the further
    images of the runs that judged the digest as one of them."""
    runs: dict[int, RunRow] = {}
    out = []
    for values in rows:
        r = dict(zip(COLUMNS, values))
        run = runs.get(r["run_id"])
        if run is None:
            image = ImageRow(r["image_repository"]) if r["image_repository"] is not None else None
            run = runs[r["run_id"]] = RunRow(
                r["run_id"], r["release_id"], r["candidate_digest"], r["manifest_text"],
                ReleaseRow(r["release_id"], r["release_name"], r["release_repository"], r["release_tag"]), image,
                tuple(further.get(r["run_id"], ())))
        out.append((DecisionRow(r["id"], r["run_id"], r["digest"], r["verdict"], r["reasons"] or [],
                                r["policy_sha256"], r["baseline_run_id"], r["decided_at"]), run))
    return out

"""Tables of the results database (migrations in db/versions, kept in sync by `alembic check`)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from qualify.outcomes import CaseStatus, RunStatus, Verdict


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


# Plain string tuples: they are rendered into the CHECK constraints of the migrations.
RUN_STATUSES = tuple(s.value for s in RunStatus)
CASE_STATUSES = tuple(s.value for s in CaseStatus)
VERDICTS = tuple(v.value for v in Verdict)
PROMOTION_OUTCOMES = ("promoted", "skipped", "failed", "refused", "dry-run")
# What the gating service did with a registry push to a protected tag (qualify.service.webhook).
REGISTRY_EVENT_OUTCOMES = ("allowed", "recorded", "enforcing", "reverted", "deleted", "skipped", "failed")


class Release(Base):
    __tablename__ = "releases"
    __table_args__ = (UniqueConstraint("repository", "tag", name="uq_releases_repository_tag"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    repository: Mapped[str] = mapped_column(String(512))
    tag: Mapped[str] = mapped_column(String(128))
    previous_tag: Mapped[str | None] = mapped_column(String(128))
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Image(Base):
    __tablename__ = "images"
    __table_args__ = (
        UniqueConstraint("repository", "tag", "digest", name="uq_images_repository_tag_digest"),
        Index("ix_images_digest", "digest"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    repository: Mapped[str] = mapped_column(String(512))
    tag: Mapped[str | None] = mapped_column(String(128))
    digest: Mapped[str] = mapped_column(String(160))
    builder: Mapped[str | None] = mapped_column(String(32))
    build_log_path: Mapped[str | None] = mapped_column(Text)
    build_log_tail: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Run(Base):
    __tablename__ = "runs"
    __table_args__ = (
        CheckConstraint(f"status IN {RUN_STATUSES}", name="ck_runs_status"),
        Index("ix_runs_release_started", "release_id", "started_at"),
        Index("ix_runs_image", "image_id"),
        Index("ix_runs_active_digest", "candidate_digest", "status"),
        # One running qualification per candidate digest: a second run refuses (no interleaving).
        Index("uq_runs_one_running_per_digest", "candidate_digest", unique=True,
              sqlite_where=text("status = 'running'"), postgresql_where=text("status = 'running'")),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    release_id: Mapped[int] = mapped_column(ForeignKey("releases.id"))
    image_id: Mapped[int | None] = mapped_column(ForeignKey("images.id"))
    candidate_digest: Mapped[str | None] = mapped_column(String(160))
    status: Mapped[str] = mapped_column(String(16), default="running")
    stage: Mapped[str | None] = mapped_column(String(32))
    started_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    finished_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    heartbeat_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    # Which driver process owns a running run: resume refuses while it is alive.
    driver_host: Mapped[str | None] = mapped_column(String(255))
    driver_pid: Mapped[int | None] = mapped_column(Integer)
    triggered_by: Mapped[str | None] = mapped_column(String(128))
    manifest_path: Mapped[str | None] = mapped_column(Text)
    manifest_sha256: Mapped[str] = mapped_column(String(64))
    manifest_text: Mapped[str] = mapped_column(Text)
    flow_run_id: Mapped[str | None] = mapped_column(String(64))
    stage_seconds: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # The Ray cluster the cases ran on: {"nodes": [{"CPU": 2.0, "GPU": 0.0}, ...]} (None before 0006, or no Ray).
    cluster: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    error: Mapped[str | None] = mapped_column(Text)

    release: Mapped[Release] = relationship()
    image: Mapped[Image | None] = relationship()
    # The release's further images as this run built them (manifest `images:`), in build order.
    further_images: Mapped[list["RunImage"]] = relationship(order_by="RunImage.id", viewonly=True)


class RunImage(Base):
    """A further image of the release (manifest `images:`) as a run built it; the run's own candidate is
    runs.image / runs.candidate_digest. The verdict covers it: its digest stands as the run's does."""

    __tablename__ = "run_images"
    __table_args__ = (
        UniqueConstraint("run_id", "name", name="uq_run_images_run_name"),
        Index("ix_run_images_digest", "digest"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(64))
    image_id: Mapped[int] = mapped_column(ForeignKey("images.id"))
    digest: Mapped[str] = mapped_column(String(160))

    image: Mapped[Image] = relationship()


class ComponentCheck(Base):
    __tablename__ = "component_checks"
    __table_args__ = (UniqueConstraint("run_id", "image", "name", name="uq_component_checks_run_image_name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    # The release image it was checked in: "" for the release's own, else its name in `images:`.
    image: Mapped[str] = mapped_column(String(64), default="", server_default="")
    name: Mapped[str] = mapped_column(String(64))
    rule: Mapped[str] = mapped_column(String(16))
    expected: Mapped[str] = mapped_column(String(256))
    actual: Mapped[str | None] = mapped_column(String(256))
    ok: Mapped[bool] = mapped_column(Boolean)
    optional: Mapped[bool] = mapped_column(Boolean, default=False)
    detail: Mapped[str] = mapped_column(Text, default="")


class CaseResult(Base):
    __tablename__ = "case_results"
    __table_args__ = (
        UniqueConstraint("run_id", "case_id", name="uq_case_results_run_case"),
        CheckConstraint(f"status IN {CASE_STATUSES}", name="ck_case_results_status"),
        Index("ix_case_results_case_run", "case_id", "run_id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    case_id: Mapped[str] = mapped_column(String(256))
    kind: Mapped[str] = mapped_column(String(16))
    model: Mapped[str | None] = mapped_column(String(128))
    variant: Mapped[str | None] = mapped_column(String(128))
    status: Mapped[str] = mapped_column(String(16))
    error_class: Mapped[str | None] = mapped_column(String(32))
    error: Mapped[str | None] = mapped_column(Text)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    samples: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    probes: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    environment: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # what the result may be compared with (qualify.manifest.fingerprint); NULL for results recorded before 0002
    fingerprint: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    log_tail: Mapped[str | None] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer, default=1)
    queue_wait_s: Mapped[float | None] = mapped_column(Float)
    exec_s: Mapped[float | None] = mapped_column(Float)
    node: Mapped[str | None] = mapped_column(String(128))
    recorded_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class GateDecision(Base):
    """Append-only: evaluating again adds a decision, never rewrites one."""

    __tablename__ = "gate_decisions"
    __table_args__ = (
        CheckConstraint(f"verdict IN {VERDICTS}", name="ck_gate_decisions_verdict"),
        Index("ix_gate_decisions_digest_verdict", "digest", "verdict", "decided_at"),
        Index("ix_gate_decisions_run", "run_id", "decided_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"))
    digest: Mapped[str | None] = mapped_column(String(160))
    verdict: Mapped[str] = mapped_column(String(16))
    reasons: Mapped[list[Any]] = mapped_column(JSON, default=list)
    policy_sha256: Mapped[str] = mapped_column(String(64))
    baseline_run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id"))
    decided_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Promotion(Base):
    __tablename__ = "promotions"
    __table_args__ = (
        CheckConstraint(f"outcome IN {PROMOTION_OUTCOMES}", name="ck_promotions_outcome"),
        Index("ix_promotions_run", "run_id"),
        Index("ix_promotions_target", "target_ref"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    decision_id: Mapped[int] = mapped_column(ForeignKey("gate_decisions.id"))
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"))
    target_name: Mapped[str] = mapped_column(String(128))
    source_ref: Mapped[str] = mapped_column(String(700))
    source_digest: Mapped[str] = mapped_column(String(160))
    target_ref: Mapped[str] = mapped_column(String(700))
    outcome: Mapped[str] = mapped_column(String(16))
    forced: Mapped[bool] = mapped_column(Boolean, default=False)
    reason: Mapped[str | None] = mapped_column(Text)
    detail: Mapped[str | None] = mapped_column(Text)
    promoted_by: Mapped[str | None] = mapped_column(String(128))
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class RegistryEvent(Base):
    """A push to a protected repository/tag, as the registry's notification reported it, and what the gating
    service did about it. Written before any change to the registry (outcome `enforcing`) and updated with
    the result, so a crash between the two is visible and a redelivered event (same event_id) finishes it."""

    __tablename__ = "registry_events"
    __table_args__ = (
        UniqueConstraint("event_id", name="uq_registry_events_event_id"),
        CheckConstraint(f"outcome IN {REGISTRY_EVENT_OUTCOMES}", name="ck_registry_events_outcome"),
        Index("ix_registry_events_repository_tag", "repository", "tag", "outcome"),
        Index("ix_registry_events_digest", "digest"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    event_id: Mapped[str] = mapped_column(String(128))  # the registry's id: a redelivery is recognised
    received_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    action: Mapped[str] = mapped_column(String(16))
    repository: Mapped[str] = mapped_column(String(512))  # registry host/path, as image references name it
    tag: Mapped[str] = mapped_column(String(128))
    digest: Mapped[str] = mapped_column(String(160))
    media_type: Mapped[str | None] = mapped_column(String(128))
    pushed_by: Mapped[str | None] = mapped_column(String(128))  # the registry's actor, when it has one
    verdict: Mapped[str | None] = mapped_column(String(16))  # the digest's latest decision; NULL: never judged
    decision_id: Mapped[int | None] = mapped_column(ForeignKey("gate_decisions.id"))
    outcome: Mapped[str] = mapped_column(String(16))
    previous_digest: Mapped[str | None] = mapped_column(String(160))  # what the tag was re-pointed to
    detail: Mapped[str] = mapped_column(Text, default="")
    decided_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))  # when the outcome was final


class DatabaseIdentity(Base):
    """One row: the UUID made when this database's schema was created (qualify.store.identity)."""

    __tablename__ = "database_identity"
    __table_args__ = (CheckConstraint("id = 1", name="ck_database_identity_one_row"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    uuid: Mapped[str] = mapped_column(String(32))
class Calibration(Base):
    """What `qualify calibrate` measured for one case fingerprint and metric (qualify.gate.calibration): the
    run-to-run variation the gate's history mode adds to a comparison, and the check's realized error rates.
    Append-only: the gate reads the newest row of a (fingerprint_key, metric)."""

    __tablename__ = "calibrations"
    __table_args__ = (Index("ix_calibrations_key_metric", "fingerprint_key", "metric"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    fingerprint_key: Mapped[str] = mapped_column(String(64))  # calibration.key(fingerprint)
    fingerprint: Mapped[dict[str, Any]] = mapped_column(JSON)
    case_id: Mapped[str] = mapped_column(String(512))
    metric: Mapped[str] = mapped_column(String(128))
    image: Mapped[str] = mapped_column(String(700))  # what was measured (the manifest's candidate, or the python)
    launches: Mapped[int] = mapped_column(Integer)  # per run
    runs: Mapped[int] = mapped_column(Integer)  # A/A runs
    sd_run: Mapped[float] = mapped_column(Float)  # run-level sd of the log figure
    df: Mapped[float] = mapped_column(Float)
    sd_launch: Mapped[float] = mapped_column(Float)  # pooled within-run sd of the log launch figures
    false_alarm_rate: Mapped[float] = mapped_column(Float)  # A/A pairs the rule FAILed
    aa_comparisons: Mapped[int] = mapped_column(Integer)
    slowdown: Mapped[float] = mapped_column(Float)  # the injected params.slowdown
    slowed_runs: Mapped[int] = mapped_column(Integer)
    detection_rate: Mapped[float | None] = mapped_column(Float)  # slowed-vs-A pairs the rule FAILed
    detectable: Mapped[float] = mapped_column(Float)  # the drop detected with 90% power at `launches`
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

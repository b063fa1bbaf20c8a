"""Registry events: pushes to protected tags seen by the gating service (`qualify serve`) and what it did.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

OUTCOMES = ("allowed", "recorded", "enforcing", "reverted", "deleted", "skipped", "failed")


def upgrade() -> None:
    op.create_table(
        "registry_events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("event_id", sa.String(length=128), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("action", sa.String(length=16), nullable=False),
        sa.Column("repository", sa.String(length=512), nullable=False),
        sa.Column("tag", sa.String(length=128), nullable=False),
        sa.Column("digest", sa.String(length=160), nullable=False),
        sa.Column("media_type", sa.String(length=128), nullable=True),
        sa.Column("pushed_by", sa.String(length=128), nullable=True),
        sa.Column("verdict", sa.String(length=16), nullable=True),
        sa.Column("decision_id", sa.Integer(), nullable=True),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("previous_digest", sa.String(length=160), nullable=True),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(f"outcome IN {OUTCOMES}", name="ck_registry_events_outcome"),
        sa.ForeignKeyConstraint(["decision_id"], ["gate_decisions.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("event_id", name="uq_registry_events_event_id"),
    )
    with op.batch_alter_table("registry_events", schema=None) as batch_op:
        batch_op.create_index("ix_registry_events_repository_tag", ["repository", "tag", "outcome"], unique=False)
        batch_op.create_index("ix_registry_events_digest", ["digest"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("registry_events", schema=None) as batch_op:
        batch_op.drop_index("ix_registry_events_digest")
        batch_op.drop_index("ix_registry_events_repository_tag")
    op.drop_table("registry_events")

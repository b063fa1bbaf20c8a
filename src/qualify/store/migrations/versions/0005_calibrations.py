"""Calibrations: the run-to-run variation and realized error rates `qualify calibrate` measured per fingerprint.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "calibrations",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("fingerprint_key", sa.String(length=64), nullable=False),
        sa.Column("fingerprint", sa.JSON(), nullable=False),
        sa.Column("case_id", sa.String(length=512), nullable=False),
        sa.Column("metric", sa.String(length=128), nullable=False),
        sa.Column("image", sa.String(length=700), nullable=False),
        sa.Column("launches", sa.Integer(), nullable=False),
        sa.Column("runs", sa.Integer(), nullable=False),
        sa.Column("sd_run", sa.Float(), nullable=False),
        sa.Column("df", sa.Float(), nullable=False),
        sa.Column("sd_launch", sa.Float(), nullable=False),
        sa.Column("false_alarm_rate", sa.Float(), nullable=False),
        sa.Column("aa_comparisons", sa.Integer(), nullable=False),
        sa.Column("slowdown", sa.Float(), nullable=False),
        sa.Column("slowed_runs", sa.Integer(), nullable=False),
        sa.Column("detection_rate", sa.Float(), nullable=True),
        sa.Column("detectable", sa.Float(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("calibrations", schema=None) as batch_op:
        batch_op.create_index("ix_calibrations_key_metric", ["fingerprint_key", "metric"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("calibrations", schema=None) as batch_op:
        batch_op.drop_index("ix_calibrations_key_metric")
    op.drop_table("calibrations")

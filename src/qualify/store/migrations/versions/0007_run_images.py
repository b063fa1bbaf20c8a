"""Several images per release: the further images a run built (run_images), and the image each component
check was made in (component_checks.image, "" for the release's own).

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "run_images",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("image_id", sa.Integer(), nullable=False),
        sa.Column("digest", sa.String(length=160), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["image_id"], ["images.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("run_id", "name", name="uq_run_images_run_name"),
    )
    with op.batch_alter_table("run_images", schema=None) as batch_op:
        batch_op.create_index("ix_run_images_digest", ["digest"], unique=False)
    with op.batch_alter_table("component_checks", schema=None) as batch_op:
        batch_op.add_column(sa.Column("image", sa.String(length=64), server_default="", nullable=False))
        batch_op.drop_constraint("uq_component_checks_run_name", type_="unique")
        batch_op.create_unique_constraint("uq_component_checks_run_image_name", ["run_id", "image", "name"])


def downgrade() -> None:
    with op.batch_alter_table("component_checks", schema=None) as batch_op:
        batch_op.drop_constraint("uq_component_checks_run_image_name", type_="unique")
        batch_op.create_unique_constraint("uq_component_checks_run_name", ["run_id", "name"])
        batch_op.drop_column("image")
    with op.batch_alter_table("run_images", schema=None) as batch_op:
        batch_op.drop_index("ix_run_images_digest")
    op.drop_table("run_images")

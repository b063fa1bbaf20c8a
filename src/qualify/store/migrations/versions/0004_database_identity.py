"""The database's identity: one UUID made when the schema is created here, so that files under the data
directory are keyed by the database they belong to (whatever URL names it: aliases, a moved host, new
credentials).

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import uuid

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    table = op.create_table(
        "database_identity",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("uuid", sa.String(length=32), nullable=False),
        sa.CheckConstraint("id = 1", name="ck_database_identity_one_row"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.bulk_insert(table, [{"id": 1, "uuid": uuid.uuid4().hex}])


def downgrade() -> None:
    op.drop_table("database_identity")

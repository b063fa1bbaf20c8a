"""Case results carry the fingerprint that decides what they may be compared with.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("case_results") as batch:
        batch.add_column(sa.Column("fingerprint", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("case_results") as batch:
        batch.drop_column("fingerprint")

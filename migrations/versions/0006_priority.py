"""A priority on jobs and batches (lower runs first; 0 is the default).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-22
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for table in ("jobs", "batches"):
        op.add_column(
            table,
            sa.Column("priority", sa.SmallInteger(), nullable=False, server_default="0"),
        )


def downgrade() -> None:
    for table in ("jobs", "batches"):
        op.drop_column(table, "priority")

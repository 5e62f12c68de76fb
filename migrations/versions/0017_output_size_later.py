"""A batch's output and error files are recorded as the batch ends, their sizes measured
just after (or when first asked for): `files.bytes` may be unknown for a moment.

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-28
"""

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("files") as table:
        table.alter_column("bytes", existing_type=sa.BigInteger(), nullable=True)


def downgrade() -> None:
    op.execute("UPDATE files SET bytes = 0 WHERE bytes IS NULL")
    with op.batch_alter_table("files") as table:
        table.alter_column("bytes", existing_type=sa.BigInteger(), nullable=False)

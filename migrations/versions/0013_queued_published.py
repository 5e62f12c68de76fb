"""Queued jobs indexed by queue and when each was last published: what maintenance reads
to find jobs stranded (delivered, never claimed) and jobs stalled (queued past
`INFERQ_STALL_S` while the model's workers have room), without the jobs that ran.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

QUEUED = sa.text("status = 'queued'")


def upgrade() -> None:
    op.create_index(
        "ix_jobs_queued_published",
        "jobs",
        ["queue", "published_at"],
        postgresql_where=QUEUED,
        sqlite_where=QUEUED,
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_queued_published", table_name="jobs")

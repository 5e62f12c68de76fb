"""Data lifecycle: batch counters kept as lines end, expiry of files and batch outputs, and
the indexes retention scans by.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

COUNTERS = ("request_total", "request_completed", "request_failed")
TOKENS = ("input_tokens", "output_tokens")
# Where each counter starts, for batches made before it existed.
BACKFILL = {
    "request_total": "count(*)",
    "request_completed": "count(*) FILTER (WHERE status = 'succeeded')",
    "request_failed": "count(*) FILTER (WHERE status IN ('failed', 'cancelled'))",
    "input_tokens": "coalesce(sum(prompt_tokens) FILTER (WHERE status = 'succeeded'), 0)",
    "output_tokens": "coalesce(sum(completion_tokens) FILTER (WHERE status = 'succeeded'), 0)",
}


def upgrade() -> None:
    for name in COUNTERS:
        op.add_column(
            "batches", sa.Column(name, sa.Integer(), nullable=False, server_default="0")
        )
    for name in TOKENS:
        op.add_column(
            "batches", sa.Column(name, sa.BigInteger(), nullable=False, server_default="0")
        )
    op.add_column("batches", sa.Column("output_expires_after_s", sa.Integer(), nullable=True))
    op.add_column(
        "batches", sa.Column("output_expires_at", sa.DateTime(timezone=True), nullable=True)
    )
    op.add_column("files", sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))
    for name, expression in BACKFILL.items():
        op.execute(
            f"UPDATE batches SET {name} = "  # noqa: S608 (constant text)
            f"(SELECT {expression} FROM jobs WHERE jobs.batch_id = batches.id)"
        )
    _partial_index("ix_jobs_single_finished", "jobs", "finished_at", "batch_id IS NULL AND ")
    _partial_index("ix_files_expires_at", "files", "expires_at")
    _partial_index("ix_batches_output_expires_at", "batches", "output_expires_at")
    _partial_index("ix_webhook_deliveries_finished", "webhook_deliveries", "finished_at")


def downgrade() -> None:
    op.drop_index("ix_webhook_deliveries_finished", table_name="webhook_deliveries")
    op.drop_index("ix_batches_output_expires_at", table_name="batches")
    op.drop_index("ix_files_expires_at", table_name="files")
    op.drop_index("ix_jobs_single_finished", table_name="jobs")
    op.drop_column("files", "expires_at")
    for name in ("output_expires_at", "output_expires_after_s", *TOKENS, *COUNTERS):
        op.drop_column("batches", name)


def _partial_index(name: str, table: str, column: str, also: str = "") -> None:
    where = sa.text(f"{also}{column} IS NOT NULL")
    op.create_index(name, table, [column], postgresql_where=where, sqlite_where=where)

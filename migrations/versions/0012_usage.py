"""Usage and quotas: tokens and requests added up by tenant, API key, model and hour in
the transactions that end jobs and create batches (so retention, which deletes jobs,
never changes them); the key that submitted each job and batch, and what a job may cost
at most (prompt plus `max_tokens` times `n`), indexed by key over active jobs, so a
key's queued tokens are summed at submission; per-key quotas.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

ACTIVE = sa.text("status IN ('queued', 'running')")


def upgrade() -> None:
    op.create_table(
        "usage",
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("key_id", sa.String(64), nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
        sa.Column("input_tokens", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("output_tokens", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("embedding_tokens", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("jobs", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("batch_lines", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("batches", sa.BigInteger(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("tenant", "key_id", "model", "hour", name="pk_usage"),
    )
    op.create_index("ix_usage_hour", "usage", ["hour"])
    op.create_index("ix_usage_key_id_hour", "usage", ["key_id", "hour"])
    op.add_column("jobs", sa.Column("key_id", sa.String(64), nullable=True))
    op.add_column("jobs", sa.Column("cost_tokens", sa.BigInteger(), nullable=True))
    op.create_index(
        "ix_jobs_key_active",
        "jobs",
        ["key_id", "cost_tokens"],
        postgresql_where=ACTIVE,
        sqlite_where=ACTIVE,
    )
    op.add_column("batches", sa.Column("key_id", sa.String(64), nullable=True))
    op.add_column("api_keys", sa.Column("max_queued_tokens", sa.BigInteger(), nullable=True))
    op.add_column("api_keys", sa.Column("daily_tokens", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    op.drop_column("api_keys", "daily_tokens")
    op.drop_column("api_keys", "max_queued_tokens")
    op.drop_column("batches", "key_id")
    op.drop_index("ix_jobs_key_active", table_name="jobs")
    op.drop_column("jobs", "cost_tokens")
    op.drop_column("jobs", "key_id")
    op.drop_index("ix_usage_key_id_hour", table_name="usage")
    op.drop_index("ix_usage_hour", table_name="usage")
    op.drop_table("usage")

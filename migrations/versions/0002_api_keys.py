"""API keys, and a tenant on every job.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

Timestamp = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("key_hash", sa.String(64), nullable=False),
        sa.Column("prefix", sa.String(16), nullable=False),
        sa.Column("admin", sa.Boolean(), nullable=False),
        sa.Column("rpm", sa.Integer(), nullable=True),
        sa.Column("tpm", sa.Integer(), nullable=True),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("revoked_at", Timestamp, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_api_keys"),
        sa.UniqueConstraint("key_hash", name="uq_api_keys_key_hash"),
    )
    # Jobs written before keys existed belong to the "default" tenant.
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(
            sa.Column("tenant", sa.String(128), nullable=False, server_default="default")
        )
    with op.batch_alter_table("jobs") as batch:
        batch.alter_column("tenant", server_default=None)
    op.create_index("ix_jobs_tenant_id", "jobs", ["tenant", "id"])


def downgrade() -> None:
    op.drop_index("ix_jobs_tenant_id", table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("tenant")
    op.drop_table("api_keys")

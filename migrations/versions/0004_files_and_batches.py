"""Files (stored in chunks), batches, and the batch line each job came from.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-21
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

Json = sa.JSON().with_variant(JSONB(), "postgresql")
Timestamp = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "files",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("purpose", sa.String(32), nullable=False),
        sa.Column("filename", sa.Text(), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("lines", sa.Integer(), nullable=False),
        sa.Column("batch_id", sa.String(64), nullable=True),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("deleted_at", Timestamp, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_files"),
    )
    op.create_index("ix_files_tenant_id", "files", ["tenant", "id"])
    op.create_table(
        "file_chunks",
        sa.Column("file_id", sa.String(64), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["file_id"], ["files.id"], name="fk_file_chunks_file_id_files", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("file_id", "seq", name="pk_file_chunks"),
    )
    op.create_table(
        "batches",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("endpoint", sa.String(64), nullable=False),
        sa.Column("input_file_id", sa.String(64), nullable=False),
        sa.Column("completion_window", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("model", sa.Text(), nullable=True),
        sa.Column("metadata", Json, nullable=False),
        sa.Column("errors", Json, nullable=True),
        sa.Column("output_file_id", sa.String(64), nullable=True),
        sa.Column("error_file_id", sa.String(64), nullable=True),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("expires_at", Timestamp, nullable=False),
        sa.Column("in_progress_at", Timestamp, nullable=True),
        sa.Column("finalizing_at", Timestamp, nullable=True),
        sa.Column("completed_at", Timestamp, nullable=True),
        sa.Column("failed_at", Timestamp, nullable=True),
        sa.Column("expired_at", Timestamp, nullable=True),
        sa.Column("cancelling_at", Timestamp, nullable=True),
        sa.Column("cancelled_at", Timestamp, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_batches"),
    )
    op.create_index("ix_batches_tenant_id", "batches", ["tenant", "id"])
    op.create_index("ix_batches_status", "batches", ["status"])
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("batch_id", sa.String(64), nullable=True))
        batch.add_column(sa.Column("line", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("custom_id", sa.Text(), nullable=True))
    op.create_index("ix_jobs_batch_id_line", "jobs", ["batch_id", "line"])
    # "Has this batch any line still to run?" must not scan its finished lines.
    op.create_index(
        "ix_jobs_batch_active",
        "jobs",
        ["batch_id"],
        postgresql_where=sa.text("status IN ('queued', 'running') AND batch_id IS NOT NULL"),
        sqlite_where=sa.text("status IN ('queued', 'running') AND batch_id IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_batch_active", table_name="jobs")
    op.drop_index("ix_jobs_batch_id_line", table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("custom_id")
        batch.drop_column("line")
        batch.drop_column("batch_id")
    op.drop_index("ix_batches_status", table_name="batches")
    op.drop_index("ix_batches_tenant_id", table_name="batches")
    op.drop_table("batches")
    op.drop_table("file_chunks")
    op.drop_index("ix_files_tenant_id", table_name="files")
    op.drop_table("files")

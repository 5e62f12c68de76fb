"""Batch estimates: what a batch's lines ask of the engine (summed when it is written), its
estimate, and the speeds the GPU workers measure of their engines. A batch's active lines
indexed by line too, so the first still to run after a cursor is found at once (a follower
of a 20,000-line batch read the batch's every queued line, 35 ms a read).

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-25
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

Json = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    op.add_column(
        "batches",
        sa.Column("line_prompt_tokens", sa.BigInteger(), server_default="0", nullable=False),
    )
    op.add_column(
        "batches", sa.Column("line_max_tokens", sa.BigInteger(), server_default="0", nullable=False)
    )
    op.add_column(
        "batches",
        sa.Column("line_longest_tokens", sa.Integer(), server_default="0", nullable=False),
    )
    op.add_column("batches", sa.Column("estimate", Json, nullable=True))
    op.create_table(
        "engine_speeds",
        sa.Column("worker", sa.Text(), nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("runner", sa.String(16), nullable=False),
        sa.Column("tokens_per_s", sa.Float(), nullable=False),
        sa.Column("step_s", sa.Float(), nullable=True),
        sa.Column("output_fraction", sa.Float(), nullable=True),
        sa.Column("interactive_tokens_per_s", sa.Float(), nullable=False),
        sa.Column("reported_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("worker", name="pk_engine_speeds"),
    )
    op.create_index("ix_engine_speeds_model", "engine_speeds", ["model"])
    _active_lines(["batch_id", "line"])


def _active_lines(columns: list[str]) -> None:
    op.drop_index("ix_jobs_batch_active", table_name="jobs")
    op.create_index(
        "ix_jobs_batch_active",
        "jobs",
        columns,
        postgresql_where=sa.text("status IN ('queued', 'running') AND batch_id IS NOT NULL"),
        sqlite_where=sa.text("status IN ('queued', 'running') AND batch_id IS NOT NULL"),
    )


def downgrade() -> None:
    _active_lines(["batch_id"])
    op.drop_index("ix_engine_speeds_model", table_name="engine_speeds")
    op.drop_table("engine_speeds")
    op.drop_column("batches", "estimate")
    op.drop_column("batches", "line_longest_tokens")
    op.drop_column("batches", "line_max_tokens")
    op.drop_column("batches", "line_prompt_tokens")

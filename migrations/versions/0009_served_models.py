"""Many models: the served models workers register, a GPU queue pair per model, and
embedding vectors as float32 bytes.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "served_models",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("base", sa.Text(), nullable=False),
        sa.Column("runner", sa.String(16), nullable=False),
        sa.Column("tokenizer", sa.Text(), nullable=False),
        sa.Column("max_model_len", sa.Integer(), nullable=True),
        sa.Column("chat_template", sa.Text(), nullable=True),
        sa.Column("tool_call_parser", sa.Text(), nullable=True),
        sa.Column("adapter", sa.Text(), nullable=True),
        sa.Column("embedding_size", sa.Integer(), nullable=True),
        sa.Column("supports_dimensions", sa.Boolean(), nullable=False),
        sa.Column("registered_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_served_models")),
    )
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("embedding", sa.LargeBinary(), nullable=True))
        batch.alter_column("queue", type_=sa.Text(), existing_type=sa.String(32))
    if op.get_bind().dialect.name != "postgresql":
        return  # `inferq run`'s SQLite state: it publishes nothing
    # Queued and running jobs move to their model's queues; the queued ones are published
    # there by the next maintenance pass (their old messages are never consumed).
    op.execute(
        "UPDATE jobs SET queue = queue || ':' || model, "
        "lease_expires_at = CASE WHEN status = 'queued' THEN timestamptz 'epoch' "
        "ELSE lease_expires_at END "
        "WHERE status IN ('queued', 'running')"
    )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "UPDATE jobs SET queue = split_part(queue, ':', 1) "
            "WHERE status IN ('queued', 'running')"
        )
    with op.batch_alter_table("jobs") as batch:
        batch.alter_column("queue", type_=sa.String(32), existing_type=sa.Text())
        batch.drop_column("embedding")
    op.drop_table("served_models")

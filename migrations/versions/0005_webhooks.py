"""Webhooks: endpoints with their signing secrets, the delivery outbox and its attempts.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-21
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

Json = sa.JSON().with_variant(JSONB(), "postgresql")
Timestamp = sa.DateTime(timezone=True)
DUE = sa.text("state IN ('pending', 'delivering')")


def upgrade() -> None:
    op.create_table(
        "webhook_endpoints",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("secret", sa.String(128), nullable=False),
        sa.Column("previous_secret", sa.String(128), nullable=True),
        sa.Column("previous_expires_at", Timestamp, nullable=True),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("disabled_at", Timestamp, nullable=True),
        sa.Column("disabled_reason", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_webhook_endpoints"),
        sa.UniqueConstraint("tenant", "url", name="uq_webhook_endpoints_tenant_url"),
    )
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("endpoint_id", sa.String(64), nullable=False),
        sa.Column("event", sa.String(32), nullable=False),
        sa.Column("job_id", sa.String(64), nullable=True),
        sa.Column("batch_id", sa.String(64), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", Timestamp, nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("finished_at", Timestamp, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_webhook_deliveries"),
        sa.ForeignKeyConstraint(
            ["endpoint_id"],
            ["webhook_endpoints.id"],
            name="fk_webhook_deliveries_endpoint_id_webhook_endpoints",
        ),
    )
    op.create_index(
        "ix_webhook_deliveries_due",
        "webhook_deliveries",
        ["next_attempt_at"],
        postgresql_where=DUE,
        sqlite_where=DUE,
    )
    op.create_index("ix_webhook_deliveries_tenant_id", "webhook_deliveries", ["tenant", "id"])
    op.create_index("ix_webhook_deliveries_job_id", "webhook_deliveries", ["job_id"])
    op.create_index("ix_webhook_deliveries_batch_id", "webhook_deliveries", ["batch_id"])
    op.create_table(
        "webhook_attempts",
        sa.Column("delivery_id", sa.String(64), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("started_at", Timestamp, nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("latency_ms", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("delivery_id", "number", name="pk_webhook_attempts"),
        sa.ForeignKeyConstraint(
            ["delivery_id"],
            ["webhook_deliveries.id"],
            name="fk_webhook_attempts_delivery_id_webhook_deliveries",
            ondelete="CASCADE",
        ),
    )
    for table in ("jobs", "batches"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("webhook_endpoint_id", sa.String(64), nullable=True))
            batch.add_column(sa.Column("webhook_events", Json, nullable=True))


def downgrade() -> None:
    for table in ("jobs", "batches"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("webhook_events")
            batch.drop_column("webhook_endpoint_id")
    op.drop_table("webhook_attempts")
    op.drop_index("ix_webhook_deliveries_batch_id", table_name="webhook_deliveries")
    op.drop_index("ix_webhook_deliveries_job_id", table_name="webhook_deliveries")
    op.drop_index("ix_webhook_deliveries_tenant_id", table_name="webhook_deliveries")
    op.drop_index("ix_webhook_deliveries_due", table_name="webhook_deliveries")
    op.drop_table("webhook_deliveries")
    op.drop_table("webhook_endpoints")

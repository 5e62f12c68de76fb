"""Batch work shared fairly between tenants: each API key's weight, and each tenant's
place in the share of each model's batch work (inferq/domain/fair_share.py). And whether
a worker's reported rate was measured with its engine at load (a rate at low load says
little of what a large batch gets, so no estimate is made from it).

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "api_keys", sa.Column("weight", sa.Integer(), nullable=False, server_default="1")
    )
    op.add_column(
        "engine_speeds",
        sa.Column("at_load", sa.Boolean(), nullable=False, server_default=sa.true()),
    )
    op.create_table(
        "share_clocks",
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("clock", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("queue", name=op.f("pk_share_clocks")),
    )
    op.create_table(
        "shares",
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("finish", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("queue", "tenant", name=op.f("pk_shares")),
    )


def downgrade() -> None:
    op.drop_table("shares")
    op.drop_table("share_clocks")
    op.drop_column("engine_speeds", "at_load")
    op.drop_column("api_keys", "weight")

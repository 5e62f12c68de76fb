"""A webhook endpoint chooses the shape of its events: inferq's (as before) or OpenAI's.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-28
"""

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("webhook_endpoints") as table:
        table.add_column(
            sa.Column("format", sa.String(16), nullable=False, server_default="inferq")
        )


def downgrade() -> None:
    with op.batch_alter_table("webhook_endpoints") as table:
        table.drop_column("format")

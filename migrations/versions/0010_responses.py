"""Requests to OpenAI's Responses API: what each response echoes (instructions, tools,
text format, ...), kept with its job.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-25
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

Json = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    op.add_column("jobs", sa.Column("response", Json, nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "response")

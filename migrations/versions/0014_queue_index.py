"""Autoscaling on Postgres: a model's jobs not yet ended (queued or running) indexed by
queue, so the count a Kubernetes autoscaler polls for each model reads only that model's
active jobs (deploy/k8s/scaledobject-*.yaml).

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

ACTIVE = sa.text("status IN ('queued', 'running')")


def upgrade() -> None:
    op.create_index(
        "ix_jobs_queue_active", "jobs", ["queue"], postgresql_where=ACTIVE, sqlite_where=ACTIVE
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_queue_active", table_name="jobs")

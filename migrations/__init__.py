"""Alembic migrations; `inferq migrate` runs them to head."""

"""Persistence: the ORM rows, the engine factory and the stores that hold all SQL."""

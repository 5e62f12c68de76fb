"""Fault injection: each test has a deployment of its own (database, Redis keys or server,
processes; see `deployment` in tests/conftest.py), so killing and flushing never touch
another test."""

from tests.conftest import DeploymentFactory

__all__ = ["DeploymentFactory"]

"""Running Alembic from code, so `inferq migrate` works wherever the package is installed."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.exc import OperationalError

import migrations
from inferq.exceptions import SchemaOutdated, StoreUnavailable
from inferq.store.database import make_database


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(Path(migrations.__file__).parent))
    # ConfigParser treats % as interpolation; URLs may carry percent-encoded passwords.
    config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return config


def upgrade(database_url: str, revision: str = "head") -> None:
    """Bring the schema up to `revision`."""
    command.upgrade(alembic_config(database_url), revision)


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    assert head is not None
    return head


def check_schema(database_url: str) -> None:
    """Refuse to run against a database whose schema is not this code's (`SchemaOutdated`)."""
    engine = make_database(database_url, pool_size=1)
    try:
        with engine.connect() as connection:
            current = MigrationContext.configure(connection).get_current_revision()
    except OperationalError as exc:
        raise StoreUnavailable(f"the database is unavailable: {exc.orig}") from exc
    finally:
        engine.dispose()
    head = head_revision()
    if current != head:
        raise SchemaOutdated(
            f"the database schema is at revision {current or 'none (empty database)'}, but "
            f"this inferq needs {head}: run `inferq migrate`"
        )

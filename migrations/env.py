"""Alembic environment: runs migrations on the URL that `inferq.store.migrate` hands over."""

from alembic import context
from sqlalchemy import create_engine

from inferq.store.models import Base

config = context.config
url = config.get_main_option("sqlalchemy.url")
assert url, "inferq.store.migrate sets sqlalchemy.url"


def run_migrations_offline() -> None:
    context.configure(url=url, target_metadata=Base.metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = create_engine(url)
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=Base.metadata,
            # SQLite alters tables by copying them; batch mode does that for us.
            render_as_batch=connection.dialect.name == "sqlite",
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()

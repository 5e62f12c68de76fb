"""What workers register about their models, and the migration that gave each model its
own queues, on a real Postgres."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

from alembic import command
from sqlalchemy import select

from inferq.domain.served_models import ServedModel
from inferq.store.database import make_database, make_sessions
from inferq.store.jobs import JobStore
from inferq.store.migrate import alembic_config, upgrade
from inferq.store.models import JobRow
from inferq.store.served_models import ModelStore
from tests.helpers.jobs import create_jobs, job_spec

LLAMA = ServedModel(
    name="llama", base="llama", runner="generate", tokenizer="/m/llama", max_model_len=4096
)


def adapter(name: str) -> ServedModel:
    return dataclasses.replace(LLAMA, name=name, adapter=f"/adapters/{name}")


def test_a_worker_registering_again_replaces_what_its_model_served(database_url: str) -> None:
    engine = make_database(database_url, pool_size=1)
    models = ModelStore(make_sessions(engine))
    bge = ServedModel(
        name="bge",
        base="bge",
        runner="pooling",
        tokenizer="/m/bge",
        max_model_len=512,
        embedding_size=768,
    )
    models.register([LLAMA, adapter("sql"), adapter("support")])
    models.register([bge])
    assert [m.name for m in models.all()] == ["bge", "llama", "sql", "support"]
    # Restarted with one adapter fewer and a longer context: the dropped adapter is gone.
    longer = dataclasses.replace(LLAMA, max_model_len=8192)
    models.register([longer, adapter("sql")])
    assert models.all() == [bge, longer, adapter("sql")]
    engine.dispose()


def test_a_starting_worker_announces_its_names_without_undoing_a_loaded_registration(
    database_url: str,
) -> None:
    engine = make_database(database_url, pool_size=1)
    models = ModelStore(make_sessions(engine))
    # What settings alone say: the context is the model's own until the engine has loaded.
    starting = dataclasses.replace(LLAMA, max_model_len=None)
    assert models.announce([starting, dataclasses.replace(adapter("sql"), max_model_len=None)])
    assert [m.name for m in models.all()] == ["llama", "sql"]
    assert models.all()[0] == starting
    models.register([LLAMA, adapter("sql")])
    # Restarted: the loaded worker's registration stands until the new one has loaded.
    assert models.announce([starting]) == []
    assert models.all() == [LLAMA, adapter("sql")]
    engine.dispose()


def test_upgrading_moves_waiting_jobs_to_their_models_queues(database_url: str) -> None:
    engine = make_database(database_url, pool_size=1)
    sessions = make_sessions(engine)
    jobs = JobStore(sessions)
    queued, running = create_jobs(
        jobs, [job_spec(), job_spec()], queue="interactive:tiny", requeue_after_s=3600
    )
    jobs.claim_jobs([running.id], worker="w", lease_s=600)
    command.downgrade(alembic_config(database_url), "0008")
    with sessions() as session:
        before = {row.id: row.queue for row in session.execute(select(JobRow.id, JobRow.queue))}
    assert before == {queued.id: "interactive", running.id: "interactive"}
    upgrade(database_url)
    with sessions() as session:
        after = {row.id: row for row in session.execute(select(JobRow)).scalars()}
    assert after[queued.id].queue == after[running.id].queue == "interactive:tiny"
    # The queued one is due at once: the next maintenance pass publishes it to its queue
    # (its message in the old, unconsumed queue is never taken).
    assert after[queued.id].lease_expires_at == datetime(1970, 1, 1, tzinfo=UTC)
    assert after[running.id].lease_expires_at > datetime.now(UTC)
    due = jobs.take_due(requeue_after_s=3600, limit=10)
    assert [(job.id, job.queue) for job in due] == [(queued.id, "interactive:tiny")]
    engine.dispose()

"""What KEDA reads to scale a model's workers (deploy/k8s/scaledobject-*.yaml): the length
of the Redis lists its triggers name, with real jobs published into a real Redis."""

from __future__ import annotations

from pathlib import Path

import yaml
from redis import Redis

from inferq.broker.celery_app import JobPublisher, make_celery
from inferq.domain.queue_names import bulk_queue, interactive_queue
from inferq.settings import Settings
from tests.conftest import REDIS_URL

K8S = Path(__file__).resolve().parents[3] / "deploy" / "k8s"


def test_the_lists_keda_reads_hold_the_model_s_waiting_messages(key_prefix: str) -> None:
    scaled = yaml.safe_load((K8S / "scaledobject-llama.yaml").read_text())
    lists = [trigger["metadata"]["listName"] for trigger in scaled["spec"]["triggers"]]
    default_prefix = Settings.model_fields["redis_key_prefix"].default
    assert all(name.startswith(default_prefix) for name in lists)
    # This test's own key space stands in for the deployment's prefix.
    keys = {name: key_prefix + name.removeprefix(default_prefix) for name in lists}
    app = make_celery(Settings(redis_url=REDIS_URL, redis_key_prefix=key_prefix))
    publisher = JobPublisher(app, bulk_chunk_size=2)
    # Single jobs one message each; batch lines two to a message (the chunk size).
    publisher.publish_interactive(["a"], queue=interactive_queue("llama"))
    publisher.publish_interactive(["b"], queue=interactive_queue("llama"))
    publisher.publish_bulk(["c", "d", "e", "f", "g"], queue=bulk_queue("llama"))
    publisher.publish_interactive(["x"], queue=interactive_queue("other-model"))

    redis = Redis.from_url(REDIS_URL)
    lengths = {name: redis.llen(key) for name, key in keys.items()}
    assert lengths == {
        f"{default_prefix}interactive:llama": 2,
        f"{default_prefix}bulk:llama": 3,
    }

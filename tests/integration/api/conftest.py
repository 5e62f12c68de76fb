"""A deployment serving several models at once, for the tests of routing by model, LoRA
adapters and embeddings: the tiny model under two names (one with a LoRA adapter) and
as an embedding model through the pooling runner. Started once for the package."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import anthropic
import pytest

from tests.conftest import (
    ADMIN_KEY,
    FAULT_SETTINGS,
    Stack,
    delete_keys,
    new_key_prefix,
    service_env,
)
from tests.helpers.databases import cloned_database
from tests.helpers.deployment import Deployment
from tests.helpers.lora import make_tiny_adapter
from tests.helpers.processes import (
    ENGINE_CORE_APART,
    ENGINE_CORE_HERE,
    ServiceProcess,
    wait_worker_ready,
)

CHAT_MODEL = "tiny-a"
ADAPTER = "tiny-a-lora"
OTHER_MODEL = "tiny-b"
EMBEDDING_MODEL = "tiny-embed"


@dataclass
class ModelsStack:
    deployment: Deployment
    # Each model's worker settings, and its worker now.
    settings: dict[str, dict[str, str]]
    workers: dict[str, ServiceProcess]

    def start_worker(self, model: str, *, wait: bool = True) -> ServiceProcess:
        """(Re)start the worker of `model` as the fixture first started it."""
        worker = self.deployment.start_worker(model, wait=wait, **self.settings[model])
        self.workers[model] = worker
        return worker


@pytest.fixture(scope="package")
def models_stack(
    tiny_model: Path, pg_template: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ModelsStack]:
    logs = tmp_path_factory.mktemp("models-logs")
    adapter = make_tiny_adapter(tiny_model, tmp_path_factory.mktemp("adapter"))
    prefix = new_key_prefix()
    with cloned_database(pg_template) as database_url:
        # The engines' processes apart, as on a GPU: test_models checks their nice (not
        # the other model's, whose engine runs in its worker).
        env = service_env(
            model=tiny_model,
            database_url=database_url,
            key_prefix=prefix,
            **FAULT_SETTINGS,
            **ENGINE_CORE_APART,
        )
        deployment = Deployment(env=env, log_dir=logs, admin_key=ADMIN_KEY)
        overrides = {
            CHAT_MODEL: {
                "INFERQ_SERVED_MODEL_NAME": CHAT_MODEL,
                "INFERQ_LORA_ADAPTERS": f"{ADAPTER}={adapter}",
                "INFERQ_ENGINE_GROUP_NICE": "5",
            },
            OTHER_MODEL: {"INFERQ_SERVED_MODEL_NAME": OTHER_MODEL, **ENGINE_CORE_HERE},
            EMBEDDING_MODEL: {
                "INFERQ_SERVED_MODEL_NAME": EMBEDDING_MODEL,
                "INFERQ_RUNNER": "pooling",
            },
        }
        stack = ModelsStack(deployment=deployment, settings=overrides, workers={})
        try:
            deployment.start(registered=False)
            # Started together: their engines load at the same time.
            for model in overrides:
                stack.start_worker(model, wait=False)
            for worker in stack.workers.values():
                wait_worker_ready(worker)
            yield stack
        finally:
            deployment.stop()
            delete_keys(prefix)


AnthropicClients = Callable[..., anthropic.Anthropic]


@pytest.fixture
def anthropic_clients(stack: Stack) -> Iterator[AnthropicClients]:
    """Makes `anthropic` clients of the stack (with the admin's key unless given one),
    closed after the test."""
    made: list[anthropic.Anthropic] = []

    def make(key: str = ADMIN_KEY) -> anthropic.Anthropic:
        client = anthropic.Anthropic(base_url=stack.url, api_key=key, max_retries=0, timeout=120)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()

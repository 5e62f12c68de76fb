"""Queue names: each served model has its own queues, so a worker consumes only its own
model's work (kombu keeps each queue as a Redis list)."""

from __future__ import annotations

from inferq.constants import BULK_QUEUE, INTERACTIVE_QUEUE

# A served model's queues are named `<kind>:<served model name>`, so a worker consumes
# only its own model's work (an adapter's jobs go to its base model's queues).
_SEPARATOR = ":"


def interactive_queue(model: str) -> str:
    """The queue of single jobs for the served model `model`."""
    return f"{INTERACTIVE_QUEUE}{_SEPARATOR}{model}"


def bulk_queue(model: str) -> str:
    """The queue of batch lines for the served model `model`."""
    return f"{BULK_QUEUE}{_SEPARATOR}{model}"


def bulk_queue_beside(queue: str) -> str:
    """The queue of batch lines for the served model whose queue `queue` is."""
    return bulk_queue(queue.partition(_SEPARATOR)[2])


def gpu_queues(model: str) -> tuple[str, str]:
    """What a worker serving `model` consumes, the one it takes from first first."""
    return interactive_queue(model), bulk_queue(model)


def is_bulk(queue: str) -> bool:
    return queue.partition(_SEPARATOR)[0] == BULK_QUEUE

"""inferq: self-hosted, queue-based batch inference for open-weight LLMs."""

__version__ = "0.1.0"

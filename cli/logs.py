"""Logging set-up for every inferq process: plain text, or one JSON object per line."""

from __future__ import annotations

import logging
import os

from inferq.settings import Settings

# Fields a record may carry (`extra=`) that say which job or batch it is about.
CONTEXT_FIELDS = ("job_id", "batch_id", "tenant", "worker")


def configure_logging(level: str, *, json_lines: bool = False) -> None:
    handler = logging.StreamHandler()
    if json_lines:
        from pythonjsonlogger.json import JsonFormatter

        handler.setFormatter(
            JsonFormatter(
                "%(asctime)s %(levelname)s %(name)s %(process)d %(message)s",
                rename_fields={"levelname": "level", "asctime": "time", "name": "logger"},
            )
        )
        # vLLM installs its own text handler unless told not to; then its records come here.
        os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    else:
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s [%(processName)s] %(message)s")
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def configured() -> Settings:
    """The settings from the environment, with logging set up as they say."""
    settings = Settings()
    configure_logging(settings.log_level, json_lines=settings.log_json)
    return settings

"""How operators watch inferq (Flower, every process's log), and how its processes watch
themselves."""

from __future__ import annotations

from pydantic import BaseModel, Field, SecretStr


class FlowerSettings(BaseModel):
    """Flower, the Celery monitor (`inferq flower`)."""

    flower_basic_auth: SecretStr | None = Field(
        None, description="`user:password` for Flower; `inferq flower` refuses to start without."
    )
    flower_port: int = Field(5555, ge=1, le=65535, description="Port Flower listens on.")


class LogSettings(BaseModel):
    """What every process logs, and how."""

    log_level: str = Field(
        "INFO",
        description="Log level of every process (a GPU worker logs Celery's two lines a message, "
        "received and succeeded, at DEBUG only).",
    )
    log_json: bool = Field(
        False, description="Log one JSON object per line, with job and batch ids as fields."
    )


class HealthSettings(BaseModel):
    """When a process that looks alive but does nothing counts as stuck."""

    stall_s: float = Field(
        120,
        ge=10,
        description="A worker with room, whose queues hold work, that takes none for this long "
        "is stuck: it consumes again, and exits to be restarted if still stuck this long "
        "after (the housekeeper likewise; beat exits when it has scheduled no maintenance "
        "for this long); maintenance counts jobs queued this long while their model's workers "
        "have room as stuck (`inferq_jobs_stalled`). Too short restarts a worker that is "
        "only slow to get back to Redis after an outage; too long leaves jobs waiting (docs: "
        "Operations).",
    )

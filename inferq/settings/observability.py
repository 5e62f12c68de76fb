"""How operators watch inferq: Flower, and every process's log."""

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

    log_level: str = Field("INFO", description="Log level of every process.")
    log_json: bool = Field(
        False, description="Log one JSON object per line, with job and batch ids as fields."
    )

"""The housekeeper's settings: maintenance and retention, and webhook delivery."""

from __future__ import annotations

import ipaddress
from typing import Annotated, Any

from pydantic import BaseModel, Field, field_validator
from pydantic_settings import NoDecode


class MaintenanceSettings(BaseModel):
    """How often maintenance runs, and how long what has ended is kept."""

    maintenance_interval_s: float = Field(
        15, gt=0, description="How often `inferq beat` schedules maintenance."
    )
    job_retention_s: int = Field(
        30 * 86400,
        ge=0,
        description="How long a job is kept after it ends; also the default expiry of "
        "uploaded files and of a batch's lines, results and files once it ends (a request's "
        "`expires_after` / `output_expires_after` overrides it). 0 keeps them.",
    )
    webhook_retention_s: int = Field(
        7 * 86400,
        ge=0,
        description="How long a webhook delivery and its attempts are kept after it ends "
        "(0 keeps them).",
    )


class WebhookSettings(BaseModel):
    """Where webhooks may go, how they are retried, and how many go at once."""

    webhook_allowed_networks: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Private networks webhooks may reach (comma-separated CIDRs, e.g. "
        "`10.0.0.0/8`); by default only public addresses are.",
    )
    webhook_timeout_s: float = Field(
        15, gt=0, description="How long a webhook receiver has to answer."
    )
    webhook_retry_schedule_s: Annotated[list[float], NoDecode] = Field(
        default_factory=lambda: [0.0, 5, 300, 1800, 7200, 18000, 36000, 36000],
        description="Delay before each delivery attempt, comma-separated (jittered by 10%); "
        "after the last, a delivery is dead-lettered.",
    )
    webhook_secret_overlap_s: int = Field(
        86400, ge=0, description="After a secret rotation, how long the old secret also signs."
    )
    webhook_concurrency: int = Field(
        16, ge=1, description="Webhooks one housekeeper sends at once."
    )

    @field_validator("webhook_allowed_networks", "webhook_retry_schedule_s", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("webhook_allowed_networks")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        for network in value:
            ipaddress.ip_network(network, strict=False)  # ValueError says what is wrong
        return value

    @field_validator("webhook_retry_schedule_s")
    @classmethod
    def _schedule(cls, value: list[float]) -> list[float]:
        if not value or any(delay < 0 for delay in value):
            raise ValueError("needs at least one delay, none negative")
        return value

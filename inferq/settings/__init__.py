"""The one typed settings object, read from `INFERQ_*` environment variables.

`Settings` is every group of settings at once (each group a module here, by role); a
constructor that reads one group takes that group, so what it depends on shows in its
signature. Checks within one group live on the group; checks across groups live here.
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, Field, ValidationError, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, SettingsConfigDict

from inferq.settings.api import ApiSettings, BatchFileSettings
from inferq.settings.connection import ConnectionSettings, redact_url
from inferq.settings.engine import DEFAULT_MODEL, LORA_RANKS, EngineSettings
from inferq.settings.housekeeping import MaintenanceSettings, WebhookSettings
from inferq.settings.observability import FlowerSettings, HealthSettings, LogSettings
from inferq.settings.served_models import AnnouncedModel, ServedModelSettings
from inferq.settings.worker import WorkerSettings

__all__ = [
    "DEFAULT_MODEL",
    "LORA_RANKS",
    "AnnouncedModel",
    "ApiSettings",
    "BatchFileSettings",
    "ConnectionSettings",
    "EngineSettings",
    "FlowerSettings",
    "LogSettings",
    "MaintenanceSettings",
    "ServedModelSettings",
    "Settings",
    "WebhookSettings",
    "WorkerSettings",
    "redact_url",
    "settings_table",
]


# pydantic takes a model's fields from its last base first: the groups are listed last to
# first, so that the table (`settings_table`) and `inferq settings` read from the
# connections down.
class Settings(
    HealthSettings,
    LogSettings,
    WebhookSettings,
    FlowerSettings,
    ApiSettings,
    MaintenanceSettings,
    BatchFileSettings,
    WorkerSettings,
    ServedModelSettings,
    EngineSettings,
    ConnectionSettings,
    BaseSettings,
):
    """Everything inferq can be told; each field is `INFERQ_<NAME>` in the environment."""

    # An empty variable counts as unset, so compose files can pass `${VAR:-}` through.
    model_config = SettingsConfigDict(
        env_prefix="INFERQ_", extra="ignore", frozen=True, env_ignore_empty=True
    )

    environment: Literal["development", "production"] = Field(
        "production",
        description="`development` allows auth off and placeholder secrets; never in production.",
    )

    @model_validator(mode="after")
    def _stall_after_maintenance(self) -> Settings:
        # Beat counts as stuck when it has scheduled no maintenance pass for INFERQ_STALL_S.
        if self.stall_s < (floor := 2 * self.maintenance_interval_s):
            raise ValueError(
                f"INFERQ_STALL_S is {self.stall_s:g}, but must be at least {floor:g} "
                "(2 maintenance intervals, INFERQ_MAINTENANCE_INTERVAL_S)"
            )
        return self

    @model_validator(mode="after")
    def _announced_models_servable(self) -> Settings:
        # Checked in every process, so a mistake is said at start, not when migrate runs.
        self.announced_model_settings()
        return self

    def announced_model_settings(self) -> list[EngineSettings]:
        """The engine settings of each model in INFERQ_ANNOUNCE_MODELS, as its workers
        would have them: the shared settings, and what the model's entry sets on top."""
        if not self.announce_models:
            return []
        shared = self.model_dump(include=set(EngineSettings.model_fields))
        found = []
        for name, entry in self.announce_models.items():
            own = entry.model_dump(exclude_unset=True)
            try:
                found.append(
                    EngineSettings.model_validate({**shared, **own, "served_model_name": name})
                )
            except ValidationError as exc:
                raise ValueError(
                    f"INFERQ_ANNOUNCE_MODELS: model {name!r}: {_reasons(exc)}"
                ) from exc
        return found

    @model_validator(mode="after")
    def _safe_outside_development(self) -> Settings:
        if self.environment == "development":
            return self
        if not self.auth_enabled:
            raise ValueError(
                "INFERQ_AUTH_ENABLED=false leaves every tenant's data open; it is allowed only "
                "with INFERQ_ENVIRONMENT=development"
            )
        key = self.bootstrap_admin_key
        if key is not None and (why := _weak(key.get_secret_value(), at_least=32)):
            raise ValueError(
                f"INFERQ_BOOTSTRAP_ADMIN_KEY {why}: generate one with `openssl rand -hex 32`"
            )
        auth = self.flower_basic_auth
        if auth is not None:
            user, colon, password = auth.get_secret_value().partition(":")
            if not user or not colon:
                raise ValueError(
                    "INFERQ_FLOWER_BASIC_AUTH must be user:password (a user name, a colon, "
                    "then a password)"
                )
            if why := _weak(password, at_least=12):
                raise ValueError(
                    f"INFERQ_FLOWER_BASIC_AUTH's password {why}: use a real one, such as "
                    "`openssl rand -hex 12`"
                )
        return self

    @property
    def effective_worker_concurrency(self) -> int:
        return self.worker_concurrency or self.engine_max_num_seqs + self.max_batch_size


_PLACEHOLDERS = (
    "changeme",
    "change-me",
    "change_me",
    "changethis",
    "secret",
    "password",
    "example",
)


def _weak(secret: str, *, at_least: int) -> str | None:
    """Why `secret` will not do (None: it will)."""
    if len(secret) < at_least:
        return f"is {len(secret)} character{'s' * (len(secret) != 1)}, shorter than {at_least}"
    lowered = secret.lower()
    if word := next((w for w in _PLACEHOLDERS if w in lowered), None):
        return f"contains {word!r}, which placeholders do"
    if len(set(lowered)) <= 2:
        return "repeats one or two characters, as placeholders do"
    return None


def _reasons(exc: ValidationError) -> str:
    """What a nested model's validation refused, in one line."""
    reasons = []
    for error in exc.errors():
        where = ".".join(map(str, error["loc"]))
        message = error["msg"].removeprefix("Value error, ")
        reasons.append(f"{where}: {message}" if where else message)
    return "; ".join(reasons)


# The configuration page's sections, in order: a title and the groups under it.
_SECTIONS: tuple[tuple[str, tuple[type[BaseModel], ...]], ...] = (
    ("Store and queue", (ConnectionSettings,)),
    ("Engine", (EngineSettings, ServedModelSettings)),
    ("Worker", (WorkerSettings,)),
    ("API", (ApiSettings, BatchFileSettings)),
    ("Webhooks", (WebhookSettings,)),
    ("Retention and maintenance", (MaintenanceSettings,)),
    ("Monitoring", (FlowerSettings, LogSettings, HealthSettings)),
)


def settings_table() -> str:
    """Every setting in Markdown, a section per role (the groups' docstrings) with a table:
    variable, default, meaning (for docs/configuration.md)."""
    placed = {name for _, groups in _SECTIONS for group in groups for name in group.model_fields}
    sections: list[tuple[str, tuple[type[BaseModel], ...]]] = [
        *_SECTIONS,
        ("Environment", (Settings,)),
    ]
    out = []
    for title, groups in sections:
        names = [n for g in groups for n in g.model_fields if g is not Settings or n not in placed]
        out += [f"## {title}", ""]
        out += [" ".join((g.__doc__ or "").split()) for g in groups if g is not Settings]
        out += ["", "| variable | default | meaning |", "|---|---|---|"]
        out += [_row(name, Settings.model_fields[name]) for name in names]
        out.append("")
    return "\n".join(out).strip()


def _row(name: str, field: FieldInfo) -> str:
    default = field.get_default(call_default_factory=True)
    shown = (
        "(unset)"
        if default is None
        else f"`{json.dumps(default) if isinstance(default, dict) else default}`"
    )
    return f"| `INFERQ_{name.upper()}` | {shown} | {field.description} |"

"""Where state lives: Postgres and Redis, and how Redis gives back unacknowledged work."""

from __future__ import annotations

from pydantic import BaseModel, Field, SecretStr, ValidationInfo, field_validator
from sqlalchemy.engine import make_url


class ConnectionSettings(BaseModel):
    """The database and the broker every process connects to."""

    database_password: SecretStr | None = Field(
        None,
        description=(
            "Password of the database URL's user, if not in the URL: any characters, where "
            "the URL would need `@ / : # %` percent-encoded."
        ),
    )
    database_url: str = Field(
        "postgresql+psycopg://postgres@127.0.0.1:5432/inferq",
        description="SQLAlchemy URL of the Postgres database that holds every job and result.",
    )
    redis_url: str = Field(
        "redis://127.0.0.1:6379/0", description="Redis that carries work (the Celery broker)."
    )
    redis_key_prefix: str = Field(
        "inferq:", description="Prefix of every Redis key inferq and Celery write."
    )

    @field_validator("database_url")
    @classmethod
    def _password_into_the_url(cls, value: str, info: ValidationInfo) -> str:
        # database_password is declared first, so it is validated by now.
        password = info.data.get("database_password")
        if password is None:
            return value
        # Rendered, the URL quotes what it cannot hold as it is.
        url = make_url(value).set(password=password.get_secret_value())
        return url.render_as_string(hide_password=False)


def redact_url(value: str) -> str:
    """`value` with the password of a URL in it replaced by `***`."""
    scheme, sep, rest = value.partition("://")
    credentials, at, host = rest.rpartition("@")
    if not sep or not at or ":" not in credentials:
        return value
    return f"{scheme}{sep}{credentials.split(':', 1)[0]}:***@{host}"

"""Request fields accepted and ignored, as vLLM's server accepts them: OpenAI's fields that
mean nothing here (declared with `ignored`, so the reference and the compatibility page
list them) and any field a request shape does not know. Each ignored field name is logged
once per process, so a client's habits show in the log without flooding it."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

log = logging.getLogger(__name__)

# How a field is treated, in its JSON schema (read by the compatibility page).
COMPAT_KEY = "x-inferq-compat"
IGNORED = "ignored"
# A field whose values inferq cannot honour are refused; the reason is in its description.
REFUSED_VALUES = "refused-values"

_logged: set[str] = set()
_logging = threading.Lock()


def note_ignored(names: Iterable[str]) -> None:
    """Log each of `names` the first time a request sends it."""
    with _logging:
        new = sorted(set(names) - _logged)
        _logged.update(new)
    for name in new:
        log.warning(
            "request field %r is accepted and ignored: it has no effect here (logged once)",
            name,
            extra={"ignored_field": name},
        )


def ignored(reason: str, default: Any = None) -> Any:
    """A field accepted for compatibility that changes nothing; `reason` says why."""
    return Field(
        default,
        description=f"Accepted and ignored: {reason}",
        json_schema_extra={COMPAT_KEY: IGNORED},
    )


def refusing(description: str, default: Any = None) -> Any:
    """A field with values inferq cannot honour, refused with a 4xx; `description` says
    which."""
    return Field(default, description=description, json_schema_extra={COMPAT_KEY: REFUSED_VALUES})


def compat_of(extra: Any) -> str | None:
    """How a field is treated, from its `json_schema_extra`: `ignored`,
    `refused-values` or None (honoured)."""
    if isinstance(extra, dict):
        value = extra.get(COMPAT_KEY)
        return value if isinstance(value, str) else None
    return None


class Lenient(BaseModel):
    """A request shape that ignores fields it does not know (and those declared with
    `ignored`), logging each name once."""

    model_config = ConfigDict(extra="ignore")

    _known: ClassVar[frozenset[str]] = frozenset()
    _ignored: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        fields = cls.model_fields
        cls._known = frozenset(fields) | {f.alias for f in fields.values() if f.alias}
        cls._ignored = frozenset(
            f.alias or name
            for name, f in fields.items()
            if compat_of(f.json_schema_extra) == IGNORED
        )

    @model_validator(mode="before")
    @classmethod
    def _note_ignored(cls, data: Any) -> Any:
        # Set operations on the keys alone: this runs for every message of every request.
        if isinstance(data, dict):
            unknown = data.keys() - cls._known
            declared = data.keys() & cls._ignored
            if unknown or declared:
                note_ignored([*unknown, *(k for k in declared if data[k] is not None)])
        return data

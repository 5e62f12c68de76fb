"""Anthropic's Messages request body, as inferq takes it: on `/v1/messages` and in the
requests of a message batch. It becomes a chat job: the system prompt and the turns are
rendered with the model's chat template, and the sampling fields map onto the job's.

What means nothing here (`metadata`, `thinking` and `output_config.effort` for a model
that does not reason, `service_tier`, `cache_control` on a block, unknown fields) is
accepted and ignored, each field name logged once. What cannot be honoured (an image or
document block, a server tool, a final assistant turn to continue) is refused, naming the
field. Tools, tool calls and their results are chat tools (`inferq.wire.anthropic_turns`).
"""

from __future__ import annotations

import logging
import threading
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from inferq.exceptions import InvalidRequest
from inferq.wire.anthropic_turns import block_text, chat_tools, chat_turns
from inferq.wire.messages import ChatMessage
from inferq.wire.sampling_fields import MAX_STOP_SEQUENCES, SamplingFields
from inferq.wire.structured import JsonSchemaFormat, JsonSchemaSpec
from inferq.wire.validation import (
    JobValidator,
    PreparedRequest,
    check_storable,
)

log = logging.getLogger(__name__)


class _Lenient(BaseModel):
    # Anthropic adds fields often; those not known here are ignored, as serve ignores them.
    model_config = ConfigDict(extra="allow")


class AnthropicMessage(_Lenient):
    """One turn: text, or a list of content blocks (text blocks are read)."""

    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class JsonOutputFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema", description="The schema the output matches.")


class OutputConfig(_Lenient):
    """The output's shape (`format`, honoured); `effort` is accepted and ignored."""

    format: JsonOutputFormat | None = None
    effort: str | None = None


class MessagesBody(_Lenient):
    """A Messages API request (Anthropic's shape)."""

    model: str
    max_tokens: int = Field(ge=1, description="Most tokens to generate.")
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = Field(
        None, description="A system prompt: text, or text blocks joined in order."
    )
    stop_sequences: list[Annotated[str, Field(min_length=1)]] | None = Field(
        None,
        max_length=MAX_STOP_SEQUENCES,
        description=f"Up to {MAX_STOP_SEQUENCES} strings that end generation.",
    )
    stream: bool = False
    temperature: float = Field(1.0, ge=0, le=1, description="0 is greedy.")
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int | None = Field(None, ge=0, le=2**31 - 1)
    seed: int | None = Field(
        None,
        ge=0,
        le=2**63 - 1,
        description="inferq's addition, as vLLM takes it: same seed, same parameters, same text.",
    )
    metadata: dict[str, Any] | None = Field(None, description="Accepted; not used.")
    tools: list[dict[str, Any]] | None = Field(
        None, description="Tools of your own (`name`, `description`, `input_schema`)."
    )
    tool_choice: dict[str, Any] | None = Field(
        None, description="`auto` (the default with tools), `any`, `tool` (with `name`), `none`."
    )
    thinking: dict[str, Any] | None = Field(
        None, description="Accepted and ignored: the models served here do not reason."
    )
    service_tier: str | None = Field(None, description="Accepted; not used.")
    output_config: OutputConfig | None = Field(
        None, description="`format`: a JSON schema the output must match."
    )


class CountTokensBody(MessagesBody):
    """A Messages request to count the prompt tokens of, as it would be sent."""

    max_tokens: int = Field(1, ge=1, description="Not needed to count: accepted.")


_IGNORED = frozenset({"metadata", "thinking", "service_tier"})
_IGNORED_OUTPUT = frozenset({"effort"})


class _IgnoredFields:
    """Logs each ignored field name once per process, so a log shows what clients send."""

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def note(self, names: set[str]) -> None:
        with self._lock:
            new = sorted(names - self._seen)
            self._seen.update(new)
        for name in new:
            log.info("ignored field %r of a Messages request: it means nothing here", name)


_ignored = _IgnoredFields()


def prepare_messages(validator: JobValidator, body: MessagesBody) -> PreparedRequest:
    """Every check of a Messages body but the context length (which needs its tokens)."""
    _ignored.note(_ignored_names(body))
    if body.messages[-1].role == "assistant":
        raise InvalidRequest(
            "a final assistant turn (a prefill to continue) is not supported: end with a user turn",
            param=f"messages.{len(body.messages) - 1}.role",
        )
    turns = []
    if body.system:
        turns.append((ChatMessage(role="system", content=_system(body.system)), "system"))
    for i, message in enumerate(body.messages):
        turns += chat_turns(message.role, message.content, f"messages.{i}.content")
    # Checked here, where each text's field is known (the turns are not the messages).
    for turn, field in turns:
        check_storable(turn.text(), field)
    tools, tool_choice = chat_tools(body.tools, body.tool_choice)
    sampling = SamplingFields(
        max_tokens=body.max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k or 0,
        seed=body.seed,
        stop=body.stop_sequences or None,
        response_format=_response_format(body.output_config),
        tools=tools,
        tool_choice=tool_choice,
    )
    try:
        return validator.prepare(
            model=body.model,
            prompt=None,
            messages=[turn for turn, _ in turns],
            sampling=sampling,
            metadata={},
        )
    except InvalidRequest as exc:
        param = _anthropic_param(exc.param)
        if param == exc.param:
            raise
        raise InvalidRequest(exc.message, param=param, code=exc.code) from exc


def _anthropic_param(param: str | None) -> str | None:
    """The field of a Messages request that a chat request's field came from."""
    if param is None:
        return None
    if param.startswith("response_format"):
        return "output_config.format.schema"
    return param.replace(".function.parameters", ".input_schema").replace(".function.", ".")


def _response_format(config: OutputConfig | None) -> JsonSchemaFormat | None:
    if config is None or config.format is None:
        return None
    spec = JsonSchemaSpec.model_validate({"name": "output", "schema": config.format.schema_})
    return JsonSchemaFormat(type="json_schema", json_schema=spec)


def _ignored_names(body: MessagesBody) -> set[str]:
    given = body.model_fields_set & _IGNORED | set(body.model_extra or {})
    if body.output_config is not None:
        config = body.output_config
        given |= {f"output_config.{name}" for name in config.model_fields_set & _IGNORED_OUTPUT}
        given |= {f"output_config.{name}" for name in config.model_extra or {}}
    return given


def _system(system: str | list[dict[str, Any]]) -> str:
    if isinstance(system, str):
        return system
    return "".join(block_text(block, f"system.{j}") for j, block in enumerate(system))

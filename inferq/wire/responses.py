"""OpenAI's Responses API (`/v1/responses`): the request as inferq takes it, online and in
batch-file lines, made into a chat job; and the `response` object and its stream events,
rendered from the job.

A response is a chat: `instructions` become the system message and `input` (text, or a
list of messages, function calls and their outputs) the turns after it; `text.format` is
the structured output and function `tools` are a chat's tools. What the response object
echoes of the request (instructions, tools, text format, ...) is kept with the job
(`JobSpec.response`), so a stored response reads back as it was answered, and
`previous_response_id` continues a stored response's conversation.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

from inferq.constants import JOB_ID_PREFIX
from inferq.domain.jobs import Job, JobSpec, JobStatus
from inferq.exceptions import InvalidRequest
from inferq.wire.messages import CalledFunction, ChatMessage, MessageToolCall
from inferq.wire.openai_format import chat_logprobs
from inferq.wire.structured import (
    MAX_TOOLS,
    FunctionDef,
    JsonObjectFormat,
    JsonSchemaFormat,
    JsonSchemaSpec,
    NamedFunction,
    NamedToolChoice,
    TextFormat,
    Tool,
    ToolChoice,
)
from inferq.wire.validation import (
    MAX_LOGPROBS,
    JobValidator,
    Metadata,
    PreparedRequest,
    SamplerFields,
    SamplingFields,
)

RESPONSE_ID_PREFIX = "resp_"
LOGPROBS_INCLUDE = "message.output_text.logprobs"
_NAME = r"^[A-Za-z0-9_-]{1,64}$"
_SAMPLER_NAMES = set(SamplerFields.model_fields)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InputText(_Strict):
    type: Literal["input_text"]
    text: str


class OutputText(_Strict):
    """Text of an earlier response's message, sent back as input."""

    type: Literal["output_text"]
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] | None = None


class MessageItem(_Strict):
    """A turn of the conversation. `id`, `status` and `phase` are accepted so that an
    earlier response's output items can be sent back as they came."""

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[Annotated[InputText | OutputText, Field(discriminator="type")]]
    id: str | None = None
    status: str | None = None
    phase: str | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class FunctionCallItem(_Strict):
    """A function call an earlier response made."""

    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(_Strict):
    """What a function call returned, for the model to go on from."""

    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str | list[InputText]
    id: str | None = None
    status: str | None = None

    def text(self) -> str:
        if isinstance(self.output, str):
            return self.output
        return "".join(part.text for part in self.output)


def _item_type(value: Any) -> str:
    """An input item's `type`; a message may leave it out (OpenAI's easy input)."""
    if isinstance(value, dict):
        return str(value.get("type", "message"))
    return str(getattr(value, "type", "message"))


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")],
    Discriminator(
        _item_type,
        custom_error_type="invalid_input_item",
        custom_error_message="an input item's type must be message, function_call or "
        "function_call_output (images, files and other items are not supported)",
    ),
]


class FunctionTool(_Strict):
    """A function the model may call (the only kind of tool served here)."""

    type: Literal["function"]
    name: str = Field(pattern=_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = Field(
        None, description="A JSON Schema of the arguments; any object if left out."
    )
    strict: bool | None = Field(None, description="Accepted: the arguments always match.")


class FunctionChoice(_Strict):
    type: Literal["function"]
    name: str


class JsonSchemaTextFormat(_Strict):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    type: Literal["json_schema"]
    name: str = Field(pattern=_NAME)
    schema_: dict[str, Any] = Field(alias="schema", description="What the output must match.")
    description: str | None = None
    strict: bool | None = Field(None, description="Accepted: the schema is always enforced.")


class TextConfig(_Strict):
    format: Annotated[
        TextFormat | JsonObjectFormat | JsonSchemaTextFormat, Field(discriminator="type")
    ] = Field(default_factory=lambda: TextFormat(type="text"))
    verbosity: Literal["low", "medium", "high"] | None = Field(
        None, description="Accepted for compatibility; not used."
    )


class ResponsesStreamOptions(_Strict):
    include_obfuscation: bool | None = Field(
        None, description="Accepted for compatibility: events carry no padding."
    )


class ResponsesBody(SamplerFields):
    """A request to OpenAI's Responses API, as `/v1/responses` and batch lines take it;
    the sampling fields beyond OpenAI's (`top_k`, `seed`, `stop`, ...) are vLLM's."""

    model: str
    input: str | Annotated[list[InputItem], Field(min_length=1)]
    instructions: str | None = Field(None, description="The system message, before `input`.")
    max_output_tokens: int | None = Field(None, ge=1)
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    include: list[Literal["message.output_text.logprobs"]] | None = None
    tools: list[FunctionTool] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool = True
    text: TextConfig | None = None
    metadata: Metadata | None = None
    stream: bool = False
    stream_options: ResponsesStreamOptions | None = None
    store: bool = Field(True, description="Keep the response, to be read back by its id.")
    background: bool = Field(
        False, description="Answer at once (status `queued`); read the response back later."
    )
    previous_response_id: str | None = Field(
        None, description="A stored response whose conversation this one continues."
    )
    truncation: Literal["disabled"] | None = Field(
        None, description="Only `disabled`: an input too long for the context is refused."
    )
    user: str | None = Field(None, description="Accepted for compatibility; not used.")
    safety_identifier: str | None = Field(None, description="Accepted; not used.")
    prompt_cache_key: str | None = Field(None, description="Accepted; prefix caching is automatic.")
    service_tier: Literal["auto", "default"] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        if self.background and not self.store:
            raise ValueError("background needs store true: a background response is read back")
        return self

    def input_chars(self) -> int:
        if isinstance(self.input, str):
            return len(self.input)
        return sum(len(json.dumps(item.model_dump(), ensure_ascii=False)) for item in self.input)

    def wants_logprobs(self) -> bool:
        return self.top_logprobs is not None or LOGPROBS_INCLUDE in (self.include or ())


def response_id(job_id: str) -> str:
    return RESPONSE_ID_PREFIX + job_id.removeprefix(JOB_ID_PREFIX)


def response_job_id(resp_id: str) -> str:
    """The job a response id names (an id of another kind names no job)."""
    if not resp_id.startswith(RESPONSE_ID_PREFIX):
        return resp_id
    return JOB_ID_PREFIX + resp_id.removeprefix(RESPONSE_ID_PREFIX)


def prepare_response(
    validator: JobValidator, body: ResponsesBody, *, previous: Job | None = None
) -> PreparedRequest:
    """Every check of a request but the context length; `previous` is the stored response
    `previous_response_id` names, read and checked by the caller."""
    try:
        prepared = validator.prepare(
            model=body.model,
            prompt=None,
            messages=_conversation(body, previous),
            sampling=_sampling(body),
            metadata=dict(body.metadata or {}),
        )
    except InvalidRequest as exc:
        raise _in_responses_terms(exc) from exc
    return dataclasses.replace(prepared, response=_echo(body))


def finish_response(
    validator: JobValidator, prepared: PreparedRequest, token_ids: list[int]
) -> JobSpec:
    """The job of a prepared request, once its tokens fit the context."""
    try:
        return validator.finish(prepared, token_ids)
    except InvalidRequest as exc:
        raise _in_responses_terms(exc) from exc


def check_previous(previous: Job, resp_id: str) -> None:
    """A response can continue `previous` only once it has completed."""
    if previous.status is not JobStatus.SUCCEEDED:
        state = _STATUSES[previous.status]
        raise InvalidRequest(
            f"previous_response_id {resp_id!r} is {state}: a conversation continues only "
            "from a completed response",
            param="previous_response_id",
        )


def stored_response(job: Job) -> bool:
    """Whether a job is a response kept to be read back (`store` true)."""
    return job.response is not None and bool(job.response.get("store", True))


def _conversation(body: ResponsesBody, previous: Job | None) -> list[ChatMessage]:
    messages: list[ChatMessage] = []
    if body.instructions is not None:
        messages.append(ChatMessage(role="system", content=body.instructions))
    if previous is not None:
        messages.extend(_continued(previous))
    items = body.input if isinstance(body.input, list) else [_user(body.input)]
    for item in items:
        if isinstance(item, MessageItem):
            messages.append(ChatMessage(role=item.role, content=item.text()))
        elif isinstance(item, FunctionCallOutputItem):
            messages.append(
                ChatMessage(role="tool", content=item.text(), tool_call_id=item.call_id)
            )
        else:
            call = MessageToolCall(
                id=item.call_id,
                type="function",
                function=CalledFunction(name=item.name, arguments=item.arguments),
            )
            _add_call(messages, call)
    return messages


def _user(text: str) -> MessageItem:
    return MessageItem(role="user", content=text)


def _add_call(messages: list[ChatMessage], call: MessageToolCall) -> None:
    """A function call joins the assistant turn just before it (the calls of one turn come
    as consecutive items), or starts one."""
    last = messages[-1] if messages else None
    if last is not None and last.role == "assistant":
        calls = [*(last.tool_calls or ()), call]
        messages[-1] = ChatMessage(role="assistant", content=last.content, tool_calls=calls)
    else:
        messages.append(ChatMessage(role="assistant", content=None, tool_calls=[call]))


def _continued(previous: Job) -> list[ChatMessage]:
    """The conversation of a completed response, its answer included; not its
    instructions, which (as OpenAI's) do not carry over."""
    stored = previous.messages or []
    if previous.response is not None and previous.response.get("instructions") is not None:
        stored = stored[1:]
    messages = [_from_template(m) for m in stored]
    assert previous.result is not None, "a completed response has its result"
    choice = previous.result.choices[0]
    calls = [
        MessageToolCall(
            id=c.id, type="function", function=CalledFunction(name=c.name, arguments=c.arguments)
        )
        for c in choice.tool_calls or ()
    ]
    content = choice.text if choice.text or not calls else None
    messages.append(ChatMessage(role="assistant", content=content, tool_calls=calls or None))
    return messages


def _from_template(message: Mapping[str, Any]) -> ChatMessage:
    """A stored message (as it was handed to the chat template) as a `ChatMessage`."""
    calls = None
    if message.get("tool_calls") is not None:
        calls = []
        for call in message["tool_calls"]:
            arguments = call["function"]["arguments"]
            if not isinstance(arguments, str):
                arguments = json.dumps(arguments, ensure_ascii=False)
            called = CalledFunction(name=call["function"]["name"], arguments=arguments)
            calls.append(MessageToolCall(id=call["id"], type="function", function=called))
    return ChatMessage(
        role=message["role"],
        content=message.get("content"),
        name=message.get("name"),
        tool_calls=calls,
        tool_call_id=message.get("tool_call_id"),
    )


def _sampling(body: ResponsesBody) -> SamplingFields:
    sampler = body.model_dump(include=_SAMPLER_NAMES, exclude_unset=True)
    fmt = body.text.format if body.text is not None else None
    response_format: TextFormat | JsonObjectFormat | JsonSchemaFormat | None = None
    if isinstance(fmt, JsonSchemaTextFormat):
        spec = JsonSchemaSpec(
            name=fmt.name, description=fmt.description, schema_=fmt.schema_, strict=fmt.strict
        )
        response_format = JsonSchemaFormat(type="json_schema", json_schema=spec)
    elif isinstance(fmt, JsonObjectFormat):
        response_format = fmt
    tools = None
    if body.tools is not None:
        tools = [
            Tool(
                type="function",
                function=FunctionDef(
                    name=t.name, description=t.description, parameters=t.parameters, strict=t.strict
                ),
            )
            for t in body.tools
        ]
    choice: ToolChoice | None = None
    if isinstance(body.tool_choice, FunctionChoice):
        named = NamedFunction(name=body.tool_choice.name)
        choice = NamedToolChoice(type="function", function=named)
    else:
        choice = body.tool_choice
    return SamplingFields(
        **sampler,
        max_tokens=body.max_output_tokens,
        logprobs=(body.top_logprobs or 0) if body.wants_logprobs() else None,
        response_format=response_format,
        tools=tools,
        tool_choice=choice,
    )


def _echo(body: ResponsesBody) -> dict[str, Any]:
    """What the response object repeats of its request, kept with the job."""
    tools = [t.model_dump() for t in body.tools or ()]
    choice = body.tool_choice
    if choice is None:
        choice = "auto" if tools else "none"
    text = body.text or TextConfig()
    return {
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "tools": tools,
        "tool_choice": choice if isinstance(choice, str) else choice.model_dump(),
        "parallel_tool_calls": body.parallel_tool_calls,
        "text": text.model_dump(by_alias=True, exclude_none=True),
        "top_logprobs": body.top_logprobs,
        "logprobs": body.wants_logprobs(),
        "previous_response_id": body.previous_response_id,
        "store": body.store,
        "background": body.background,
        "user": body.user,
        "safety_identifier": body.safety_identifier,
        "prompt_cache_key": body.prompt_cache_key,
    }


# The chat request's names of what a Responses request names otherwise, for errors.
_RENAMES = (
    (re.compile(r"\bresponse_format\.json_schema\.schema\b"), "text.format.schema"),
    (re.compile(r"\bresponse_format\b"), "text.format"),
    (re.compile(r"\btools\.(\d+)\.function\.parameters\b"), r"tools.\1.parameters"),
    (re.compile(r"\btool_choice\.function\.name\b"), "tool_choice.name"),
    (re.compile(r"\bmax_tokens\b"), "max_output_tokens"),
    (re.compile(r"\bmessages(\.\d+(\.\w+)?)?\b"), "input"),
)


def _in_responses_terms(exc: InvalidRequest) -> InvalidRequest:
    def renamed(text: str) -> str:
        for pattern, name in _RENAMES:
            text = pattern.sub(name, text)
        return text

    param = renamed(exc.param) if exc.param is not None else None
    return InvalidRequest(renamed(exc.message), param=param, code=exc.code)


# A response's status for each state of its job (a succeeded one that ran out of
# tokens is `incomplete`).
_STATUSES = {
    JobStatus.QUEUED: "queued",
    JobStatus.RUNNING: "in_progress",
    JobStatus.SUCCEEDED: "completed",
    JobStatus.FAILED: "failed",
    JobStatus.CANCELLED: "cancelled",
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class ResponseState:
    """What a response object is rendered from: a job, or a batch line's result row."""

    job_id: str
    status: JobStatus
    model: str
    created_at: datetime
    finished_at: datetime | None
    sampling: Mapping[str, Any]
    echo: Mapping[str, Any]
    metadata: Mapping[str, Any]
    choices: Sequence[Mapping[str, Any]] | None
    prompt_tokens: int
    completion_tokens: int | None
    error: Mapping[str, str] | None

    @classmethod
    def of_job(cls, job: Job) -> Self:
        assert job.response is not None, "a job made by the Responses API"
        return cls(
            job_id=job.id,
            status=job.status,
            model=job.model,
            created_at=job.created_at,
            finished_at=job.finished_at,
            sampling=job.sampling.to_dict(),
            echo=job.response,
            metadata=job.metadata,
            choices=[c.to_dict() for c in job.result.choices] if job.result else None,
            prompt_tokens=job.prompt_tokens,
            completion_tokens=sum(c.completion_tokens for c in job.result.choices)
            if job.result
            else None,
            error=job.error.to_dict() if job.error else None,
        )


def response_object(state: ResponseState) -> dict[str, Any]:
    """The `response` a client gets: OpenAI's shape, field by field."""
    echo = state.echo
    incomplete = False
    output: list[dict[str, Any]] = []
    if state.choices:
        choice = state.choices[0]
        incomplete = choice.get("finish_reason") == "length"
        output = output_items(
            state.job_id, choice, status="incomplete" if incomplete else "completed"
        )
    status = _STATUSES[state.status]
    if state.status is JobStatus.SUCCEEDED and incomplete:
        status = "incomplete"
    usage = None
    if state.choices is not None:
        usage = response_usage(state.prompt_tokens, state.completion_tokens or 0)
    error = None
    if state.status is JobStatus.FAILED:
        reason = state.error or {"code": "failed", "message": "the request failed"}
        error = {"code": "server_error", "message": f"{reason['code']}: {reason['message']}"}
    ended = state.finished_at if state.status.is_terminal else None
    return {
        "id": response_id(state.job_id),
        "object": "response",
        "created_at": int(state.created_at.timestamp()),
        "status": status,
        "completed_at": int(ended.timestamp()) if ended and status == "completed" else None,
        "background": echo.get("background", False),
        "error": error,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": echo.get("instructions"),
        "max_output_tokens": echo.get("max_output_tokens"),
        "metadata": dict(state.metadata),
        "model": state.model,
        "output": output,
        "parallel_tool_calls": echo.get("parallel_tool_calls", True),
        "previous_response_id": echo.get("previous_response_id"),
        "service_tier": "default",
        "store": echo.get("store", True),
        "temperature": state.sampling.get("temperature", 1.0),
        "text": echo.get("text", {"format": {"type": "text"}}),
        "tool_choice": echo.get("tool_choice", "none"),
        "tools": list(echo.get("tools", [])),
        "top_logprobs": echo.get("top_logprobs"),
        "top_p": state.sampling.get("top_p", 1.0),
        "truncation": "disabled",
        "usage": usage,
        "user": echo.get("user"),
        "safety_identifier": echo.get("safety_identifier"),
        "prompt_cache_key": echo.get("prompt_cache_key"),
    }


def response_usage(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    }


def output_items(
    job_id: str, choice: Mapping[str, Any], *, status: str = "completed"
) -> list[dict[str, Any]]:
    """A finished choice as output items: its message (if it said anything or called
    nothing), then its function calls."""
    calls = choice.get("tool_calls") or []
    items = []
    if choice["text"] or not calls:
        items.append(message_item(job_id, choice["text"], choice.get("logprobs"), status=status))
    items.extend(function_call_item(job_id, i, call) for i, call in enumerate(calls))
    return items


def message_item(
    job_id: str,
    text: str | None,
    logprobs: list[dict[str, Any]] | None,
    *,
    status: str = "completed",
) -> dict[str, Any]:
    """The assistant's message; without `text`, as it starts (no content yet)."""
    suffix = job_id.removeprefix(JOB_ID_PREFIX)
    content = [] if text is None else [output_text(text, logprobs)]
    item_id = f"msg_{suffix}"
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": content,
    }


def output_text(text: str, logprobs: list[dict[str, Any]] | None) -> dict[str, Any]:
    return {
        "type": "output_text",
        "text": text,
        "annotations": [],
        "logprobs": response_logprobs(logprobs),
    }


def response_logprobs(entries: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    rendered = chat_logprobs(entries)
    return [] if rendered is None else rendered["content"]


def function_call_item(
    job_id: str, index: int, call: Mapping[str, Any], *, arguments: str | None = None
) -> dict[str, Any]:
    """One function call; with `arguments` given, as it starts streaming."""
    suffix = job_id.removeprefix(JOB_ID_PREFIX)
    return {
        "id": f"fc_{suffix}_{index}",
        "type": "function_call",
        "call_id": call["id"],
        "name": call["name"],
        "arguments": call["arguments"] if arguments is None else arguments,
        "status": "completed" if arguments is None else "in_progress",
    }

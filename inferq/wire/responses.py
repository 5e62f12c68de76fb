"""OpenAI's Responses API (`/v1/responses`): a request (its body is
`inferq.wire.response_bodies`), online or a batch-file line, made into a chat job. The
`response` object rendered from the job is `inferq.wire.response_objects`; its stream
events, `api/response_events.py`.

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
from collections.abc import Mapping
from typing import Any

from inferq.constants import JOB_ID_PREFIX
from inferq.domain.jobs import Job, JobSpec, JobStatus, ServiceTier
from inferq.exceptions import InvalidRequest
from inferq.wire.messages import CalledFunction, ChatMessage, MessageToolCall
from inferq.wire.response_bodies import (
    RESPONSE_ID_PREFIX,
    SAMPLER_NAMES,
    FunctionCallOutputItem,
    FunctionChoice,
    JsonSchemaTextFormat,
    MessageItem,
    ResponsesBody,
    TextConfig,
)
from inferq.wire.sampling_fields import SamplingFields
from inferq.wire.structured import (
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
from inferq.wire.validation import JobValidator, PreparedRequest

# A response's status for each state of its job (a succeeded one that ran out of
# tokens is `incomplete`).
RESPONSE_STATUSES = {
    JobStatus.QUEUED: "queued",
    JobStatus.RUNNING: "in_progress",
    JobStatus.SUCCEEDED: "completed",
    JobStatus.FAILED: "failed",
    JobStatus.CANCELLED: "cancelled",
}


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
    tier = ServiceTier.asked((prepared.response or {}).get("service_tier"))
    try:
        return dataclasses.replace(validator.finish(prepared, token_ids), priority=tier.priority)
    except InvalidRequest as exc:
        raise _in_responses_terms(exc) from exc


def check_previous(previous: Job, resp_id: str) -> None:
    """A response can continue `previous` only once it has completed."""
    if previous.status is not JobStatus.SUCCEEDED:
        state = RESPONSE_STATUSES[previous.status]
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
    sampler = body.model_dump(include=SAMPLER_NAMES, exclude_unset=True)
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
        parallel_tool_calls=body.parallel_tool_calls,
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
        "service_tier": ServiceTier.asked(body.service_tier).value,
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

"""Anthropic's turns and tools as chat turns and tools (OpenAI's shape, which the chat
template and the tool-call reading take): a `tool_use` block is an assistant's tool call,
a `tool_result` block a `tool` turn answering it, a tool a function."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import ValidationError

from inferq.exceptions import InvalidRequest
from inferq.wire.messages import CalledFunction, ChatMessage, MessageToolCall
from inferq.wire.structured import NamedFunction, NamedToolChoice, Tool, ToolChoice

# Blocks that carry no text for the model and are dropped from a turn: an earlier turn's
# reasoning, which a model that does not reason never produced.
_DROPPED_BLOCKS = frozenset({"thinking", "redacted_thinking"})
# Blocks a text model cannot read.
_UNREADABLE_BLOCKS = frozenset({"image", "document", "search_result", "container_upload"})

Turn = tuple[ChatMessage, str]  # a chat turn and the field it came from


def chat_turns(
    role: Literal["user", "assistant"], content: str | list[dict[str, Any]], param: str
) -> list[Turn]:
    """One Anthropic turn as chat turns: a user's tool results come first, each a `tool`
    turn, then its text; an assistant's text and tool calls are one turn."""
    if isinstance(content, str):
        return [(ChatMessage(role=role, content=content), param)]
    texts: list[str] = []
    calls: list[MessageToolCall] = []
    results: list[Turn] = []
    for j, block in enumerate(content):
        where = f"{param}.{j}"
        kind = block.get("type")
        if kind == "tool_use" and role == "assistant":
            calls.append(_call(block, where))
        elif kind == "tool_result" and role == "user":
            results.append((_result(block, where), where))
        elif kind in _DROPPED_BLOCKS:
            continue
        else:
            texts.append(block_text(block, where))
    text = "".join(texts)
    if role == "assistant":
        content_ = (text or None) if calls else text
        return [(ChatMessage(role=role, content=content_, tool_calls=calls or None), param)]
    if results and not texts:
        return results
    return [*results, (ChatMessage(role=role, content=text), param)]


def block_text(block: dict[str, Any], where: str) -> str:
    """A text block's text; any other block is refused, naming it."""
    kind = block.get("type")
    if kind == "text" and isinstance(block.get("text"), str):
        return str(block["text"])
    if kind in _UNREADABLE_BLOCKS:
        raise InvalidRequest(
            f"{where} is a {kind} block, but this model reads text only: send text blocks",
            param=where,
        )
    if kind in ("tool_use", "tool_result"):
        turn = "an assistant" if kind == "tool_use" else "a user"
        raise InvalidRequest(f"{where}: a {kind} block belongs in {turn} turn", param=where)
    raise InvalidRequest(
        f"{where} must be a text block ({{'type': 'text', 'text': ...}}); got type {kind!r}",
        param=where,
    )


def _call(block: dict[str, Any], where: str) -> MessageToolCall:
    call_id, name, given = block.get("id"), block.get("name"), block.get("input", {})
    if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(given, dict):
        raise InvalidRequest(
            f"{where}: a tool_use block needs an `id`, a `name` and an `input` object",
            param=where,
        )
    function = CalledFunction(name=name, arguments=json.dumps(given, ensure_ascii=False))
    return MessageToolCall(id=call_id, type="function", function=function)


def _result(block: dict[str, Any], where: str) -> ChatMessage:
    call_id, content = block.get("tool_use_id"), block.get("content", "")
    if not isinstance(call_id, str):
        raise InvalidRequest(f"{where}: a tool_result block needs its `tool_use_id`", param=where)
    if isinstance(content, list):
        text = "".join(
            block_text(part, f"{where}.content.{k}")
            for k, part in enumerate(content)
            if isinstance(part, dict)
        )
    elif isinstance(content, str):
        text = content
    else:
        raise InvalidRequest(f"{where}: content must be text or text blocks", param=where)
    return ChatMessage(role="tool", content=text, tool_call_id=call_id)


def chat_tools(
    tools: list[dict[str, Any]] | None, choice: dict[str, Any] | None
) -> tuple[list[Tool] | None, ToolChoice | None]:
    """Anthropic's tools and tool_choice as functions and a chat tool_choice."""
    if not tools:
        return None, None
    functions = [_function(tool, f"tools.{i}") for i, tool in enumerate(tools)]
    return functions, _choice(choice)


def _function(tool: dict[str, Any], where: str) -> Tool:
    if tool.get("type") not in (None, "custom"):
        raise InvalidRequest(
            f"{where} is a {tool.get('type')} tool, which runs on Anthropic's servers: only "
            "tools of your own (name, description, input_schema) are supported",
            param=where,
        )
    function = {
        "name": tool.get("name"),
        "description": tool.get("description"),
        "parameters": tool.get("input_schema"),
    }
    try:
        return Tool.model_validate({"type": "function", "function": function})
    except ValidationError as exc:
        first = exc.errors()[0]
        last = str(first["loc"][-1]) if first["loc"] else "name"
        field = {"parameters": "input_schema"}.get(last, last)
        raise InvalidRequest(f"{where}.{field}: {first['msg']}", param=f"{where}.{field}") from exc


def _choice(choice: dict[str, Any] | None) -> ToolChoice:
    kind = (choice or {"type": "auto"}).get("type")
    if kind == "tool" and choice is not None and isinstance(choice.get("name"), str):
        return NamedToolChoice(type="function", function=NamedFunction(name=choice["name"]))
    chat: dict[Any, ToolChoice] = {"auto": "auto", "any": "required", "none": "none"}
    if kind not in chat:
        raise InvalidRequest(
            "tool_choice must be {'type': 'auto'}, {'type': 'any'}, {'type': 'none'} or "
            "{'type': 'tool', 'name': ...}",
            param="tool_choice",
        )
    return chat[kind]

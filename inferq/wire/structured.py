"""Structured outputs and tool calls: the request fields that constrain what the engine may
generate (OpenAI's `response_format`, `tools` and `tool_choice`; vLLM's
`structured_outputs`), checked at submission and turned into the constraint the engine
enforces with vLLM's structured outputs (xgrammar).

The API imports neither vLLM nor xgrammar (they need torch). A JSON schema is checked
against its meta-schema and against the features xgrammar cannot enforce, once per
distinct schema: the lines of a batch that share one check it once, and the engine's
grammar compiler caches it the same way.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Self

from jsonschema import SchemaError
from jsonschema.validators import validator_for
from pydantic import BaseModel, ConfigDict, Field, model_validator

from inferq.exceptions import InvalidRequest

MAX_TOOLS = 128  # OpenAI's limit
_NAME = r"^[A-Za-z0-9_-]{1,64}$"
# A JSON schema for "any object": the arguments of a function that declares none.
ANY_OBJECT: dict[str, Any] = {"type": "object"}


class JsonSchemaSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = Field(pattern=_NAME)
    description: str | None = None
    schema_: dict[str, Any] = Field(
        default_factory=dict, alias="schema", description="A JSON Schema the output must match."
    )
    strict: bool | None = Field(
        None, description="Accepted for compatibility: the schema is always enforced."
    )


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]


class JsonObjectFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["json_object"]


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


ResponseFormat = Annotated[
    TextFormat | JsonObjectFormat | JsonSchemaFormat, Field(discriminator="type")
]


class StructuredOutputs(BaseModel):
    """vLLM's extension: exactly one of a JSON schema, a regex, a list of choices or a
    grammar (EBNF as xgrammar reads it, or Lark)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    json_: dict[str, Any] | None = Field(None, alias="json")
    regex: str | None = Field(None, min_length=1)
    choice: list[Annotated[str, Field(min_length=1)]] | None = Field(None, min_length=1)
    grammar: str | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _one(self) -> Self:
        given = [n for n in ("json_", "regex", "choice", "grammar") if getattr(self, n) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of json, regex, choice and grammar")
        return self


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = Field(
        None, description="A JSON Schema of the arguments; any object if left out."
    )
    strict: bool | None = None


class Tool(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    function: FunctionDef


class NamedFunction(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class OutputFields(BaseModel):
    """What a request may ask of its output's shape, in jobs, batch lines and online
    requests alike."""

    model_config = ConfigDict(extra="forbid")

    response_format: ResponseFormat | None = Field(
        None, description="`text`, `json_object`, or `json_schema` with a schema to match."
    )
    structured_outputs: StructuredOutputs | None = Field(
        None, description="vLLM's extension: `json`, `regex`, `choice` or `grammar`."
    )
    tools: list[Tool] | None = Field(
        None, max_length=MAX_TOOLS, description="Functions the model may call (chat only)."
    )
    tool_choice: ToolChoice | None = Field(
        None,
        description="`auto` (the default with tools), `none`, `required`, or "
        '`{"type": "function", "function": {"name": ...}}` to force that call.',
    )
    parallel_tool_calls: bool | None = Field(
        None, description="false: at most one tool call per choice (the first one made)."
    )


class OutputPlan(BaseModel):
    """What `plan` decided: the engine's constraint, the tools to render in the prompt, and
    how to read tool calls out of the output."""

    model_config = ConfigDict(frozen=True)

    structured: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None


def plan(fields: OutputFields, *, chat: bool) -> OutputPlan:
    """Check the output fields of a request; `InvalidRequest` names the field at fault."""
    structured = _structured(fields)
    if fields.tools is None:
        if fields.tool_choice is not None:
            raise InvalidRequest("tool_choice needs `tools`", param="tool_choice")
        return OutputPlan(structured=structured)
    if not chat:
        raise InvalidRequest("tools need a chat (`messages`), not a `prompt`", param="tools")
    single = fields.parallel_tool_calls is False
    return _tool_plan(fields.tools, fields.tool_choice or "auto", structured, single=single)


def _tool_plan(
    declared: list[Tool], choice: ToolChoice, structured: dict[str, Any] | None, *, single: bool
) -> OutputPlan:
    names = [t.function.name for t in declared]
    if len(set(names)) != len(names):
        raise InvalidRequest("each tool needs its own function name", param="tools")
    for i, tool in enumerate(declared):
        if tool.function.parameters is not None:
            check_schema(tool.function.parameters, f"tools.{i}.function.parameters")
    tools = [t.model_dump(exclude_none=True) for t in declared]
    if choice == "none":
        return OutputPlan(structured=structured, tools=tools)
    # One call at most: the parser's calls are cut to the first (`worker.engine.tool_calls`).
    once = {"parallel": False} if single else {}
    if choice == "auto":
        return OutputPlan(structured=structured, tools=tools, tool_choice={"type": "auto", **once})
    if structured is not None:
        raise InvalidRequest(
            "a forced tool call already fixes the output's shape: leave out "
            "response_format and structured_outputs, or use tool_choice auto",
            param="tool_choice",
        )
    if choice == "required":
        return OutputPlan(
            structured={"json": _calls_schema(declared, single=single)},
            tools=tools,
            tool_choice={"type": "required", **once},
        )
    assert isinstance(choice, NamedToolChoice)
    named = next((t for t in declared if t.function.name == choice.function.name), None)
    if named is None:
        raise InvalidRequest(
            f"tool_choice names function {choice.function.name!r}, which is not in `tools`",
            param="tool_choice.function.name",
        )
    return OutputPlan(
        structured={"json": named.function.parameters or ANY_OBJECT},
        tools=tools,
        tool_choice={"type": "function", "name": named.function.name},
    )


def _structured(fields: OutputFields) -> dict[str, Any] | None:
    asked = fields.response_format
    extension = fields.structured_outputs
    if extension is not None and asked is not None and not isinstance(asked, TextFormat):
        raise InvalidRequest(
            "give one of response_format and structured_outputs", param="structured_outputs"
        )
    if isinstance(asked, JsonObjectFormat):
        return {"json_object": True}
    if isinstance(asked, JsonSchemaFormat):
        check_schema(asked.json_schema.schema_, "response_format.json_schema.schema")
        return {"json": asked.json_schema.schema_}
    return None if extension is None else _extension(extension)


def _extension(extension: StructuredOutputs) -> dict[str, Any]:
    if extension.json_ is not None:
        check_schema(extension.json_, "structured_outputs.json")
        return {"json": extension.json_}
    if extension.regex is not None:
        _check_regex(extension.regex)
        return {"regex": extension.regex}
    if extension.choice is not None:
        return {"choice": list(extension.choice)}
    assert extension.grammar is not None
    _check_grammar(extension.grammar)
    return {"grammar": extension.grammar}


def _calls_schema(tools: list[Tool], *, single: bool) -> dict[str, Any]:
    """The output of `tool_choice: required`: a JSON array of one or more calls (exactly
    one if `single`), each a declared function's name and its arguments (vLLM's server
    asks for the same)."""
    return {
        "type": "array",
        "minItems": 1,
        **({"maxItems": 1} if single else {}),
        "items": {
            "anyOf": [
                {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "enum": [t.function.name]},
                        "parameters": t.function.parameters or ANY_OBJECT,
                    },
                    "required": ["name", "parameters"],
                }
                for t in tools
            ]
        },
    }


def check_schema(schema: Mapping[str, Any], param: str) -> None:
    """A JSON schema the engine can enforce, or `InvalidRequest` naming `param`."""
    try:
        problem = _schema_problem(json.dumps(schema, sort_keys=True))
    except RecursionError:
        problem = "nested too deeply to be checked"
    if problem is not None:
        raise InvalidRequest(f"{param}: {problem}", param=param)


@functools.lru_cache(maxsize=256)
def _schema_problem(text: str) -> str | None:
    schema = json.loads(text)
    if not isinstance(schema, dict):
        return "a JSON schema must be an object"
    try:
        validator_for(schema).check_schema(schema)
        return _unsupported(schema, "")
    except RecursionError:
        return "nested too deeply to be checked"
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.path)
        return f"not a valid JSON schema{f' at {where}' if where else ''}: {exc.message}"


# What xgrammar (vLLM's structured-output backend) cannot enforce: vLLM 0.32 refuses these
# (`has_xgrammar_unsupported_json_features`), so they are refused here, before queueing.
_UNSUPPORTED_NUMBER = ("multipleOf",)
_UNSUPPORTED_ARRAY = ("uniqueItems", "contains", "minContains", "maxContains")
_STRING_FORMATS = frozenset(
    {
        "email",
        "date",
        "time",
        "date-time",
        "duration",
        "ipv4",
        "ipv6",
        "hostname",
        "uuid",
        "uri",
        "uri-reference",
        "uri-template",
        "json-pointer",
        "relative-json-pointer",
    }
)


def _unsupported(node: Any, where: str) -> str | None:
    """The first feature in `node` (and below it) the grammar backend cannot enforce."""
    if isinstance(node, list):
        children = [(f"{where}/{i}", item) for i, item in enumerate(node)]
    elif isinstance(node, dict):
        if (problem := _node_problem(node, where or "/")) is not None:
            return problem
        # The values of these are data, not schemas.
        data = ("enum", "const", "default", "examples")
        children = [(f"{where}/{k}", v) for k, v in node.items() if k not in data]
    else:
        return None
    for path, child in children:
        if (problem := _unsupported(child, path)) is not None:
            return problem
    return None


def _node_problem(node: dict[str, Any], at: str) -> str | None:
    raw = node.get("type")
    listed = raw if isinstance(raw, list) else [raw]
    types = {t for t in listed if isinstance(t, str)}
    unsupported = [k for k in _UNSUPPORTED_NUMBER if types & {"number", "integer"} and k in node]
    unsupported += [k for k in _UNSUPPORTED_ARRAY if "array" in types and k in node]
    if unsupported:
        return f"{unsupported[0]} (at {at}) is not supported by the engine's grammar backend"
    if "string" not in types:
        return None
    fmt = node.get("format")
    if fmt is not None and fmt not in _STRING_FORMATS:
        return f"string format {fmt!r} (at {at}) is not supported; use a pattern instead"
    if ("pattern" in node or "format" in node) and ("minLength" in node or "maxLength" in node):
        return (
            f"a string with both a pattern or format and a length (at {at}) is not "
            "supported: bound the length inside the pattern"
        )
    return None


# Lookaround and back-references cannot become a grammar.
_NON_REGULAR = re.compile(r"\(\?[=!<]|\\[1-9]")


def _check_regex(pattern: str) -> None:
    param = "structured_outputs.regex"
    try:
        re.compile(pattern)
    except re.error as exc:
        raise InvalidRequest(f"{param} is not a valid regex: {exc}", param=param) from exc
    if "\x00" in pattern or _NON_REGULAR.search(pattern):
        raise InvalidRequest(
            f"{param} uses lookaround, a back-reference or NUL, which the engine cannot enforce",
            param=param,
        )


# An EBNF grammar (xgrammar's dialect) starts from `root`; a Lark one from `start`.
_ROOT_RULE = re.compile(r"^\s*(root\s*::=|\??start\s*:)", re.MULTILINE)


def _check_grammar(grammar: str) -> None:
    if not _ROOT_RULE.search(grammar):
        raise InvalidRequest(
            "structured_outputs.grammar needs a `root ::= ...` rule (EBNF) or a "
            "`start: ...` rule (Lark)",
            param="structured_outputs.grammar",
        )

"""vLLM's tool-call parser for the model family (INFERQ_TOOL_CALL_PARSER), which reads the
calls a model made on its own (`tool_choice: auto`) out of its finished output.

Part of the engine adapter: with `vllm_engine`, the only modules that import vLLM.
"""

from __future__ import annotations

import logging
from typing import Any

from vllm import LLM
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.tool_parsers import ToolParserManager

log = logging.getLogger(__name__)


class AutoToolParser:
    """`parse(text)` gives the text besides the calls and the calls as (name, arguments).

    A parser that does not fit the model (its markers are not in the tokenizer) is said
    once in the log at start; the outputs of such chats then stay text."""

    def __init__(self, name: str, llm: LLM) -> None:
        self._parser: Any = None
        try:
            parser_type = ToolParserManager.get_tool_parser(name)
            self._parser = parser_type(llm.get_tokenizer())
        except Exception as exc:  # noqa: BLE001  # any failure: the setting is wrong for this model
            log.warning(
                "INFERQ_TOOL_CALL_PARSER=%s does not fit this model (%s): chats with tools "
                "and tool_choice auto get their output as text; set it to the model "
                "family's parser",
                name,
                exc,
            )
        # The parsers read the request only for its tools' names, where at all.
        self._request = ChatCompletionRequest(
            model="inferq", messages=[{"role": "user", "content": ""}]
        )

    def parse(self, text: str) -> tuple[str, list[tuple[str, str]]]:
        if self._parser is None:
            return text, []
        try:
            found = self._parser.extract_tool_calls(text, self._request)
        except Exception:  # a parser bug must not fail the step: the output stays text
            log.exception("the tool-call parser failed on an output; it stays text")
            return text, []
        if not found.tools_called:
            return text, []
        calls = [(c.function.name, c.function.arguments) for c in found.tool_calls]
        return found.content or "", calls

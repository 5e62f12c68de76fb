"""The compatibility page's tables, from the request models themselves: for each endpoint a
row per field it declares, honoured, ignored or refused (the field's own marker, see
`inferq.wire.compat`), what it does here, and where that differs from OpenAI and from
vLLM's server (`DIFFERENCES`, checked against the models so a note cannot outlive its
field)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from api.schemas import JobCreate
from inferq.wire.batch_lines import BatchLine
from inferq.wire.compat import IGNORED, REFUSED_VALUES, compat_of
from inferq.wire.embeddings import EmbeddingBody
from inferq.wire.openai_bodies import ChatBody, CompletionBody
from inferq.wire.response_bodies import ResponsesBody

ENDPOINTS: tuple[tuple[str, type[BaseModel]], ...] = (
    ("/v1/chat/completions", ChatBody),
    ("/v1/completions", CompletionBody),
    ("/v1/responses", ResponsesBody),
    ("/v1/embeddings", EmbeddingBody),
    ("/v1/jobs", JobCreate),
    ("A batch file's line", BatchLine),
)

_SERVE_SAMPLING = "vLLM's server takes it too (an extension to OpenAI's API)."
# Where a field differs from OpenAI or from `vllm serve`, by the model that declares it.
DIFFERENCES: dict[type[BaseModel], dict[str, str]] = {
    ChatBody: {
        "service_tier": "OpenAI bills tiers differently; here they only order the work. "
        "`flex` runs behind single jobs inside the engine but is not counted in the batch "
        "fair share. vLLM's server ignores it.",
        "store": "OpenAI keeps the completion for its dashboard and evals; inferq keeps "
        "every request as a job whatever it says.",
        "metadata": "OpenAI stores it with the completion; here `/v1/jobs` takes its own.",
        "modalities": "OpenAI can answer in audio; vLLM's server ignores the field.",
        "reasoning_effort": "As vLLM's server, for models whose chat template reads it; "
        "OpenAI's non-reasoning models refuse it.",
        "logit_bias": "Keys are token ids of the served model's tokenizer, as in vLLM; an id "
        "outside its vocabulary is a 422.",
        "parallel_tool_calls": "`false` keeps the first call a choice makes; with "
        "`tool_choice: required` the grammar allows exactly one.",
        "n": "Above 1 needs a temperature above 0 (vLLM refuses greedy sampling with n > 1).",
        "min_tokens": _SERVE_SAMPLING,
        "skip_special_tokens": _SERVE_SAMPLING,
        "spaces_between_special_tokens": _SERVE_SAMPLING,
        "include_stop_str_in_output": _SERVE_SAMPLING,
        "stop_token_ids": _SERVE_SAMPLING,
        "allowed_token_ids": _SERVE_SAMPLING,
        "bad_words": _SERVE_SAMPLING,
        "truncate_prompt_tokens": _SERVE_SAMPLING,
        "add_generation_prompt": _SERVE_SAMPLING,
        "continue_final_message": _SERVE_SAMPLING,
        "chat_template_kwargs": "vLLM's server takes it too; the names inferq sets itself "
        "(`tools`, `add_generation_prompt`, ...) are refused there.",
        "use_beam_search": "vLLM's server runs beam search; inferq refuses it.",
        "prompt_logprobs": "As vLLM's server: on the chat completion (on each choice of a "
        "text completion); refused above 0 with `stream: true` there too. OpenAI has no such "
        "field.",
        "top_k": _SERVE_SAMPLING,
        "min_p": _SERVE_SAMPLING,
        "repetition_penalty": _SERVE_SAMPLING,
        "ignore_eos": _SERVE_SAMPLING,
        "structured_outputs": _SERVE_SAMPLING,
    },
    CompletionBody: {
        "prompt": "Streamed, several prompts come one after another (not interleaved); a "
        "batch line takes one prompt, where OpenAI's take several.",
        "echo": "The prompt is detokenized from its token ids (special tokens left out "
        "unless `skip_special_tokens` is false); it cannot be combined with `logprobs`, "
        "which vLLM's server answers with the prompt's logprobs too.",
        "suffix": "OpenAI's older models insert text; vLLM's server refuses it too.",
    },
    ResponsesBody: {
        "store": "Honoured: a stored response is read back by its id.",
        "metadata": "Kept and echoed in the response, as OpenAI's.",
        "service_tier": "As on chat completions.",
    },
    EmbeddingBody: {
        "messages": "vLLM's server embeds a chat rendered with the template; inferq refuses it.",
        "model": "Optional when one embedding model is served.",
    },
    JobCreate: {
        "priority": "inferq's own: 0 to 9 among your single jobs.",
        "metadata": "inferq's own: kept with the job and sent with its webhooks.",
    },
    BatchLine: {
        "body": "Its fields are those of the line's endpoint, above, but for two: a list "
        "of several prompts is refused (one line, one prompt), and `service_tier` changes "
        "nothing (every line runs as batch work).",
    },
}
# Fields shared by every shape that takes them, noted once on the chat table.
_SHARED_NOTES = ChatBody


def stale_notes() -> list[str]:
    """Notes about fields their model no longer declares."""
    return [
        f"{model.__name__}.{name}"
        for model, notes in DIFFERENCES.items()
        for name in notes
        if name not in model.model_fields
    ]


def compatibility_markdown() -> str:
    """One table per endpoint, a row per field, then how unknown fields are treated."""
    if stale := stale_notes():
        raise ValueError("docs/compatibility.md: notes on no field: " + ", ".join(stale))
    out: list[str] = []
    for endpoint, model in ENDPOINTS:
        out += [
            f"### `{endpoint}`" if endpoint.startswith("/") else f"### {endpoint}",
            "",
            "| field | here | what it does | differs from OpenAI or `vllm serve` |",
            "|---|---|---|---|",
        ]
        notes = {**DIFFERENCES[_SHARED_NOTES], **DIFFERENCES.get(model, {})}
        # What a request must give first, then the rest as declared.
        fields = sorted(model.model_fields.items(), key=lambda item: not item[1].is_required())
        for name, field in fields:
            wire = field.alias or name
            what = field.description or "As in OpenAI's API."
            out.append(
                f"| `{wire}` | {_treatment(field.json_schema_extra)} | "
                f"{_cell(what)} | {_cell(notes.get(wire, ''))} |"
            )
        out += [
            "| any other field | ignored | Accepted and ignored; its name is logged once. | "
            "vLLM's server does the same; OpenAI refuses it. |",
            "",
        ]
    return "\n".join(out)


_TREATMENTS = {IGNORED: "ignored", REFUSED_VALUES: "refused (some values)", None: "honoured"}


def _treatment(extra: Any) -> str:
    return _TREATMENTS[compat_of(extra)]


def _cell(text: str | None) -> str:
    return " ".join((text or "").split()).replace("|", "\\|")

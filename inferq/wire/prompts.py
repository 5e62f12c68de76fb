"""Turning prompts and chat messages into token ids, the way vLLM would."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from inferq.exceptions import InvalidRequest


class _Tokenizer(Protocol):  # the slice of a Hugging Face tokenizer used here
    chat_template: Any

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, token_ids: list[int]) -> str: ...

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def __len__(self) -> int: ...


# Two threads importing transformers at once: the second can see it half made
# ("cannot import name 'AutoConfig'"), so its import goes one thread at a time.
_IMPORTING = threading.Lock()


def _transformers() -> Any:
    with _IMPORTING:
        import transformers  # slow import, kept off start-up

        transformers.AutoConfig, transformers.AutoTokenizer  # noqa: B018 - its lazy parts too
        return transformers


def preload() -> None:
    """Import what loading a tokenizer needs (transformers, slow to import), so that the
    first request to load a model's tokenizer does not wait for it. The API calls it in the
    background as it starts, before any worker registers its model."""
    _transformers()


def _template_errors() -> tuple[type[Exception], ...]:
    """What a chat template raises for messages it refuses (its `raise_exception`, or a
    `continue_final_message` without a final message to continue)."""
    import jinja2  # comes with transformers

    return (jinja2.TemplateError, ValueError)


class PromptRenderer:
    """Tokenizes prompts with the model's tokenizer and renders chat messages with its
    chat template, so token counts here match the engine's exactly."""

    def __init__(self, tokenizer: _Tokenizer, *, context_len: int) -> None:
        self._tokenizer = tokenizer
        self.context_len = context_len
        # The Rust tokenizer is fast and thread-safe for plain encodes; a slow (Python)
        # tokenizer is not, so those calls go one at a time.
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._backend = backend
        self._lock = threading.Lock()

    @classmethod
    def load(cls, name: str, *, max_model_len: int | None) -> PromptRenderer:
        """Load the tokenizer (and, unless `max_model_len` is given, the model's context)."""
        transformers = _transformers()
        tokenizer = transformers.AutoTokenizer.from_pretrained(name)
        context_len = max_model_len
        if context_len is None:
            config = transformers.AutoConfig.from_pretrained(name)
            context_len = int(getattr(config, "max_position_embeddings", 0) or 0)
            if not context_len:
                raise InvalidRequest(f"cannot tell the context length of {name}: set max_model_len")
        return cls(tokenizer, context_len=context_len)

    def use_chat_template(self, template: str) -> None:
        """Render chats with `template` instead of the tokenizer's own."""
        self._tokenizer.chat_template = template

    @property
    def has_chat_template(self) -> bool:
        return bool(self._tokenizer.chat_template)

    @property
    def vocab_size(self) -> int:
        """How many token ids there are, added tokens included: valid ids are below it."""
        return len(self._tokenizer)

    def _encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        if self._backend is not None:
            return list(self._backend.encode(text, add_special_tokens=add_special_tokens).ids)
        with self._lock:
            return self._tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def chat_text(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        tools: Sequence[dict[str, Any]] | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> str:
        """Chat messages (and the tools the model may call, in OpenAI's shape) rendered
        with the chat template (not yet tokenized); `options` are the template's own
        (vLLM's `add_generation_prompt`, `continue_final_message`, `chat_template_kwargs`).
        A template that refuses the messages is an `InvalidRequest`."""
        if not self.has_chat_template:
            raise InvalidRequest(
                "this model has no chat template: send `prompt` instead of `messages`",
                param="messages",
            )
        asked = {"add_generation_prompt": True, **(options or {})}
        with self._lock:  # jinja rendering inside transformers is not documented thread-safe
            try:
                text = self._tokenizer.apply_chat_template(
                    list(messages),
                    tools=None if tools is None else list(tools),
                    tokenize=False,
                    **asked,
                )
            except _template_errors() as exc:
                raise InvalidRequest(
                    f"the model's chat template refused these messages: {exc}",
                    param="messages",
                ) from exc
        return str(text)

    def decode(self, token_ids: Sequence[int]) -> str:
        """The text of token ids, as the engine would detokenize them."""
        if self._backend is not None:
            return str(self._backend.decode(list(token_ids), skip_special_tokens=False))
        with self._lock:
            return self._tokenizer.decode(list(token_ids))

    def encode_many(self, texts: Sequence[str], *, add_special_tokens: bool) -> list[list[int]]:
        """Token ids of many texts at once (the Rust tokenizer spreads them over cores)."""
        if not texts:
            return []
        if self._backend is not None:
            # The fast variant leaves out character offsets, which nothing here needs.
            encodings = self._backend.encode_batch_fast(
                list(texts), add_special_tokens=add_special_tokens
            )
            return [e.ids for e in encodings]
        return [self._encode(t, add_special_tokens=add_special_tokens) for t in texts]

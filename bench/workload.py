"""The benchmark workloads, fixed by a seed: every system gets the same prompts and
generates the same number of tokens (`ignore_eos` with a drawn `max_tokens`).

Requests are chat completions (one user message): `vllm run-batch` serves no other
generation endpoint, and chat is what most batch files hold."""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

SEED = 20261121
CHAT_URL: Final = "/v1/chat/completions"
# Long-tailed lengths (log-normal), as in real traffic: most requests are short, a few
# are long. Medians and spreads in tokens, clipped to what the bench model's context holds.
PROMPT_MEDIAN, PROMPT_SIGMA, PROMPT_RANGE = 96, 0.8, (8, 1024)
OUTPUT_MEDIAN, OUTPUT_SIGMA, OUTPUT_RANGE = 48, 0.9, (4, 512)


@dataclass(frozen=True)
class Request:
    custom_id: str
    prompt: str
    max_tokens: int


def _lognormal(rng: random.Random, median: int, sigma: float, bounds: tuple[int, int]) -> int:
    low, high = bounds
    return max(low, min(high, round(rng.lognormvariate(0, sigma) * median)))


def bulk(tokenizer: Any, count: int, *, context: int, seed: int = SEED) -> list[Request]:
    """`count` requests whose prompts are `tokenizer` tokens drawn at random, decoded to
    text (so every system tokenizes the same text)."""
    rng = random.Random(seed)
    vocab = _vocabulary(tokenizer)
    requests = []
    for i in range(count):
        length = _lognormal(rng, PROMPT_MEDIAN, PROMPT_SIGMA, PROMPT_RANGE)
        text = tokenizer.decode([rng.choice(vocab) for _ in range(length)])
        # Decoded random tokens tokenize again into more tokens: measure the rendered chat,
        # so that prompt and output fit the context (vLLM would cut the output short;
        # inferq refuses the line).
        room = context - len(chat_token_ids(tokenizer, text))
        drawn = _lognormal(rng, OUTPUT_MEDIAN, OUTPUT_SIGMA, OUTPUT_RANGE)
        requests.append(Request(custom_id=f"r{i}", prompt=text, max_tokens=min(drawn, room)))
    return requests


def fixed(
    tokenizer: Any, count: int, *, prompt_tokens: int, max_tokens: int, seed: int = SEED
) -> list[Request]:
    """`count` requests whose prompts render to about `prompt_tokens` chat tokens, each
    asking for `max_tokens`."""
    rng = random.Random(seed)
    vocab = _vocabulary(tokenizer)
    frame = len(chat_token_ids(tokenizer, ""))
    # Random tokens decoded to text tokenize again into more: draw fewer, by the ratio seen.
    sample = tokenizer.decode([rng.choice(vocab) for _ in range(1000)])
    ratio = len(tokenizer.encode(sample, add_special_tokens=False)) / 1000
    drawn = max(1, round((prompt_tokens - frame) / ratio))
    return [
        Request(
            custom_id=f"r{i}",
            prompt=tokenizer.decode([rng.choice(vocab) for _ in range(drawn)]),
            max_tokens=max_tokens,
        )
        for i in range(count)
    ]


def _vocabulary(tokenizer: Any) -> list[int]:
    """The token ids prompts are drawn from: no special tokens, none that decodes to NUL
    (Postgres text cannot hold it, so inferq refuses it)."""
    specials = set(tokenizer.all_special_ids)
    return [
        i
        for i in range(tokenizer.vocab_size)
        if i not in specials and "\x00" not in tokenizer.decode([i])
    ]


def messages(request: Request) -> list[dict[str, str]]:
    return _user(request.prompt)


def chat_token_ids(tokenizer: Any, text: str) -> list[int]:
    """`text` as one user message, rendered with the chat template and tokenized."""
    ids: list[int] = tokenizer.apply_chat_template(
        _user(text), add_generation_prompt=True, tokenize=True, return_dict=False
    )
    return ids


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def body(request: Request, model: str) -> dict[str, Any]:
    """A chat completion request body, the same for every system."""
    return {
        "model": model,
        "messages": messages(request),
        "max_tokens": request.max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }


def write_batch_file(requests: list[Request], model: str, path: Path) -> Path:
    """The requests as OpenAI Batch JSONL for /v1/chat/completions."""
    with path.open("w") as out:
        for request in requests:
            line = {
                "custom_id": request.custom_id,
                "method": "POST",
                "url": CHAT_URL,
                "body": body(request, model),
            }
            out.write(json.dumps(line) + "\n")
    return path


def save(requests: list[Request], path: Path) -> Path:
    path.write_text(json.dumps([asdict(r) for r in requests]))
    return path


def load(path: Path) -> list[Request]:
    return [Request(**item) for item in json.loads(path.read_text())]

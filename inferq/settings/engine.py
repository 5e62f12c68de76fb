"""The engine's settings: the model, vLLM's arguments and the engine's own limits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import AliasChoices, BaseModel, ByteSize, Field, field_validator, model_validator
from pydantic_settings import NoDecode

DEFAULT_MODEL = "hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4"
# vLLM 0.32 sizes its LoRA buffers for these ranks only (vllm/config/lora.py).
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


class EngineSettings(BaseModel):
    """The model and vLLM's engine: what a GPU worker loads, and what the API learns of it
    (its names, tokenizer and context) from the worker's registration."""

    model: str = Field(DEFAULT_MODEL, description="Hugging Face id or local path of the model.")
    served_model_name: str | None = Field(
        None, description="Name clients use in `model`; defaults to `model`."
    )
    tokenizer: str | None = Field(None, description="Tokenizer id or path; defaults to `model`.")
    max_model_len: int | None = Field(
        None, ge=16, description="Context length in tokens; defaults to the model's own."
    )
    gpu_memory_utilization: float = Field(
        0.9, gt=0, le=1, description="Fraction of GPU memory vLLM may use (not used on a CPU)."
    )
    max_num_seqs: int = Field(
        256, ge=1, description="Most sequences in flight in the engine for batch lines."
    )
    interactive_seqs: int | None = Field(
        None,
        ge=0,
        description="Engine slots on top of max_num_seqs that only single jobs use, so one "
        "never waits for a full engine of batch lines; max_num_seqs / 8 (at least 1) if unset.",
    )
    kv_cache_memory_bytes: ByteSize | None = Field(
        None,
        description="KV-cache size (`4GiB`, `512MiB` or bytes). Unset: on a CPU, what "
        "max_num_seqs sequences of max_model_len need, at most half of what is free after the "
        "weights; on a "
        "GPU, what gpu_memory_utilization leaves after the weights.",
    )
    max_num_batched_tokens: int | None = Field(
        None, ge=1, description="Most tokens in one engine step; vLLM chooses when unset."
    )
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs one model is split across.")
    quantization: str | None = Field(
        None, description="vLLM quantization method (`awq`, `gptq`, ...); detected when unset."
    )
    dtype: str = Field(
        "auto", description="Activation dtype (`auto`, `bfloat16`, `float16`, `float32`)."
    )
    enable_prefix_caching: bool = Field(True, description="Reuse KV cache of shared prefixes.")
    enforce_eager: bool = Field(
        False, description="Skip CUDA graphs and compilation: slower, but starts sooner."
    )
    engine_seed: int = Field(0, description="Engine seed, for reproducible unseeded sampling.")
    tool_call_parser: str | None = Field(
        "llama3_json",
        description="vLLM's tool-call parser for the model family (`llama3_json`, `hermes`, "
        "`mistral`, ...), which reads calls out of chats with `tools` and `tool_choice` auto; "
        "`none` refuses tool_choice auto.",
    )
    engine_extra_args: dict[str, Any] = Field(
        default_factory=dict,
        description="Further vLLM engine arguments, as a JSON object.",
    )
    engine_nice: int = Field(
        0,
        ge=0,
        le=19,
        description="Nice value of vLLM's engine processes: higher gives the cores to the API, "
        "the worker's own threads, Redis and Postgres first when they need them. On a CPU, "
        "that trades a little of batch files' throughput for sooner first tokens under load "
        "(docs: Operations, Running on a CPU); 0 leaves the engine as started.",
    )
    engine_core_nice: int = Field(
        19,
        ge=0,
        le=19,
        description="Nice value of vLLM's engine core where the model runs in processes of "
        "its own (vLLM on a CPU): the core only schedules, and spins while the model runs, on "
        "cores the API, Redis and Postgres need. Higher lets their short work go first: sooner "
        "first tokens under load, at little cost to the engine (docs: Operations, Running on "
        "a CPU). 0 leaves the core as started. A core that "
        "runs the model itself (one GPU) is left alone.",
    )
    engine_group_nice: int = Field(
        0,
        ge=0,
        le=19,
        description="Nice value of the worker's scheduling group (its session, where Linux "
        "groups tasks by session and the worker leads its own) where the model runs in "
        "processes of its own (vLLM on a CPU). The kernel shares the cores between groups "
        "first, and the engine's processes spin while they wait for each other: higher lets "
        "the API, Redis and Postgres go first, for sooner first tokens under load at the cost "
        "of some of the engine's tokens/s when many streams run (docs: Operations, Running on "
        "a CPU). 0 leaves the group as it is.",
    )
    engine_step_timeout_s: float = Field(
        300,
        gt=0,
        description="An engine step longer than this means the engine is stuck: it restarts.",
    )
    max_engine_deaths: int = Field(
        3, ge=1, description="Engine deaths a request may see before it fails as poison."
    )
    runner: Literal["generate", "pooling"] = Field(
        "generate",
        description="`generate` serves completions; `pooling` serves embeddings (`/v1/embeddings`) "
        "through vLLM's pooling runner.",
    )
    lora_adapters: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=dict,
        description="LoRA adapters of the model, each served as its own model name: "
        "`name=path-or-hf-id` pairs, comma-separated (or a JSON object).",
    )
    max_loras: int = Field(4, ge=1, description="Most LoRA adapters in one engine step.")
    max_lora_rank: int = Field(
        16,
        description="Largest LoRA rank an adapter may have: "
        + ", ".join(map(str, LORA_RANKS))
        + " (what vLLM allows).",
    )
    engine: Literal["vllm", "pipeline-only", "paced"] = Field(
        "vllm",
        description="`vllm`; two benchmark engines that load no model and answer with "
        "placeholders: `pipeline-only` answers at once (to measure the pipeline alone), "
        "`paced` keeps a GPU's time (INFERQ_PACED_ENGINE_TABLE).",
    )
    allow_benchmark_engine: bool = Field(
        False,
        validation_alias=AliasChoices(
            "allow_benchmark_engine",
            "INFERQ_ALLOW_BENCHMARK_ENGINE",
            # The name it had when `pipeline-only` was the only one; still read.
            "INFERQ_ALLOW_PIPELINE_ONLY_ENGINE",
        ),
        description="Benchmarks and tests only: lets INFERQ_ENGINE=pipeline-only or paced "
        "start, whose answers are placeholders, not a model's (INFERQ_ALLOW_PIPELINE_ONLY_ENGINE, "
        "its former name, is still read).",
    )
    paced_engine_table: Path | None = Field(
        None,
        description="The paced engine's step times: a calibration table (JSON) of how long "
        "a GPU takes a step, by tokens scheduled and context attended to.",
    )

    @field_validator("engine_extra_args", mode="before")
    @classmethod
    def _parse_json_object(cls, value: Any) -> Any:
        if isinstance(value, str):
            return json.loads(value) if value.strip() else {}
        return value

    @field_validator("lora_adapters", mode="before")
    @classmethod
    def _name_value_pairs(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        if value.strip().startswith("{"):
            return json.loads(value)
        pairs = {}
        for part in (p.strip() for p in value.split(",")):
            name, sep, path = part.partition("=")
            if part and (not sep or not name.strip() or not path.strip()):
                raise ValueError(f"{part!r} is not name=path")
            if part:
                pairs[name.strip()] = path.strip()
        return pairs

    @field_validator("max_lora_rank")
    @classmethod
    def _lora_rank(cls, value: int) -> int:
        if value not in LORA_RANKS:
            raise ValueError(f"must be one of {', '.join(map(str, LORA_RANKS))}")
        return value

    @field_validator("tool_call_parser")
    @classmethod
    def _no_parser(cls, value: str | None) -> str | None:
        # An empty value is ignored (the default stands): `none` is how to have no parser.
        return None if value is not None and value.lower() == "none" else value

    @field_validator("served_model_name")
    @classmethod
    def _plain_name(cls, value: str | None) -> str | None:
        if value is not None and ("," in value or not value.strip()):
            raise ValueError("a served model name must not be empty or hold a comma")
        return value

    @model_validator(mode="after")
    def _adapters_named_apart(self) -> Self:
        for name in self.lora_adapters:
            if name == self.model_name or "," in name:
                raise ValueError(
                    f"INFERQ_LORA_ADAPTERS: adapter name {name!r} must differ from the model's "
                    "served name and hold no comma"
                )
        if self.lora_adapters and self.runner == "pooling":
            raise ValueError("INFERQ_LORA_ADAPTERS needs INFERQ_RUNNER=generate")
        return self

    @model_validator(mode="after")
    def _benchmark_engine_on_purpose(self) -> Self:
        # Any tenant's job would "succeed" with placeholder text: a deployment must ask for it.
        if self.engine != "vllm" and not self.allow_benchmark_engine:
            raise ValueError(
                f"INFERQ_ENGINE={self.engine} answers with placeholder tokens, not a model, and "
                "is for benchmarks and tests only: set INFERQ_ALLOW_BENCHMARK_ENGINE=true "
                "to run it"
            )
        if self.engine == "paced" and self.paced_engine_table is None:
            raise ValueError(
                "INFERQ_ENGINE=paced needs INFERQ_PACED_ENGINE_TABLE, the calibration table "
                "of its step times (bench/gpu_pace/ has one)"
            )
        return self

    @property
    def model_name(self) -> str:
        """The name clients put in `model`."""
        return self.served_model_name or self.model

    @property
    def tokenizer_name(self) -> str:
        return self.tokenizer or self.model

    @property
    def effective_interactive_seqs(self) -> int:
        if self.interactive_seqs is not None:
            return self.interactive_seqs
        return max(1, self.max_num_seqs // 8)

    @property
    def engine_max_num_seqs(self) -> int:
        """The engine's own `max_num_seqs`: batch lines' slots plus single jobs'."""
        return self.max_num_seqs + self.effective_interactive_seqs

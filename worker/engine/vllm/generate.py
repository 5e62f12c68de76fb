"""The vLLM adapter for generation: completions and chats (streamed or not), logprobs,
structured outputs, tool calls and LoRA adapters, on the stepped engine of
worker/engine/vllm/core.py."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping, Sequence
from typing import Any

from vllm import LLM
from vllm import SamplingParams as VllmSamplingParams
from vllm.lora.request import LoRARequest
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams
from vllm.v1.engine.exceptions import EngineDeadError

from inferq.broker.token_stream import ChoiceDelta, JobDelta
from inferq.domain.jobs import Choice, JobResult, SamplingParams
from inferq.domain.logprobs import PromptLogprob, PromptLogprobs, TokenLogprob
from inferq.exceptions import EngineError, EngineStartFailed, RequestRejected
from inferq.settings import EngineSettings
from worker.engine.protocol import EngineRequest, Finished
from worker.engine.tool_calls import with_tool_calls
from worker.engine.vllm.core import (
    REQUEST_REFUSED,
    SteppedVllm,
    engine_args,
    missing_local_adapter,
    start_llm,
)
from worker.engine.vllm.tools import AutoToolParser


class VllmEngine(SteppedVllm):
    """vLLM's engine behind the `Engine` interface."""

    def __init__(
        self,
        llm: LLM,
        *,
        step_timeout_s: float,
        tool_call_parser: str | None = None,
        served_name: str | None = None,
        adapters: Mapping[str, str] | None = None,
    ) -> None:
        """`served_name` and `adapters` are the model names this engine runs; a request for
        another is refused (None: any name runs on the base model)."""
        super().__init__(llm, step_timeout_s=step_timeout_s)
        self._served_name = served_name
        self._adapters = dict(adapters or {})
        # vLLM tells adapters apart by id (from 1); one request each, reused by every job.
        self._loras = {
            name: LoRARequest(name, lora_int_id, path)
            for lora_int_id, (name, path) in enumerate(self._adapters.items(), start=1)
        }
        # vLLM returns the sampled token's logprob beside the top k, so k is kept to tell
        # the alternatives from the sampled token.
        self._top_k_logprobs: dict[str, int] = {}
        # Streamed requests get per-step deltas from vLLM; their results are built here.
        self._streams: dict[str, _Streamed] = {}
        self._deltas: list[JobDelta] = []
        # Chats whose output may hold tool calls, read out once they finish.
        self._tool_choices: dict[str, Any] = {}
        # The prompt text of requests that asked for `echo`, which their choices start with.
        self._echoes: dict[str, str] = {}
        self._tool_parser = (
            None if tool_call_parser is None else AutoToolParser(tool_call_parser, llm)
        )

    @classmethod
    def from_settings(cls, settings: EngineSettings) -> VllmEngine:
        """Load the model; `EngineStartFailed` with vLLM's reason in one line if it fails
        (its whole output goes to the debug log)."""
        missing = missing_local_adapter(settings.lora_adapters)
        if missing is not None:
            raise EngineStartFailed(missing)
        llm = start_llm(engine_args(settings), settings)
        engine = cls(
            llm,
            step_timeout_s=settings.engine_step_timeout_s,
            tool_call_parser=settings.tool_call_parser,
            served_name=settings.model_name,
            adapters=settings.lora_adapters,
        )
        engine.load_adapters()
        return engine

    def load_adapters(self) -> None:
        """Load every adapter now: `EngineStartFailed` (the engine closed) for one vLLM
        cannot load, which would otherwise kill the engine core at its first job."""
        for lora in self._loras.values():
            try:
                self._engine.add_lora(lora)
            except Exception as exc:  # vLLM says why in its own words
                self.close()
                reason = " ".join(str(exc).split())[:400]
                raise EngineStartFailed(
                    f"INFERQ_LORA_ADAPTERS: vLLM could not load adapter {lora.lora_name!r} "
                    f"from {lora.lora_path}: {reason}"
                ) from exc

    @property
    def chat_template(self) -> str | None:
        """The chat template the engine's tokenizer renders chats with, if it has one."""
        template = getattr(self._llm.get_tokenizer(), "chat_template", None)
        return template if isinstance(template, str) else None

    def add(self, request: EngineRequest) -> None:
        lora = self._lora_of(request.model)
        try:
            self._engine.add_request(
                request.job_id,
                {"prompt_token_ids": request.prompt_token_ids},
                _sampling_params(request.sampling, stream=request.stream),
                # Adapter and base jobs share the engine's steps.
                lora_request=lora,
                priority=request.priority,
            )
        except EngineDeadError as exc:
            raise EngineError(str(exc)) from exc
        except REQUEST_REFUSED as exc:
            # vLLM refusing one request, perhaps after its front end took it: forget it there.
            with contextlib.suppress(Exception):
                self._engine.abort_request([request.job_id])
            raise RequestRejected(f"the engine refused the request: {exc}") from exc
        top_k = request.sampling.logprobs
        if request.sampling.echo:
            tokenizer = self._llm.get_tokenizer()
            # Detokenized as the output is: special tokens (the BOS) left out by default.
            self._echoes[request.job_id] = tokenizer.decode(
                list(request.prompt_token_ids),
                skip_special_tokens=request.sampling.skip_special_tokens,
            )
        if request.sampling.tool_choice is not None:
            self._tool_choices[request.job_id] = request.sampling.tool_choice
        if request.stream:
            self._streams[request.job_id] = _Streamed(len(request.prompt_token_ids), top_k or 0)
        elif top_k is not None:
            self._top_k_logprobs[request.job_id] = top_k

    def _lora_of(self, model: str | None) -> LoRARequest | None:
        """The adapter a job named, or None for the base; `RequestRejected` for a name this
        worker does not serve (its adapters may differ from the worker that registered)."""
        if model is None or model == self._served_name:
            return None
        lora = self._loras.get(model)
        if lora is None and self._served_name is not None:
            raise RequestRejected(
                f"this worker serves {self._served_name!r} and adapters "
                f"{sorted(self._loras) or 'none'}, not {model!r}: give every worker of a "
                "model the same INFERQ_LORA_ADAPTERS"
            )
        return lora

    def step(self) -> list[Finished]:
        outputs = self._step_outputs()
        finished: list[Finished] = []
        self._deltas = []
        for output in outputs:
            if not isinstance(output, RequestOutput):
                continue
            job_id = output.request_id
            streamed = self._streams.get(job_id)
            echo = self._echoes.get(job_id)
            if streamed is not None:
                self._deltas.append(streamed.add(output, echo=echo))
                if output.finished:
                    del self._streams[job_id]
                    finished.append(self._with_tool_calls(job_id, streamed.result()))
            elif output.finished:
                result = _result(output, self._top_k_logprobs.pop(job_id, 0), echo=echo)
                finished.append(self._with_tool_calls(job_id, result))
        return finished

    def _with_tool_calls(self, job_id: str, result: JobResult) -> Finished:
        self._echoes.pop(job_id, None)
        tool_choice = self._tool_choices.pop(job_id, None)
        parse = None if self._tool_parser is None else self._tool_parser.parse
        return Finished(job_id=job_id, result=with_tool_calls(result, tool_choice, parse))

    def deltas(self) -> list[JobDelta]:
        return self._deltas

    def abort(self, job_ids: Sequence[str]) -> None:
        for job_id in job_ids:
            self._top_k_logprobs.pop(job_id, None)
            self._streams.pop(job_id, None)
            self._tool_choices.pop(job_id, None)
            self._echoes.pop(job_id, None)
        self._abort_requests(list(job_ids))


def _sampling_params(params: SamplingParams, *, stream: bool) -> VllmSamplingParams:
    return VllmSamplingParams(
        n=params.n,
        max_tokens=params.max_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        min_p=params.min_p,
        stop=list(params.stop) or None,
        seed=params.seed,
        presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty,
        repetition_penalty=params.repetition_penalty,
        logprobs=params.logprobs,
        prompt_logprobs=params.prompt_logprobs,
        ignore_eos=params.ignore_eos,
        min_tokens=params.min_tokens,
        logit_bias=None if params.logit_bias is None else dict(params.logit_bias),
        allowed_token_ids=_listed(params.allowed_token_ids),
        bad_words=_listed(params.bad_words),
        stop_token_ids=_listed(params.stop_token_ids),
        include_stop_str_in_output=params.include_stop_str_in_output,
        skip_special_tokens=params.skip_special_tokens,
        spaces_between_special_tokens=params.spaces_between_special_tokens,
        structured_outputs=(
            None if params.structured is None else StructuredOutputsParams(**params.structured)
        ),
        # Only the final output unless someone follows the tokens: no per-step copies to
        # build and throw away for batch work.
        output_kind=RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY,
    )


def _listed(values: Sequence[Any] | None) -> list[Any] | None:
    return None if values is None else list(values)


def _result(output: RequestOutput, top_k: int, *, echo: str | None) -> JobResult:
    prompt_logprobs = _prompt_logprobs(output.prompt_logprobs)
    return JobResult(
        choices=tuple(
            _choice(c, top_k, echo=echo, prompt_logprobs=prompt_logprobs)
            for c in sorted(output.outputs, key=lambda c: c.index)
        ),
        prompt_tokens=len(output.prompt_token_ids or ()),
    )


def _prompt_logprobs(positions: Sequence[Any] | None) -> PromptLogprobs | None:
    """vLLM's prompt logprobs as the domain keeps them (None where none were asked)."""
    if positions is None:
        return None
    return tuple(
        None
        if tokens is None
        else {
            token_id: PromptLogprob(
                logprob=_finite(lp.logprob), rank=lp.rank, decoded_token=lp.decoded_token
            )
            for token_id, lp in tokens.items()
        }
        for tokens in positions
    )


def _choice(
    output: CompletionOutput,
    top_k: int,
    *,
    echo: str | None,
    prompt_logprobs: PromptLogprobs | None = None,
) -> Choice:
    logprobs = None
    if output.logprobs is not None:
        logprobs = tuple(
            _token_logprob(token_id, candidates, top_k)
            for token_id, candidates in zip(output.token_ids, output.logprobs, strict=False)
        )
    return Choice(
        index=output.index,
        text=(echo or "") + output.text,
        finish_reason=output.finish_reason,
        completion_tokens=len(output.token_ids),
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
    )


def _token_logprob(token_id: int, candidates: Any, top_k: int) -> TokenLogprob:
    sampled = candidates[token_id]
    ranked = sorted(
        (c for c in candidates.values() if c.rank is not None and c.rank <= top_k),
        key=lambda c: c.rank,
    )
    return TokenLogprob(
        token=sampled.decoded_token or "",
        logprob=_finite(sampled.logprob),
        top_logprobs=tuple((c.decoded_token or "", _finite(c.logprob)) for c in ranked),
    )


# What a logprob of minus infinity (a token a grammar ruled out) is sent as, as vLLM's
# server does: JSON has no infinity, and Postgres refuses JSON that holds one.
MIN_LOGPROB = -9999.0


def _finite(logprob: float) -> float:
    value = float(logprob)
    return value if math.isfinite(value) else MIN_LOGPROB


class _Streamed:
    """A streamed request's output so far, from vLLM's per-step deltas."""

    def __init__(self, prompt_tokens: int, top_k: int) -> None:
        self._prompt_tokens = prompt_tokens
        self._top_k = top_k
        self._choices: dict[int, _ChoiceSoFar] = {}
        # Asked for (0 is all a stream may ask), they come with the first delta; the later
        # ones bring an empty list.
        self._prompt_logprobs: PromptLogprobs | None = None

    def add(self, output: RequestOutput, *, echo: str | None) -> JobDelta:
        """Take one step's outputs; return them as a delta (each choice's first with
        `echo`, the prompt it repeats, before its text)."""
        if output.prompt_logprobs:
            self._prompt_logprobs = _prompt_logprobs(output.prompt_logprobs)
        deltas = []
        for completion in output.outputs:
            first = completion.index not in self._choices
            so_far = self._choices.setdefault(completion.index, _ChoiceSoFar())
            logprobs = None
            if completion.logprobs is not None:
                logprobs = tuple(
                    _token_logprob(token_id, candidates, self._top_k)
                    for token_id, candidates in zip(
                        completion.token_ids, completion.logprobs, strict=False
                    )
                )
            delta = ChoiceDelta(
                index=completion.index,
                text=(echo or "") + completion.text if first else completion.text,
                offset=so_far.tokens,
                tokens=len(completion.token_ids),
                logprobs=logprobs,
                finish_reason=completion.finish_reason,
            )
            so_far.add(delta)
            deltas.append(delta)
        return JobDelta(job_id=output.request_id, choices=tuple(deltas))

    def result(self) -> JobResult:
        return JobResult(
            choices=tuple(
                self._choices[i].choice(i, prompt_logprobs=self._prompt_logprobs)
                for i in sorted(self._choices)
            ),
            prompt_tokens=self._prompt_tokens,
        )


class _ChoiceSoFar:
    def __init__(self) -> None:
        self.text: list[str] = []
        self.tokens = 0
        self.logprobs: list[TokenLogprob] | None = None
        self.finish_reason: str | None = None

    def add(self, delta: ChoiceDelta) -> None:
        self.text.append(delta.text)
        self.tokens += delta.tokens
        if delta.logprobs is not None:
            if self.logprobs is None:
                self.logprobs = []
            self.logprobs.extend(delta.logprobs)
        self.finish_reason = delta.finish_reason or self.finish_reason

    def choice(self, index: int, *, prompt_logprobs: PromptLogprobs | None) -> Choice:
        return Choice(
            index=index,
            text="".join(self.text),
            finish_reason=self.finish_reason,
            completion_tokens=self.tokens,
            logprobs=None if self.logprobs is None else tuple(self.logprobs),
            prompt_logprobs=prompt_logprobs,
        )

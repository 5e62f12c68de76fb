"""The vLLM engine adapter: the only module that imports vLLM.

It drives the engine inside vLLM's offline `LLM` one step at a time (`add_request`,
`step`), which is what lets the loop admit new work whenever a sequence finishes.

vLLM's synchronous client notices a dead engine core but leaves a pending `step()`
waiting forever (its output thread shuts down without waking the reader; seen with
vllm 0.32), and nothing notices a core that hangs. A watchdog thread covers both: it
wakes the reader with `EngineDeadError`, killing the core first if a step overran.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Sequence
from typing import Any

from vllm import LLM
from vllm import SamplingParams as VllmSamplingParams
from vllm.exceptions import VLLMClientError
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams
from vllm.v1.engine.exceptions import EngineDeadError

from inferq.exceptions import EngineError, EngineStartFailed, RequestRejected
from inferq.jobs import Choice, JobResult, SamplingParams, TokenLogprob
from inferq.settings import Settings
from inferq.token_stream import ChoiceDelta, JobDelta
from inferq.tool_calls import with_tool_calls
from worker.engine import EngineRequest, Finished
from worker.engine_output import HeldOutput, start_failure
from worker.vllm_tools import AutoToolParser

log = logging.getLogger(__name__)


def engine_args(settings: Settings) -> dict[str, Any]:
    """The keyword arguments for `vllm.LLM`, from settings."""
    args: dict[str, Any] = {
        "model": settings.model,
        "tokenizer": settings.tokenizer_name,
        "served_model_name": settings.model_name,
        "gpu_memory_utilization": settings.gpu_memory_utilization,
        "max_num_seqs": settings.engine_max_num_seqs,
        # Single jobs go ahead of batch lines inside the engine (EngineRequest.priority),
        # preempting them when the KV cache runs short.
        "scheduling_policy": "priority",
        "tensor_parallel_size": settings.tensor_parallel_size,
        "dtype": settings.dtype,
        "enable_prefix_caching": settings.enable_prefix_caching,
        "enforce_eager": settings.enforce_eager,
        "seed": settings.engine_seed,
        # Engine stats feed the KV-cache metric and a throughput line in the log.
        "disable_log_stats": False,
    }
    optional = {
        "max_model_len": settings.max_model_len,
        "max_num_batched_tokens": settings.max_num_batched_tokens,
        "kv_cache_memory_bytes": (
            None if settings.kv_cache_memory_bytes is None else int(settings.kv_cache_memory_bytes)
        ),
        "quantization": settings.quantization,
    }
    args.update({k: v for k, v in optional.items() if v is not None})
    args.update(settings.engine_extra_args)
    return args


WATCH_INTERVAL_S = 0.5


class VllmEngine:
    """vLLM's engine behind the `Engine` interface."""

    def __init__(
        self,
        llm: LLM,
        *,
        step_timeout_s: float,
        fault_kill_engine_seed: int | None = None,
        tool_call_parser: str | None = None,
    ) -> None:
        self._llm = llm
        self._engine = llm.llm_engine
        self._step_timeout_s = step_timeout_s
        self._fault_seed = fault_kill_engine_seed
        self._step_started: float | None = None
        self._closed = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, name="engine-watchdog", daemon=True)
        self._watchdog.start()
        # vLLM returns the sampled token's logprob beside the top k, so k is kept to tell
        # the alternatives from the sampled token.
        self._top_k_logprobs: dict[str, int] = {}
        # Streamed requests get per-step deltas from vLLM; their results are built here.
        self._streams: dict[str, _Streamed] = {}
        self._deltas: list[JobDelta] = []
        # Chats whose output may hold tool calls, read out once they finish.
        self._tool_choices: dict[str, Any] = {}
        self._tool_parser = (
            None if tool_call_parser is None else AutoToolParser(tool_call_parser, llm)
        )

    @classmethod
    def from_settings(cls, settings: Settings) -> VllmEngine:
        """Load the model; `EngineStartFailed` with vLLM's reason in one line if it fails
        (its whole output goes to the debug log)."""
        args = engine_args(settings)
        log.info("loading %s into vLLM", settings.model, extra={"engine_args": args})
        failure: Exception | None = None
        with HeldOutput() as output:
            try:
                llm = LLM(**args)
            except Exception as exc:  # noqa: BLE001  # any failure: said in one line below
                failure = exc
        if failure is not None:
            held = output.text()
            log.debug("vLLM's output while starting:\n%s", held, exc_info=failure)
            raise EngineStartFailed(
                f"vLLM could not start {settings.model}: {start_failure(failure, held)} "
                "(`inferq doctor` checks this host; INFERQ_LOG_LEVEL=DEBUG shows vLLM's output)"
            ) from failure
        output.release()
        return cls(
            llm,
            step_timeout_s=settings.engine_step_timeout_s,
            fault_kill_engine_seed=settings.fault_kill_engine_seed,
            tool_call_parser=settings.tool_call_parser,
        )

    @property
    def max_model_len(self) -> int:
        return int(self._engine.model_config.max_model_len)

    def add(self, request: EngineRequest) -> None:
        try:
            self._engine.add_request(
                request.job_id,
                {"prompt_token_ids": request.prompt_token_ids},
                _sampling_params(request.sampling, stream=request.stream),
                priority=request.priority,
            )
        except EngineDeadError as exc:
            raise EngineError(str(exc)) from exc
        except (ValueError, TypeError, OverflowError, VLLMClientError) as exc:
            # vLLM refusing one request (OverflowError: a number it cannot send to its core,
            # after its front end took the request: forget it there).
            with contextlib.suppress(Exception):
                self._engine.abort_request([request.job_id])
            raise RequestRejected(f"the engine refused the request: {exc}") from exc
        top_k = request.sampling.logprobs
        if request.sampling.tool_choice is not None:
            self._tool_choices[request.job_id] = request.sampling.tool_choice
        if request.stream:
            self._streams[request.job_id] = _Streamed(len(request.prompt_token_ids), top_k or 0)
        elif top_k is not None:
            self._top_k_logprobs[request.job_id] = top_k
        if self._fault_seed is not None and request.sampling.seed == self._fault_seed:
            log.warning("fault hook: request %s kills the engine core", request.job_id)
            self._kill_core()

    def step(self) -> list[Finished]:
        self._step_started = time.monotonic()
        try:
            outputs = self._engine.step()
        except EngineDeadError as exc:
            raise EngineError(f"vLLM's engine died: {exc}") from exc
        finally:
            self._step_started = None
        finished: list[Finished] = []
        self._deltas = []
        for output in outputs:
            if not isinstance(output, RequestOutput):
                continue
            job_id = output.request_id
            streamed = self._streams.get(job_id)
            if streamed is not None:
                self._deltas.append(streamed.add(output))
                if output.finished:
                    del self._streams[job_id]
                    finished.append(self._with_tool_calls(job_id, streamed.result()))
            elif output.finished:
                result = _result(output, self._top_k_logprobs.pop(job_id, 0))
                finished.append(self._with_tool_calls(job_id, result))
        return finished

    def _with_tool_calls(self, job_id: str, result: JobResult) -> Finished:
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
        try:
            self._engine.abort_request(list(job_ids))
        except EngineDeadError as exc:
            raise EngineError(str(exc)) from exc

    def kv_cache_usage(self) -> float | None:
        for metric in self._engine.get_metrics():
            if metric.name == "vllm:kv_cache_usage_perc":
                return float(metric.value)
        return None

    def close(self) -> None:
        self._closed.set()
        self._engine.engine_core.shutdown()

    def _core_processes(self) -> list[Any]:
        manager = getattr(self._engine.engine_core.resources, "engine_manager", None)
        return list(getattr(manager, "processes", ()))

    def _kill_core(self) -> None:
        for process in self._core_processes():
            if process.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGKILL)

    def _watch(self) -> None:
        core = self._engine.engine_core
        if not hasattr(core, "resources"):  # in-process core: nothing to watch
            return
        while not self._closed.wait(WATCH_INTERVAL_S):
            started = self._step_started
            if started is not None and time.monotonic() - started > self._step_timeout_s:
                log.error("an engine step has run %.0f s: the engine hangs", self._step_timeout_s)
                self._kill_core()
                core.resources.engine_dead = True
            if core.resources.engine_dead:
                # Wake a step() blocked on the output queue (and fail the next one).
                core.outputs_queue.put_nowait(EngineDeadError())
                return


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
        ignore_eos=params.ignore_eos,
        structured_outputs=(
            None if params.structured is None else StructuredOutputsParams(**params.structured)
        ),
        # Only the final output unless someone follows the tokens: no per-step copies to
        # build and throw away for batch work.
        output_kind=RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY,
    )


def storable(text: str) -> str:
    """Text as Postgres can hold it: NUL, which a model may well generate, becomes U+FFFD."""
    return text.replace("\x00", "\ufffd")


def _result(output: RequestOutput, top_k: int) -> JobResult:
    return JobResult(
        choices=tuple(_choice(c, top_k) for c in sorted(output.outputs, key=lambda c: c.index)),
        prompt_tokens=len(output.prompt_token_ids or ()),
    )


def _choice(output: CompletionOutput, top_k: int) -> Choice:
    logprobs = None
    if output.logprobs is not None:
        logprobs = tuple(
            _token_logprob(token_id, candidates, top_k)
            for token_id, candidates in zip(output.token_ids, output.logprobs, strict=False)
        )
    return Choice(
        index=output.index,
        text=output.text,
        finish_reason=output.finish_reason,
        completion_tokens=len(output.token_ids),
        logprobs=logprobs,
    )


def _token_logprob(token_id: int, candidates: Any, top_k: int) -> TokenLogprob:
    sampled = candidates[token_id]
    ranked = sorted(
        (c for c in candidates.values() if c.rank is not None and c.rank <= top_k),
        key=lambda c: c.rank,
    )
    return TokenLogprob(
        token=sampled.decoded_token or "",
        logprob=float(sampled.logprob),
        top_logprobs=tuple((c.decoded_token or "", float(c.logprob)) for c in ranked),
    )


class _Streamed:
    """A streamed request's output so far, from vLLM's per-step deltas."""

    def __init__(self, prompt_tokens: int, top_k: int) -> None:
        self._prompt_tokens = prompt_tokens
        self._top_k = top_k
        self._choices: dict[int, _ChoiceSoFar] = {}

    def add(self, output: RequestOutput) -> JobDelta:
        """Take one step's outputs; return them as a delta."""
        deltas = []
        for completion in output.outputs:
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
                # As the result will be stored: followers see the same text live and after.
                text=storable(completion.text),
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
            choices=tuple(self._choices[i].choice(i) for i in sorted(self._choices)),
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

    def choice(self, index: int) -> Choice:
        return Choice(
            index=index,
            text="".join(self.text),
            finish_reason=self.finish_reason,
            completion_tokens=self.tokens,
            logprobs=None if self.logprobs is None else tuple(self.logprobs),
        )

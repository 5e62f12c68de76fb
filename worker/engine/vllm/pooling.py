"""The vLLM adapter for embeddings: an embedding model behind the `Engine` interface,
through vLLM's pooling runner (`INFERQ_RUNNER=pooling`).

An embedding job holds several inputs. Each becomes a vLLM request of its own
(`{job_id}#{index}`), so the engine batches the inputs of all jobs in flight together, as
it batches sequences; a job finishes when its last input has. The start, the step, the
watchdog and the KV-cache reading are shared with generation (`worker.engine.vllm.core`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm import LLM
from vllm.outputs import PoolingRequestOutput
from vllm.pooling_params import PoolingParams
from vllm.v1.engine.exceptions import EngineDeadError

from inferq.broker.token_stream import JobDelta
from inferq.domain.jobs import JobResult
from inferq.exceptions import EngineError, RequestRejected
from inferq.settings import EngineSettings
from worker.engine.protocol import EngineRequest, Finished
from worker.engine.vllm.core import REQUEST_REFUSED, SteppedVllm, engine_args, start_llm

# A decoder-only model (`*ForCausalLM`) becomes an embedding model by pooling the last
# token's hidden state; vLLM leaves a model that pools already as it is.
POOLING_ARGS: dict[str, Any] = {"runner": "pooling", "convert": "embed"}


def pooling_engine_args(settings: EngineSettings) -> dict[str, Any]:
    """The keyword arguments for `vllm.LLM` with the pooling runner (extra args still win)."""
    return POOLING_ARGS | engine_args(settings)


class VllmPoolingEngine(SteppedVllm):
    """vLLM's pooling runner behind the `Engine` interface: embedding jobs only."""

    def __init__(self, llm: LLM, *, step_timeout_s: float) -> None:
        super().__init__(llm, step_timeout_s=step_timeout_s)
        model_config = self._engine.model_config
        self.embedding_size = int(model_config.embedding_size)
        # Only a Matryoshka model's vectors may be cut short (`dimensions`).
        self.supports_dimensions = bool(model_config.is_matryoshka)
        self._jobs: dict[str, _Embedding] = {}

    @classmethod
    def from_settings(cls, settings: EngineSettings) -> VllmPoolingEngine:
        """Load the model; `EngineStartFailed` with vLLM's reason in one line if it fails."""
        llm = start_llm(pooling_engine_args(settings), settings)
        return cls(llm, step_timeout_s=settings.engine_step_timeout_s)

    def add(self, request: EngineRequest) -> None:
        inputs = _inputs(request)
        job = _Embedding(prompt_tokens=len(request.prompt_token_ids), inputs=len(inputs))
        added: list[str] = []
        for index, token_ids in enumerate(inputs):
            request_id = _input_id(request.job_id, index)
            added.append(request_id)
            try:
                self._engine.add_request(
                    request_id,
                    {"prompt_token_ids": token_ids},
                    _pooling_params(request.sampling.pooling or {}),
                    priority=request.priority,
                )
            except EngineDeadError as exc:
                raise EngineError(str(exc)) from exc
            except REQUEST_REFUSED as exc:
                # The inputs taken already, and this one if vLLM's front end took it.
                with contextlib.suppress(Exception):
                    self._engine.abort_request(added)
                raise RequestRejected(f"the engine refused the request: {exc}") from exc
        self._jobs[request.job_id] = job

    def step(self) -> list[Finished]:
        finished: list[Finished] = []
        for output in self._step_outputs():
            if not isinstance(output, PoolingRequestOutput) or not output.finished:
                continue
            job_id, _, index = output.request_id.rpartition("#")
            job = self._jobs.get(job_id)
            if job is None:  # aborted
                continue
            job.vectors[int(index)] = _float32_bytes(output.outputs.data)
            if len(job.vectors) == job.inputs:
                del self._jobs[job_id]
                finished.append(Finished(job_id=job_id, result=job.result()))
        return finished

    def deltas(self) -> list[JobDelta]:
        return []  # an embedding is never streamed

    def abort(self, job_ids: Sequence[str]) -> None:
        request_ids = []
        for job_id in job_ids:
            job = self._jobs.pop(job_id, None)
            if job is not None:
                request_ids += [_input_id(job_id, i) for i in range(job.inputs)]
        if request_ids:
            self._abort_requests(request_ids)


@dataclass(kw_only=True)
class _Embedding:
    """A job whose inputs are in the engine: the vectors of those that have finished."""

    prompt_tokens: int
    inputs: int
    vectors: dict[int, bytes] = field(default_factory=dict)

    def result(self) -> JobResult:
        return JobResult(
            choices=(),
            prompt_tokens=self.prompt_tokens,
            embedding=b"".join(self.vectors[i] for i in range(self.inputs)),
        )


def _input_id(job_id: str, index: int) -> str:
    return f"{job_id}#{index}"


def _inputs(request: EngineRequest) -> list[list[int]]:
    """The job's inputs' token ids, split by `input_lengths`; `RequestRejected` if they
    do not add up."""
    pooling = request.sampling.pooling
    if pooling is None:
        raise RequestRejected("this worker serves embeddings: the request is not an embedding")
    lengths = [int(n) for n in pooling.get("input_lengths", ())]
    if not lengths or sum(lengths) != len(request.prompt_token_ids):
        raise RequestRejected(
            f"input_lengths {lengths} do not split {len(request.prompt_token_ids)} tokens"
        )
    inputs, start = [], 0
    for length in lengths:
        inputs.append(request.prompt_token_ids[start : start + length])
        start += length
    return inputs


def _pooling_params(pooling: Mapping[str, Any]) -> PoolingParams:
    # Normalised, as vLLM's `LLM.embed` returns vectors (`use_activation` left to the
    # model's pooler, True by default). One per input: vLLM fills in its defaults in place.
    return PoolingParams(task="embed", dimensions=pooling.get("dimensions"))


def _float32_bytes(vector: Any) -> bytes:
    """A torch vector as float32, little-endian."""
    return bytes(vector.float().cpu().numpy().astype("<f4", copy=False).tobytes())

"""What the vLLM adapters share (`generate.py` generates, `pooling.py` embeds): the engine
arguments, loading the model with a one-line reason when it fails,
and `SteppedVllm`, the engine inside vLLM's offline `LLM` driven one step at a time
(`add_request`, `step`), which is what lets the loop admit new work whenever a sequence
finishes.

vLLM's synchronous client notices a dead engine core but leaves a pending `step()`
waiting forever (its output thread shuts down without waking the reader), and nothing
notices a core that hangs. A watchdog thread covers both: it
wakes the reader with `EngineDeadError`, killing the core first if a step overran.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from vllm import LLM
from vllm.v1.engine.exceptions import EngineDeadError

try:
    from vllm.exceptions import VLLMClientError
except ImportError:  # vLLM 0.25 (the CUDA build for torch 2.11): its request errors are ValueErrors
    VLLMClientError = ValueError

from inferq.exceptions import EngineError, EngineStartFailed
from inferq.host import supervision
from inferq.host.processes import descendants, lower_group
from inferq.settings import EngineSettings
from worker.engine.output import CapturedOutput, start_failure

log = logging.getLogger(__name__)

# What vLLM raises for one request it refuses (OverflowError: a number it cannot send to its
# core, after its front end took the request).
REQUEST_REFUSED: tuple[type[Exception], ...] = (
    ValueError,
    TypeError,
    OverflowError,
    VLLMClientError,
)


def engine_args(settings: EngineSettings) -> dict[str, Any]:
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
    if settings.lora_adapters:
        args.update(
            enable_lora=True,
            max_loras=settings.max_loras,
            max_lora_rank=settings.max_lora_rank,
            # Host memory keeps every adapter, not only the max_loras of one step: none
            # is read from disk again when it comes back into use.
            max_cpu_loras=max(settings.max_loras, len(settings.lora_adapters)),
        )
    args.update(settings.engine_extra_args)
    return args


def missing_local_adapter(adapters: Mapping[str, str]) -> str | None:
    """Why an adapter given as a local path cannot be loaded (a Hugging Face id is vLLM's
    to find)."""
    for name, path in adapters.items():
        if path.startswith(("/", ".", "~")) and not Path(path).expanduser().exists():
            return f"INFERQ_LORA_ADAPTERS: adapter {name!r} is at {path}, which does not exist"
    return None


WATCH_INTERVAL_S = 0.5


def start_llm(args: dict[str, Any], settings: EngineSettings) -> LLM:
    """Load the model into vLLM's `LLM` with `args`, then lower its engine processes to
    `engine_nice`, a core that does not run the model to `engine_core_nice`, and this
    worker's scheduling group to `engine_group_nice`; `EngineStartFailed` with vLLM's
    reason in one line if it fails (its whole output goes to the debug log)."""
    model = settings.model
    log.info("loading %s into vLLM", model, extra={"engine_args": args})
    failure: Exception | None = None
    with CapturedOutput() as output:
        try:
            llm = LLM(**args)
        except Exception as exc:  # noqa: BLE001  # any failure: said in one line below
            failure = exc
    if failure is not None:
        held = output.text()
        log.debug("vLLM's output while starting:\n%s", held, exc_info=failure)
        raise EngineStartFailed(
            f"vLLM could not start {model}: {start_failure(failure, held)} "
            "(`inferq doctor` checks this host; INFERQ_LOG_LEVEL=DEBUG shows vLLM's output)"
        ) from failure
    output.pass_on()
    cores = [p.pid for p in core_processes(llm.llm_engine) if p.pid is not None]
    apart = runs_model_apart(llm)
    lower_priority(
        cores, nice=settings.engine_nice, core_nice=settings.engine_core_nice if apart else 0
    )
    if apart:
        lower_group(settings.engine_group_nice)
    return llm


def lower_priority(cores: Sequence[int], *, nice: int, core_nice: int) -> None:
    """Every thread of the engine core processes `cores` and of their processes to `nice`;
    the cores' own threads to `core_nice` if that is higher (threads started later inherit
    it); the worker's own process keeps its priority.

    On a CPU, vLLM's engine core and model process wait for each other by spinning, keeping
    every core busy; at a higher nice the short work of the API, the worker's own threads,
    Redis and Postgres goes first. The core only schedules, so lowering it alone costs the
    engine little; lowering the model's process too costs throughput where it is busy."""
    lowered = {pid: nice for pid in descendants(*cores)} if nice > 0 else {}
    if core_nice > nice:
        lowered.update(dict.fromkeys(cores, core_nice))
    for pid, value in lowered.items():
        with contextlib.suppress(FileNotFoundError):
            for tid in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(ProcessLookupError):
                    # Lowered only: a thread already at a higher nice keeps it.
                    current = os.getpriority(os.PRIO_PROCESS, int(tid))
                    os.setpriority(os.PRIO_PROCESS, int(tid), max(value, current))
    if lowered:
        log.info(
            "vLLM's engine processes run at nice %d, its core at %d "
            "(INFERQ_ENGINE_NICE, INFERQ_ENGINE_CORE_NICE)",
            nice,
            max(nice, core_nice),
        )


def runs_model_apart(llm: LLM) -> bool:
    """Whether vLLM's engine core runs the model in processes of its own (its
    multiprocessing executor: always on a CPU, and for tensor parallelism), leaving the
    core itself to schedule and wait."""
    parallel = llm.llm_engine.vllm_config.parallel_config
    return bool(parallel.distributed_executor_backend == "mp")


def core_processes(engine: Any) -> list[Any]:
    """The engine core processes of vLLM's `LLMEngine` (none for a core in this process)."""
    resources = getattr(engine.engine_core, "resources", None)
    return list(getattr(getattr(resources, "engine_manager", None), "processes", ()))


class SteppedVllm:
    """The engine inside vLLM's `LLM`, stepped from one thread under the watchdog: what the
    generate and the pooling (worker.engine.vllm.pooling) adapters share."""

    def __init__(self, llm: LLM, *, step_timeout_s: float) -> None:
        self._llm = llm
        self._engine = llm.llm_engine
        self._step_timeout_s = step_timeout_s
        self._step_started: float | None = None
        self._closed = threading.Event()
        self._watchdog = supervision.thread(self._watch, name="engine-watchdog")
        self._watchdog.start()

    @property
    def max_model_len(self) -> int:
        return int(self._engine.model_config.max_model_len)

    def _step_outputs(self) -> list[Any]:
        """Run one engine step; `EngineError` if the engine died."""
        self._step_started = time.monotonic()
        try:
            return list(self._engine.step())
        except EngineDeadError as exc:
            raise EngineError(f"vLLM's engine died: {exc}") from exc
        finally:
            self._step_started = None

    def _abort_requests(self, request_ids: list[str]) -> None:
        try:
            self._engine.abort_request(request_ids)
        except EngineDeadError as exc:
            raise EngineError(str(exc)) from exc

    def kv_cache_usage(self) -> float | None:
        for metric in self._engine.get_metrics():
            if metric.name == "vllm:kv_cache_usage_perc":
                return float(metric.value)
        return None

    def close(self) -> None:
        self._closed.set()
        core = self._engine.engine_core
        core.shutdown()
        # vLLM leaves its ZeroMQ context (and its I/O threads) open: one more per engine
        # restart. Its output thread closes its sockets on shutdown; then the context goes.
        thread = getattr(core, "output_queue_thread", None)
        if thread is not None:
            thread.join(timeout=5)
        ctx = getattr(getattr(core, "resources", None), "ctx", None)
        if ctx is not None:
            ctx.destroy(linger=0)

    def kill_core(self) -> None:
        """SIGKILL vLLM's engine core processes, as the watchdog does to a hung core."""
        for process in core_processes(self._engine):
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
                self.kill_core()
                core.resources.engine_dead = True
            if core.resources.engine_dead:
                # Wake a step() blocked on the output queue (and fail the next one).
                core.outputs_queue.put_nowait(EngineDeadError())
                return

"""The GPU worker's Prometheus metrics (served by `inferq worker` on its own port)."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from inferq.domain.served_models import ServedModel
from inferq.host.hardware import NvmlUnavailable, gpus

log = logging.getLogger(__name__)

_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900, 3600)


class WorkerMetrics:
    """Every series a GPU worker exports; vLLM's own `vllm:*` series sit beside them."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.jobs_admitted = Counter(
            "inferq_jobs_admitted_total", "Jobs admitted into the engine.", registry=registry
        )
        self.jobs_finished = Counter(
            "inferq_jobs_finished_total",
            "Jobs that left the engine, by outcome (succeeded, failed, aborted) and reason.",
            ["outcome", "reason"],
            registry=registry,
        )
        self.sequences_in_flight = Gauge(
            "inferq_sequences_in_flight",
            "Sequences in the engine (a request with n completions counts n).",
            registry=registry,
        )
        self.jobs_held = Gauge(
            "inferq_jobs_held",
            "Jobs this worker holds: waiting for admission, in the engine or being written.",
            registry=registry,
        )
        self.admission_batch_size = Histogram(
            "inferq_admission_batch_size",
            "Requests admitted into the engine at one step.",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
            registry=registry,
        )
        self.queue_wait = Histogram(
            "inferq_queue_wait_seconds",
            "From submission to admission into the engine.",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.job_latency = Histogram(
            "inferq_job_latency_seconds",
            "From submission to the committed result (end to end).",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.prompt_tokens = Counter(
            "inferq_prompt_tokens_total", "Prompt tokens of finished jobs.", registry=registry
        )
        self.generation_tokens = Counter(
            "inferq_generation_tokens_total",
            "Tokens generated for finished jobs.",
            registry=registry,
        )
        self.engine_cpu = Counter(
            "inferq_engine_cpu_seconds_total",
            "CPU the engine's calls took on the engine loop's thread (vLLM's front end; its "
            "engine core runs in a process of its own).",
            registry=registry,
        )
        self.engine_restarts = Counter(
            "inferq_engine_restarts_total",
            "Times the engine died and was rebuilt.",
            registry=registry,
        )
        self.ready = Gauge(
            "inferq_worker_ready",
            "1 once the engine is loaded and the worker consumes; 0 while it is stuck (/livez).",
            registry=registry,
        )
        self.served_model = Gauge(
            "inferq_served_model",
            "1 for each model name this worker serves (its model and its LoRA adapters).",
            ["worker", "model", "base", "runner"],
            registry=registry,
        )
        self.kv_cache_usage = Gauge(
            "inferq_kv_cache_usage_ratio", "Fraction of the KV cache in use.", registry=registry
        )

    def serving(self, models: Sequence[ServedModel], *, worker: str) -> None:
        for model in models:
            self.served_model.labels(worker, model.name, model.base, model.runner).set(1)


class GpuCollector(Collector):
    """Utilisation and memory of each GPU, read through NVML at scrape time."""

    def __init__(self, nvml: object) -> None:
        self._nvml = nvml

    def collect(self) -> Iterator[GaugeMetricFamily]:
        nvml = self._nvml
        utilisation = GaugeMetricFamily(
            "inferq_gpu_utilization_ratio", "GPU busy fraction (NVML).", labels=["gpu", "name"]
        )
        used = GaugeMetricFamily(
            "inferq_gpu_memory_used_bytes", "GPU memory in use.", labels=["gpu", "name"]
        )
        total = GaugeMetricFamily(
            "inferq_gpu_memory_total_bytes", "GPU memory in all.", labels=["gpu", "name"]
        )
        for index in range(nvml.nvmlDeviceGetCount()):  # type: ignore[attr-defined]
            handle = nvml.nvmlDeviceGetHandleByIndex(index)  # type: ignore[attr-defined]
            name = str(nvml.nvmlDeviceGetName(handle))  # type: ignore[attr-defined]
            rates = nvml.nvmlDeviceGetUtilizationRates(handle)  # type: ignore[attr-defined]
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)  # type: ignore[attr-defined]
            labels = [str(index), name]
            utilisation.add_metric(labels, rates.gpu / 100)
            used.add_metric(labels, memory.used)
            total.add_metric(labels, memory.total)
        yield utilisation
        yield used
        yield total


def gpu_names() -> list[str]:
    """The GPUs this worker sees; empty on a host without NVIDIA's driver."""
    try:
        return [gpu.name for gpu in gpus()]
    except NvmlUnavailable:
        return []


def register_gpu_collector(registry: CollectorRegistry = REGISTRY) -> bool:
    """Export GPU series if NVML works here; on a CPU host, export none (no error)."""
    nvml = _nvml()
    if nvml is None:
        return False
    registry.register(GpuCollector(nvml))
    return True


def _nvml() -> Any:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - no library, driver or device: a CPU host
        log.debug("no NVML here (%s): GPU metrics are off", exc)
        return None
    return pynvml

"""The API's Prometheus metrics: requests by route and status, latency, queue depths,
stuck jobs, and usage by tenant and model."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inferq.broker.queues import QueueMonitor
from inferq.broker.stuck_jobs import StuckJobs
from inferq.broker.worker_registry import WorkerRegistry
from inferq.exceptions import InferqError
from inferq.store.usage import UsageStore
from inferq.wire.model_catalog import ModelCatalog

log = logging.getLogger(__name__)


class ApiMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.requests = Counter(
            "inferq_api_requests_total",
            "HTTP requests, by method, route and status.",
            ["method", "route", "status"],
            registry=registry,
        )
        self.latency = Histogram(
            "inferq_api_request_duration_seconds",
            "Time to answer a request, by method and route.",
            ["method", "route"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
            registry=registry,
        )


class QueueCollector(Collector):
    """Queue depths and workers online, read from Redis when Prometheus scrapes."""

    def __init__(self, queues: QueueMonitor, workers: WorkerRegistry, models: ModelCatalog) -> None:
        self._queues = queues
        self._workers = workers
        self._models = models

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            bases = sorted({model.base for model in self._models.models()})
            depths = self._queues.depths(bases)
            online = self._workers.online()
        except InferqError as exc:  # Redis or Postgres unreachable: no sample this time
            log.warning("cannot read queue depths: %s", exc.message)
            return
        depth = GaugeMetricFamily(
            "inferq_queue_depth", "Messages waiting in a queue.", labels=["queue"]
        )
        for queue, count in depths.items():
            depth.add_metric([queue], count)
        yield depth
        yield GaugeMetricFamily("inferq_workers_online", "GPU workers online.", value=len(online))
        serving = GaugeMetricFamily(
            "inferq_model_workers_online",
            "GPU workers online serving each model.",
            labels=["model"],
        )
        for base in bases:
            serving.add_metric([base], sum(1 for w in online if w.model == base))
        yield serving


class StuckJobsCollector(Collector):
    """Each served model's stuck jobs, as maintenance counted them at its last pass (it
    writes them to Redis; a scrape never queries Postgres for them)."""

    def __init__(self, stuck: StuckJobs) -> None:
        self._stuck = stuck

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            counts = self._stuck.counts()
        except InferqError as exc:
            log.warning("cannot read stuck jobs: %s", exc.message)
            return
        if not counts:  # maintenance has not counted lately: no sample, rather than a 0
            return
        # A public name, kept for dashboards and alerts: the jobs it counts are stuck.
        stuck = GaugeMetricFamily(
            "inferq_jobs_stalled",
            "Stuck jobs: queued for longer than INFERQ_STALL_S while workers online for "
            "their model had room, by model, at maintenance's last pass.",
            labels=["model"],
        )
        for model, count in sorted(counts.items()):
            stuck.add_metric([model], count)
        yield stuck


class UsageCollector(Collector):
    """Every tenant's usage of every model, all time, read from Postgres's usage table
    when Prometheus scrapes: counters that survive restarts and count what was written
    once (every API process reports the same totals: take one, or their max)."""

    def __init__(self, usage: UsageStore) -> None:
        self._usage = usage

    def collect(self) -> Iterator[CounterMetricFamily]:
        try:
            totals = self._usage.totals()
        except InferqError as exc:
            log.warning("cannot read usage: %s", exc.message)
            return
        families = {
            name: CounterMetricFamily(
                f"inferq_tenant_{name}", help_text, labels=["tenant", "model"]
            )
            for name, help_text in (
                ("input_tokens", "Prompt tokens of generation, by tenant and model."),
                ("output_tokens", "Tokens generated, by tenant and model."),
                ("embedding_tokens", "Tokens embedded, by tenant and model."),
                ("requests", "Single jobs and batch lines that ended, by tenant and model."),
            )
        }
        for tenant, model, usage in totals:
            for name, family in families.items():
                family.add_metric([tenant, model], getattr(usage, name))
        yield from families.values()


class RequestMetrics:
    """ASGI middleware counting requests under their route template (`/v1/jobs/{job_id}`),
    so job ids never become label values."""

    def __init__(self, app: ASGIApp, *, metrics: ApiMetrics) -> None:
        self._app = app
        self._metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def recording_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self._app(scope, receive, recording_send)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            method = scope["method"]
            self._metrics.requests.labels(method, template, str(status)).inc()
            self._metrics.latency.labels(method, template).observe(time.perf_counter() - started)

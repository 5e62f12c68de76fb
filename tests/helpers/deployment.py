"""A whole inferq deployment of a test's own: API, maintenance worker, beat, and GPU
workers the test starts, kills and restarts."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from inferq.domain.jobs import Job, JobStatus
from inferq.exceptions import StoreUnavailable
from inferq.store.database import make_database, make_sessions
from inferq.store.jobs import JobStore
from inferq.store.served_models import ModelStore
from tests.helpers.models import register_model
from tests.helpers.processes import (
    INFERQ,
    ServiceProcess,
    free_port,
    log_contains,
    start_api,
    start_worker,
)


class Deployment:
    def __init__(self, *, env: dict[str, str], log_dir: Path, admin_key: str) -> None:
        self.env = env
        self.log_dir = log_dir
        self.admin_key = admin_key
        self.processes: list[ServiceProcess] = []
        self._engine = make_database(env["INFERQ_DATABASE_URL"], pool_size=2)
        # Sessions on the deployment's database, for tests that read its rows directly.
        self.sessions = make_sessions(self._engine)
        self.store = JobStore(self.sessions)
        self.models = ModelStore(self.sessions)
        self.url = ""

    def start(self, *, registered: bool = True) -> Deployment:
        """API, the GPU-less maintenance worker and beat; GPU workers come separately.
        `registered`: the model is known as if a worker had served it before, so jobs
        submitted before any worker starts are accepted and wait for one."""
        if registered:
            register_model(
                self.env["INFERQ_DATABASE_URL"],
                Path(self.env["INFERQ_MODEL"]),
                name=self.env["INFERQ_SERVED_MODEL_NAME"],
            )
        port = free_port()
        self.processes.append(start_api(env=self.env, port=port, log_dir=self.log_dir))
        self.url = f"http://127.0.0.1:{port}"
        service = ServiceProcess(
            "service",
            [*INFERQ, "webhooks", "--name", "service@test"],
            env=self.env,
            log_dir=self.log_dir,
        )
        beat = ServiceProcess("beat", [*INFERQ, "beat"], env=self.env, log_dir=self.log_dir)
        self.processes += [service, beat]
        service.wait_until(log_contains(service, " ready."), timeout_s=60, what="consuming")
        beat.wait_until(log_contains(beat, "beat: Starting"), timeout_s=60, what="scheduling")
        return self

    def start_worker(
        self,
        name: str,
        *,
        wait: bool = True,
        kill_engine_seed: int | None = None,
        raise_once: str | None = None,
        deaf_control: bool = False,
        **overrides: str,
    ) -> ServiceProcess:
        """A GPU worker with the deployment's settings and `overrides`; `kill_engine_seed`
        `raise_once` and `deaf_control`: see `tests.helpers.processes.start_worker`."""
        worker = start_worker(
            env={**self.env, **overrides},
            log_dir=self.log_dir,
            name=name,
            wait=wait,
            kill_engine_seed=kill_engine_seed,
            raise_once=raise_once,
            deaf_control=deaf_control,
        )
        self.processes.append(worker)
        return worker

    def stop(self) -> None:
        """Tear the deployment down: every process killed (see `ServiceProcess.discard`)."""
        for process in reversed(self.processes):
            process.discard()
        self._engine.dispose()

    def client(self) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.admin_key}"}
        return httpx.Client(base_url=self.url, timeout=60, headers=headers)

    def submit(self, bodies: Sequence[dict[str, Any]]) -> list[str]:
        """Submit jobs concurrently, as a careful client does: each with an
        Idempotency-Key, retried if the connection drops. Returns the ids in order."""

        async def one(client: httpx.AsyncClient, body: dict[str, Any]) -> str:
            headers = {"Idempotency-Key": uuid.uuid4().hex}
            for attempt in range(5):
                try:
                    response = await client.post("/v1/jobs", json=body, headers=headers)
                except httpx.TransportError:
                    await asyncio.sleep(0.2 * (attempt + 1))
                    continue
                if response.status_code == 409:  # the first attempt is still being answered
                    await asyncio.sleep(0.2 * (attempt + 1))
                    continue
                assert response.status_code == 202, response.text
                return str(response.json()["id"])
            raise AssertionError("submission kept failing")

        async def all_of_them() -> list[str]:
            headers = {"Authorization": f"Bearer {self.admin_key}"}
            limits = httpx.Limits(max_connections=32)
            async with httpx.AsyncClient(
                base_url=self.url, headers=headers, timeout=60, limits=limits
            ) as client:
                return await asyncio.gather(*(one(client, body) for body in bodies))

        return asyncio.run(all_of_them())

    def jobs(self, ids: Sequence[str]) -> list[Job]:
        """The jobs as Postgres has them, waiting out a database restart."""
        deadline = time.monotonic() + 60
        while True:
            try:
                by_id = {job.id: job for job in self.store.get_jobs(ids)}
                return [by_id[job_id] for job_id in ids if job_id in by_id]
            except StoreUnavailable:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def wait_until(
        self, ids: Sequence[str], predicate: Any, *, timeout_s: float, what: str
    ) -> list[Job]:
        deadline = time.monotonic() + timeout_s
        while True:
            jobs = self.jobs(ids)
            if predicate(jobs):
                return jobs
            if time.monotonic() > deadline:
                states: dict[str, int] = {}
                for job in jobs:
                    states[job.status] = states.get(job.status, 0) + 1
                logs = "\n".join(f"--- {p.name}\n{p.log_tail(30)}" for p in self.processes)
                raise AssertionError(f"not {what} after {timeout_s} s: {states}\n{logs}")
            time.sleep(0.5)

    def wait_all_ended(self, ids: Sequence[str], *, timeout_s: float = 300) -> list[Job]:
        return self.wait_until(
            ids,
            lambda jobs: len(jobs) == len(ids) and all(j.status.is_terminal for j in jobs),
            timeout_s=timeout_s,
            what="all ended",
        )

    def wait_done_count(self, ids: Sequence[str], count: int, *, timeout_s: float = 120) -> None:
        self.wait_until(
            ids,
            lambda jobs: sum(1 for j in jobs if j.status.is_terminal) >= count,
            timeout_s=timeout_s,
            what=f"{count} ended",
        )

    def kill_holding_running_jobs(self, worker: ServiceProcess, ids: Sequence[str]) -> int:
        """SIGKILL `worker` at a moment it holds running jobs among `ids`, and say how many:
        frozen while it is looked at, so that none ends between the count and the kill;
        looked at again (thawed a moment between looks) if a wave had just ended."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with worker.frozen():
                running = sum(1 for j in self.jobs(ids) if j.status is JobStatus.RUNNING)
                if running:
                    worker.kill_group()
                    return running
            time.sleep(0.05)
        raise AssertionError(f"{worker.name} held no running job whenever it was looked at")

    def wait_done_and_running(
        self, ids: Sequence[str], count: int, *, timeout_s: float = 120
    ) -> None:
        """Wait until `count` jobs have ended and others are running: jobs of one length
        finish together, and just after a wave the next may not be claimed yet."""
        self.wait_until(
            ids,
            lambda jobs: (
                sum(1 for j in jobs if j.status.is_terminal) >= count
                and any(j.status is JobStatus.RUNNING for j in jobs)
            ),
            timeout_s=timeout_s,
            what=f"{count} ended and more running",
        )

"""Long-poll support: wakes requests waiting on a job when the worker announces its end (and
those following a batch's output when lines of it end).

A single job's end is announced on a channel of its own (`inferq.broker.events`), with
what a read would tell of its success; a batch line's on its batch's channel. An API
process subscribes to a channel only while a request waits on it, on one pub/sub
connection; subscriptions begun or let go together (or while the last change is on its
way) go to Redis in one SUBSCRIBE and one UNSUBSCRIBE. A request that submits its job
subscribes before the job is written. For an announcement lost, one sweep every
`RECHECK_S` asks Postgres which of the jobs waited on have ended, in one query: a request
reads its job only when it starts waiting (unless it wrote it) and when woken."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from asyncio import FIRST_COMPLETED
from collections.abc import AsyncIterator, Awaitable, Callable, Collection

from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.exceptions import RedisError
from starlette.concurrency import run_in_threadpool

from inferq.broker.events import (
    EndAnnounced,
    batch_progress_channel,
    done_channel,
    end_announced,
)
from inferq.constants import API_CHANNEL
from inferq.domain.jobs import Job
from inferq.exceptions import InferqError
from inferq.host import supervision

log = logging.getLogger(__name__)

# How long a watch waits for Redis to confirm its subscription before it reads the job
# anyway (it then relies on the sweep, as when Redis is down).
SUBSCRIBE_TIMEOUT_S = 1.0
RECONNECT_S = 1.0
# How often the jobs waited on are looked up in Postgres, in case their announcement
# was lost: the most a lost one delays a waiting request.
RECHECK_S = 1.0

ReadJob = Callable[[str], Awaitable[Job]]
# The job as it ended, from what its announcement carried.
EndedJob = Callable[[EndAnnounced], Job]


class Woken(asyncio.Event):
    """Set when a watched job's end (or a batch's progress) is announced; `announced`:
    what the last announcement carried."""

    def __init__(self) -> None:
        super().__init__()
        self.announced: bytes | str = b""


# Which of these jobs have ended (called in a worker thread).
EndedAmong = Callable[[list[str]], Collection[str]]


class JobWaiter:
    """Subscriptions to the channels of the jobs this process's requests wait on."""

    def __init__(self, redis: Redis, *, key_prefix: str, ended_among: EndedAmong) -> None:
        self._redis = redis
        self._key_prefix = key_prefix
        self._ended_among = ended_among
        # The job each watched job channel is for, for the sweep.
        self._jobs: dict[str, str] = {}
        # Always subscribed, so the listener blocks on the socket even with nobody waiting.
        self._own_channel = f"{key_prefix}{API_CHANNEL}:{secrets.token_hex(8)}"
        self._watchers: dict[str, set[Woken]] = {}
        self._confirmations: dict[str, asyncio.Future[None]] = {}
        # Channels to subscribe to and to leave, sent together by `_send_changes`.
        self._joining: set[str] = set()
        self._leaving: set[str] = set()
        self._changed = asyncio.Event()
        self._pubsub: PubSub | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._connected = asyncio.Event()

    async def start(self) -> None:
        """Start listening; returns once subscribed, or after `SUBSCRIBE_TIMEOUT_S` if
        Redis is out of reach (waits then rely on the sweep until it is back)."""
        self._tasks = [
            supervision.watch_task(asyncio.create_task(self._listen(), name="job-waiter")),
            supervision.watch_task(asyncio.create_task(self._sweep(), name="job-waiter-sweep")),
            supervision.watch_task(
                asyncio.create_task(self._send_changes(), name="job-waiter-subscriptions")
            ),
        ]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._connected.wait(), SUBSCRIBE_TIMEOUT_S)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def watch(self, job_id: str) -> contextlib.AbstractAsyncContextManager[Woken]:
        """An event set whenever `job_id` is reported finished while the block runs; the
        subscription is in place (or Redis is unreachable) when the block starts."""
        return self._watch(done_channel(self._key_prefix, job_id), job_id=job_id)

    def watch_batch(self, batch_id: str) -> contextlib.AbstractAsyncContextManager[Woken]:
        """An event set whenever lines of `batch_id` are reported ended while the block
        runs (as `watch` for a job)."""
        return self._watch(batch_progress_channel(self._key_prefix, batch_id))

    @contextlib.asynccontextmanager
    async def _watch(
        self, channel: str, *, job_id: str | None = None, event: Woken | None = None
    ) -> AsyncIterator[Woken]:
        """`event` (a new one if None), set by each announcement on `channel`."""
        event = event or Woken()
        watchers = self._watchers.setdefault(channel, set())
        first = not watchers
        watchers.add(event)
        if job_id is not None:
            self._jobs[channel] = job_id
        try:
            if first:
                await self._subscribe(channel)
            elif (confirmation := self._confirmations.get(channel)) is not None:
                await asyncio.wait([confirmation], timeout=SUBSCRIBE_TIMEOUT_S)
            yield event
        finally:
            watchers.discard(event)
            if not watchers and self._watchers.get(channel) is watchers:
                del self._watchers[channel]
                self._jobs.pop(channel, None)
                self._unsubscribe(channel)

    async def until_ended(
        self,
        job_id: str,
        read: ReadJob,
        *,
        timeout_s: float | None = None,
        gone: Awaitable[None] | None = None,
        ended: EndedJob | None = None,
    ) -> Job:
        """The job (`read(job_id)`) once it has ended, or as it is when `timeout_s` has
        passed or `gone` (the client hung up, say) has completed first (see `wait`)."""
        given_up = None if gone is None else asyncio.ensure_future(gone)
        try:
            async with self.watch(job_id) as woken, contextlib.AsyncExitStack() as also:
                # Read only once the subscription is in place, so no announced end is missed.
                job = await read(job_id)
                if job.batch_id is not None and not job.status.is_terminal:
                    # A batch line's end is announced on its batch's channel (a cancel
                    # still on its own): read again once that is watched too.
                    channel = batch_progress_channel(self._key_prefix, job.batch_id)
                    await also.enter_async_context(self._watch(channel, event=woken))
                    job = await read(job_id)
                return await self.wait(
                    woken, job, read, timeout_s=timeout_s, gone=given_up, ended=ended
                )
        finally:
            if given_up is not None:
                given_up.cancel()

    async def wait(
        self,
        woken: Woken,
        job: Job,
        read: ReadJob,
        *,
        timeout_s: float | None = None,
        gone: Awaitable[None] | None = None,
        ended: EndedJob | None = None,
    ) -> Job:
        """`job`, watched (`woken`, from `watch(job.id)`) since before it was last read or
        written, once it has ended, or as last read when `timeout_s` has passed or `gone`
        has completed first. Each wake-up reads it again (`read(job.id)`); with `ended`,
        an announcement that carries the job's success ends the wait with
        `ended(announced)`, without a read."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        given_up = None if gone is None else asyncio.ensure_future(gone)
        try:
            while not job.status.is_terminal:
                left = None if deadline is None else deadline - time.monotonic()
                if (left is not None and left <= 0) or (given_up and given_up.done()):
                    break
                waiting = asyncio.ensure_future(woken.wait())
                try:
                    await asyncio.wait(
                        {waiting} if given_up is None else {waiting, given_up},
                        timeout=left,
                        return_when=FIRST_COMPLETED,
                    )
                finally:
                    waiting.cancel()
                if given_up is not None and given_up.done():
                    break
                # Cleared before the read: an end announced during it wakes us again.
                woken.clear()
                if ended is not None and (announced := end_announced(woken.announced)):
                    return ended(announced)
                job = await read(job.id)
        finally:
            if given_up is not None:
                given_up.cancel()
        return job

    async def _subscribe(self, channel: str) -> None:
        if self._pubsub is None:
            return
        confirmation = asyncio.get_running_loop().create_future()
        self._confirmations[channel] = confirmation
        self._leaving.discard(channel)
        self._joining.add(channel)
        self._changed.set()
        try:
            await asyncio.wait([confirmation], timeout=SUBSCRIBE_TIMEOUT_S)
        finally:
            if self._confirmations.get(channel) is confirmation:
                del self._confirmations[channel]

    def _unsubscribe(self, channel: str) -> None:
        if self._pubsub is None:
            return
        self._joining.discard(channel)
        self._leaving.add(channel)
        self._changed.set()

    async def _send_changes(self) -> None:
        """Send the channels watched and let go since the last send, each kind in one
        command: under load, one round trip for many requests instead of two each."""
        while True:
            await self._changed.wait()
            self._changed.clear()
            leaving, self._leaving = self._leaving, set()
            joining, self._joining = self._joining, set()
            pubsub = self._pubsub
            if pubsub is None:  # a reconnect subscribes to every channel watched then
                continue
            try:
                if leaving:
                    await pubsub.unsubscribe(*leaving)
                if joining:
                    await pubsub.subscribe(*joining)
            except RedisError as exc:
                log.debug("cannot change %d subscriptions: %s", len(leaving | joining), exc)
                for channel in joining:  # the sweep covers them until the reconnect
                    confirmation = self._confirmations.get(channel)
                    if confirmation is not None and not confirmation.done():
                        confirmation.set_result(None)

    def _on_message(self, message: dict[str, object]) -> None:
        channel = message["channel"]
        name = channel.decode() if isinstance(channel, bytes) else str(channel)
        if message["type"] == "message":
            data = message["data"]
            for event in self._watchers.get(name, ()):
                event.announced = data if isinstance(data, bytes | str) else b""
                event.set()
        elif message["type"] == "subscribe":
            confirmation = self._confirmations.get(name)
            if confirmation is not None and not confirmation.done():
                confirmation.set_result(None)

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(RECHECK_S)
            jobs = dict(self._jobs)
            if not jobs:
                continue
            try:
                ended = set(await run_in_threadpool(self._ended_among, list(jobs.values())))
            except InferqError as exc:
                log.debug("cannot look up the jobs waited on: %s", exc.message)
                continue
            except Exception:  # the sweep must live on: the next one may do
                log.exception("looking up the jobs waited on failed")
                continue
            for channel, job_id in jobs.items():
                if job_id in ended:
                    for event in self._watchers.get(channel, ()):
                        event.set()

    def _wake_all(self) -> None:
        for watchers in self._watchers.values():
            for event in watchers:
                event.set()

    async def _listen(self) -> None:
        while True:
            pubsub = self._redis.pubsub()
            try:
                # Channels watched before a reconnect are subscribed again with this one.
                channels = list(self._watchers)
                await pubsub.subscribe(self._own_channel, *channels)
                self._pubsub = pubsub
                # Watches that began while this subscribed could not subscribe themselves.
                if missed := set(self._watchers) - set(channels):
                    await pubsub.subscribe(*missed)
                self._connected.set()
                # Whatever ended while the connection was down was not heard: look again.
                self._wake_all()
                while True:
                    message = await pubsub.get_message(timeout=None)
                    if message is not None:
                        self._on_message(message)
            except RedisError as exc:
                # Waiters re-read Postgres every second anyway; this only costs latency.
                log.warning("job waiter lost Redis (%s); resubscribing", exc)
            finally:
                self._pubsub = None
                for confirmation in self._confirmations.values():
                    if not confirmation.done():
                        confirmation.set_result(None)
                with contextlib.suppress(RedisError):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]
            await asyncio.sleep(RECONNECT_S)

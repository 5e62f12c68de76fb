"""Per-key rate limits (requests and tokens per minute), kept in Redis by `limits`.

Async, so a request is counted on the event loop without a hop to a worker thread."""

from __future__ import annotations

import math
import time

from limits import RateLimitItemPerMinute
from limits.aio.storage import RedisStorage
from limits.aio.strategies import MovingWindowRateLimiter, SlidingWindowCounterRateLimiter

from inferq.domain.api_keys import Principal
from inferq.exceptions import InvalidRequest, RetryLater


class RateLimiter:
    """Requests per minute in an exact moving window; tokens per minute in a sliding window
    counter (a moving window would store one entry per token)."""

    def __init__(
        self, redis_url: str, *, key_prefix: str, default_rpm: int, default_tpm: int
    ) -> None:
        storage = RedisStorage(
            "async+" + redis_url, key_prefix=f"{key_prefix}ratelimit", implementation="redispy"
        )
        self._requests = MovingWindowRateLimiter(storage)
        self._tokens = SlidingWindowCounterRateLimiter(storage)
        self._default_rpm = default_rpm
        self._default_tpm = default_tpm

    async def request(self, principal: Principal) -> None:
        """Count one request; raise `RetryLater` past the key's requests per minute."""
        rpm = self._default_rpm if principal.rpm is None else principal.rpm
        if not rpm:
            return
        item = RateLimitItemPerMinute(rpm)
        if not await self._requests.hit(item, "rpm", principal.key_id):
            raise RetryLater(
                f"this API key is limited to {rpm} requests per minute",
                retry_after_s=await self._retry_after(
                    self._requests, item, "rpm", principal.key_id
                ),
                code="rate_limit_exceeded",
            )

    async def tokens(self, principal: Principal, tokens: int) -> None:
        """Count a job's prompt and maximum output tokens against its key's tokens per minute."""
        tpm = self._default_tpm if principal.tpm is None else principal.tpm
        if not tpm:
            return
        if tokens > tpm:
            raise InvalidRequest(
                f"this request needs up to {tokens} tokens (prompt plus max_tokens times n), "
                f"more than this API key's {tpm} tokens per minute: lower max_tokens",
                param="max_tokens",
                code="rate_limit_exceeded",
            )
        item = RateLimitItemPerMinute(tpm)
        if not await self._tokens.hit(item, "tpm", principal.key_id, cost=tokens):
            raise RetryLater(
                f"this API key is limited to {tpm} tokens per minute",
                retry_after_s=await self._retry_after(self._tokens, item, "tpm", principal.key_id),
                code="rate_limit_exceeded",
            )

    @staticmethod
    async def _retry_after(
        limiter: MovingWindowRateLimiter | SlidingWindowCounterRateLimiter,
        item: RateLimitItemPerMinute,
        *identifiers: str,
    ) -> int:
        stats = await limiter.get_window_stats(item, *identifiers)
        return max(1, math.ceil(float(stats.reset_time) - time.time()))

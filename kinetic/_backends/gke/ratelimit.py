"""A client-side token bucket for the Kubernetes API (the API server only answers 429).

``qps`` tokens are added per second up to ``burst``; each request takes one and
waits (on the monotonic clock, cancellably) when none is left. Watches take a
token to open, not per event. Fair: waiters are served in arrival order.
"""

from __future__ import annotations

import anyio

from kinetic._exceptions import ConfigError


class RateLimiter:
    """Token bucket: ``qps`` requests per second sustained, ``burst`` at once."""

    def __init__(self, qps: float, burst: int) -> None:
        if qps <= 0 or burst < 1:
            raise ConfigError(f"rate limit needs qps > 0 and burst >= 1, got {qps}, {burst}")
        self.qps = qps
        self.burst = burst
        self._tokens = float(burst)
        self._stamp: float | None = None
        self._lock = anyio.Lock()
        self.acquired = 0
        """Tokens handed out so far (requests sent), for benchmarks."""

    def __repr__(self) -> str:
        return f"RateLimiter(qps={self.qps}, burst={self.burst})"

    async def acquire(self) -> None:
        """Take one token, waiting for it if the bucket is empty. Cancellable."""
        async with self._lock:
            now = anyio.current_time()
            if self._stamp is not None:
                self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.qps)
            self._stamp = now
            if self._tokens < 1:
                await anyio.sleep((1 - self._tokens) / self.qps)
                self._tokens = 1.0
                self._stamp = anyio.current_time()
            self._tokens -= 1
            self.acquired += 1

"""Requests held while a pool they need has no worker (scaled to zero, or its first worker still starting).

Instead of refusing at once, the router holds such a request until every pool it needs has a routable
worker, within two bounds: at most `max_requests` held at once and each for at most `timeout_s`; past
either the request is refused with 503, Retry-After and the reason. The held count and the oldest hold's
age, per pool, are metrics: the demand the autoscaler sees while a pool has no worker to report it.
A held request whose client leaves is cancelled, and its cancellation takes it out of the queue.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

from tandem.spec_router import WakeQueueSpec
from tandem.worker.router.backend import BackendError

_DEFAULTS = WakeQueueSpec()
MAX_HELD_REQUESTS = _DEFAULTS.max_requests
HOLD_TIMEOUT_S = float(_DEFAULTS.timeout_seconds)
CHECK_INTERVAL_S = 0.05  # how often a held request looks whether its pools have a worker now
TIMED_OUT_RETRY_AFTER_S = 10  # a pool that did not wake within the timeout: come back in a while


@dataclass(frozen=True)
class WakeLimits:
    max_requests: int = MAX_HELD_REQUESTS
    timeout_s: float = HOLD_TIMEOUT_S


@dataclass(frozen=True)
class _Held:
    roles: frozenset[str]
    since: float


class WakeQueue:
    """The requests held now, each with the pools it waits for and since when."""

    def __init__(self, limits: WakeLimits | None = None, clock: Callable[[], float] = time.monotonic):
        self.limits, self.clock = limits or WakeLimits(), clock
        self._held: dict[object, _Held] = {}

    def __len__(self) -> int:
        return len(self._held)

    def held(self, role: str) -> int:
        """Requests held now that wait for `role`."""
        return sum(1 for h in self._held.values() if role in h.roles)

    def oldest_s(self, role: str) -> float:
        """How long the oldest request waiting for `role` has waited (0 with none)."""
        since = [h.since for h in self._held.values() if role in h.roles]
        return self.clock() - min(since) if since else 0.0

    def refusal(self, roles: Collection[str]) -> BackendError:
        """The 503 for a request that finds the queue full: come back when the oldest hold ends at the
        latest, but within TIMED_OUT_RETRY_AFTER_S (the pool may wake well before the timeout)."""
        oldest = max((self.oldest_s(r) for r in roles), default=0.0)
        retry = min(max(1, math.ceil(self.limits.timeout_s - oldest)), TIMED_OUT_RETRY_AFTER_S)
        return BackendError(
            f"no {' or '.join(sorted(roles))} worker yet and {len(self._held)} requests already wait for one "
            f"(router.wakeQueue.maxRequests {self.limits.max_requests})",
            status=503,
            retry_after_s=retry,
        )

    async def hold(self, roles: Collection[str], ready: Callable[[str], bool]) -> float:
        """Wait until `ready(role)` for every role in `roles`; the seconds waited. Raises BackendError (503
        with Retry-After) when the queue is full or the wait outlasts the timeout."""
        waiting = frozenset(r for r in roles if not ready(r))
        if not waiting:
            return 0.0
        if len(self._held) >= self.limits.max_requests:
            raise self.refusal(waiting)
        token, since = object(), self.clock()
        self._held[token] = _Held(waiting, since)
        try:
            while not all(ready(r) for r in waiting):
                if self.clock() - since >= self.limits.timeout_s:
                    raise BackendError(
                        f"no {' or '.join(sorted(r for r in waiting if not ready(r)))} worker came up within "
                        f"{self.limits.timeout_s:g} s (router.wakeQueue.timeoutSeconds)",
                        status=503,
                        retry_after_s=TIMED_OUT_RETRY_AFTER_S,
                    )
                await asyncio.sleep(CHECK_INTERVAL_S)
            return self.clock() - since
        finally:
            del self._held[token]  # answered, refused or cancelled (the client left): never left behind

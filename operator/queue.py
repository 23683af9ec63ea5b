"""Coalescing work queue: at most one reconcile per InferenceService at a time, reruns folded into one."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

log = logging.getLogger("tandem.operator")

Key = tuple[str, str]  # (namespace, name)


class ReconcileQueue:
    """trigger(key) schedules fn(*key, fresh) in a worker thread; triggers during a run cause exactly one rerun.

    `fresh` asks the reconcile to read the API rather than the watch cache; it sticks until a run uses it.
    """

    def __init__(self, fn: Callable[[str, str, bool], object], concurrency: int = 8, retry_seconds: float = 5.0):
        self._fn = fn
        self._sem = asyncio.Semaphore(concurrency)
        self._queued: set[Key] = set()
        self._running: set[Key] = set()
        self._dirty: set[Key] = set()
        self._fresh: set[Key] = set()
        self._retry_seconds = retry_seconds
        self.known: set[Key] = set()

    def trigger(self, key: Key, fresh: bool = False, delay: float = 0.0) -> None:
        """Queue a reconcile; `delay` lets a burst of events (echoes of our own writes) fold into one."""
        if fresh:
            self._fresh.add(key)
        if key in self._running:
            self._dirty.add(key)
        elif key not in self._queued:
            self._queued.add(key)
            asyncio.get_running_loop().create_task(self._run(key, delay))

    async def _run(self, key: Key, delay: float = 0.0) -> None:
        if delay:
            await asyncio.sleep(delay)
        async with self._sem:
            self._queued.discard(key)
            self._running.add(key)
            fresh = key in self._fresh
            self._fresh.discard(key)
            try:
                await asyncio.to_thread(self._fn, *key, fresh)
            except Exception as e:  # retried below; the error is the operator's to report, not to crash on
                log.warning("reconcile %s/%s failed, retrying in %.0fs: %s", *key, self._retry_seconds, e)
                asyncio.get_running_loop().call_later(self._retry_seconds, self.trigger, key, True)
            finally:
                self._running.discard(key)
        if key in self._dirty:
            self._dirty.discard(key)
            self.trigger(key)

    async def resync_forever(self, interval: float) -> None:
        """Level-based safety net: reconcile every known InferenceService from fresh reads every `interval` s."""
        while True:
            await asyncio.sleep(interval)
            for key in list(self.known):
                self.trigger(key, fresh=True)

"""Coalescing work queue: at most one reconcile per InferenceService at a time, reruns folded into one,
failures retried with a per-object backoff."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor

from tandem.operator.runtime.backoff import retry_delay

log = logging.getLogger("tandem.operator")

Key = tuple[str, str]  # (namespace, name)


class _Slots:
    """`n` worker slots handed out in order, new generations first: a new object (or a spec change) waits
    behind other new generations only, never behind the reruns that echoes of earlier writes queued."""

    def __init__(self, n: int):
        self._free = n
        self._waiting: tuple[deque[asyncio.Future[None]], ...] = (deque(), deque())  # urgent, then the rest

    async def acquire(self, urgent: bool) -> None:
        if self._free:
            self._free -= 1
            return
        slot = asyncio.get_running_loop().create_future()
        self._waiting[0 if urgent else 1].append(slot)
        try:
            await slot
        except asyncio.CancelledError:
            if slot.done() and not slot.cancelled():
                self.release()  # handed a slot as it was cancelled: pass it on
            raise

    def release(self) -> None:
        for waiting in self._waiting:
            while waiting:
                slot = waiting.popleft()
                if not slot.done():
                    slot.set_result(None)
                    return
        self._free += 1

    def waiting(self) -> int:
        return sum(len(w) for w in self._waiting)


class ReconcileQueue:
    """trigger(key) schedules fn(*key, fresh) in a worker thread; triggers during a run cause exactly one
    rerun. A trigger that brings a new generation of the object (a new object, a spec change) takes the next
    free worker before the other waiting runs.

    `fresh` asks the reconcile to read the API rather than the watch cache; it sticks until a run uses it.
    After a failure the object waits `backoff(error, failures)` seconds; every trigger in that time (child
    events, resyncs, our own status writes) folds into that one retry, unless it brings a new generation of
    the object, which is retried at once.
    """

    def __init__(
        self,
        fn: Callable[[str, str, bool], object],
        concurrency: int = 8,
        backoff: Callable[[BaseException, int], float] = retry_delay,
    ):
        self._fn = fn
        self.slots = _Slots(concurrency)
        # threads of its own: asyncio's default pool (CPUs + 4) is smaller than `concurrency` on a small node
        # and is shared with the autoscaler's ticks
        self._threads = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="reconcile")
        self._queued: set[Key] = set()
        self._running: set[Key] = set()
        self._dirty: set[Key] = set()
        self._fresh: set[Key] = set()
        self._backoff = backoff
        self._failures: dict[Key, int] = {}
        self._waiting: dict[Key, asyncio.TimerHandle] = {}  # objects in backoff and their retry timer
        self._generation: dict[Key, int] = {}  # newest generation seen per object
        self._urgent: set[Key] = set()  # objects whose next run brings a new generation
        self._failed_generation: dict[Key, int | None] = {}
        self._rechecks: dict[Key, asyncio.TimerHandle] = {}  # a later look the last run asked for
        self.known: set[Key] = set()

    def trigger(
        self, key: Key, fresh: bool = False, delay: float = 0.0, generation: int | None = None
    ) -> None:
        """Queue a reconcile; `delay` lets a burst of events (echoes of our own writes) fold into one.

        `generation` is the object's metadata.generation when the trigger comes from the object itself.
        """
        if generation is not None and generation != self._generation.get(key):
            self._generation[key] = generation
            self._failures.pop(key, None)  # a new spec starts a new backoff
            self._urgent.add(key)
        if fresh:
            self._fresh.add(key)
        if key in self._waiting:
            if self._generation.get(key) == self._failed_generation.get(key):
                return  # folded into the pending retry
            self._waiting.pop(key).cancel()
        if key in self._running:
            self._dirty.add(key)
        elif key not in self._queued:
            self._queued.add(key)
            asyncio.get_running_loop().create_task(self._run(key, delay))

    def forget(self, key: Key) -> None:
        """The object is gone: drop its backoff and history."""
        self.known.discard(key)
        self._urgent.discard(key)
        for timers in (self._waiting, self._rechecks):
            if key in timers:
                timers.pop(key).cancel()
        for table in (self._failures, self._generation, self._failed_generation):
            table.pop(key, None)

    def _recheck(self, key: Key, after: float | None) -> None:
        """One pending look-again per object: the newest run's request replaces the older one."""
        if key in self._rechecks:
            self._rechecks.pop(key).cancel()
        if after:
            self._rechecks[key] = asyncio.get_running_loop().call_later(after, self.trigger, key)

    def _retry(self, key: Key) -> None:
        self._waiting.pop(key, None)
        self.trigger(key, fresh=True)

    async def _run(self, key: Key, delay: float = 0.0) -> None:
        if delay:
            await asyncio.sleep(delay)
        await self.slots.acquire(key in self._urgent)
        try:
            self._queued.discard(key)
            self._urgent.discard(key)
            self._running.add(key)
            fresh = key in self._fresh
            self._fresh.discard(key)
            started = self._generation.get(key)
            try:
                result = await asyncio.get_running_loop().run_in_executor(
                    self._threads, self._fn, *key, fresh
                )
            except Exception as e:  # retried below; the error is the operator's to report, not to crash on
                self._failed(key, e, started)
            else:
                self._failures.pop(key, None)
                self._recheck(key, getattr(result, "recheck_after", None))
            finally:
                self._running.discard(key)
        finally:
            self.slots.release()
        if key in self._dirty:
            self._dirty.discard(key)
            self.trigger(key)

    def _failed(self, key: Key, error: Exception, started: int | None) -> None:
        failures = self._failures[key] = self._failures.get(key, 0) + 1
        if self._generation.get(key) != started:
            log.warning("reconcile %s/%s failed, retrying the new generation now: %s", *key, error)
            return  # the object changed during the run: the dirty rerun tries the new spec
        wait = self._backoff(error, failures)
        log.warning(
            "reconcile %s/%s failed (%d in a row), retrying in %.0fs: %s", *key, failures, wait, error
        )
        self._dirty.discard(key)
        self._fresh.add(key)
        self._failed_generation[key] = started
        self._waiting[key] = asyncio.get_running_loop().call_later(wait, self._retry, key)

    async def resync_forever(
        self, interval: float, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    ) -> None:
        """Level-based safety net: reconcile every known InferenceService from fresh reads once every
        `interval` s, spread over the interval, so that a burst of resyncs never queues ahead of an object
        that just changed."""
        while True:
            keys = list(self.known)
            if not keys:
                await sleep(interval)
            for key in keys:
                await sleep(interval / len(keys))
                if key in self.known:
                    self.trigger(key, fresh=True)

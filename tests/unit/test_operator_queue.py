"""The reconcile queue runs one reconcile per object at a time and folds bursts of triggers together."""

import asyncio
import threading
import time

from tandem.operator.queue import ReconcileQueue


def test_burst_folds_into_at_most_one_rerun_and_fresh_sticks():
    calls: list[tuple[str, str, bool]] = []
    active = threading.Semaphore(1)

    def fn(ns, name, fresh):
        assert active.acquire(blocking=False), "two reconciles of one object at once"
        calls.append((ns, name, fresh))
        time.sleep(0.05)
        active.release()

    async def main():
        q = ReconcileQueue(fn, concurrency=4)
        q.trigger(("ns", "a"))
        await asyncio.sleep(0.01)  # first run in progress
        for _ in range(20):
            q.trigger(("ns", "a"))
        q.trigger(("ns", "a"), fresh=True)
        await asyncio.sleep(0.3)

    asyncio.run(main())
    assert calls == [("ns", "a", False), ("ns", "a", True)]


def test_delayed_triggers_fold_and_failures_retry_fresh():
    calls: list[bool] = []

    def fn(ns, name, fresh):
        calls.append(fresh)
        if len(calls) == 1:
            raise RuntimeError("API down")

    async def main():
        q = ReconcileQueue(fn, retry_seconds=0.05)
        for _ in range(10):
            q.trigger(("ns", "b"), delay=0.02)
        await asyncio.sleep(0.3)

    asyncio.run(main())
    assert calls == [False, True]

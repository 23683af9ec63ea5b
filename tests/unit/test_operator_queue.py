"""The reconcile queue runs one reconcile per object at a time, folds bursts of triggers together, and backs
off per object after failures."""

import asyncio
import threading
import time

import pytest

from tandem.operator.runtime.backoff import CAP_SECONDS, is_permanent, retry_delay
from tandem.operator.runtime.kube import ApiError
from tandem.operator.runtime.queue import ReconcileQueue


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
        q = ReconcileQueue(fn, backoff=lambda e, n: 0.05)
        for _ in range(10):
            q.trigger(("ns", "b"), delay=0.02)
        await asyncio.sleep(0.3)

    asyncio.run(main())
    assert calls == [False, True]


def test_a_new_generation_takes_the_next_worker_before_reruns_queued_ahead_of_it():
    order: list[str] = []
    started, go = threading.Event(), threading.Event()

    def fn(ns, name, fresh):
        if name == "busy":
            started.set()
            go.wait(10)
        order.append(name)

    async def main():
        q = ReconcileQueue(fn, concurrency=1)
        q.trigger(("ns", "busy"))
        await asyncio.to_thread(started.wait, 10)  # the only worker is taken
        q.trigger(("ns", "echo"))  # a child event of an object already reconciled
        q.trigger(("ns", "new"), generation=1)  # a new object, queued after it
        while q.slots.waiting() < 2:
            await asyncio.sleep(0)
        go.set()
        while len(order) < 3:
            await asyncio.sleep(0.01)

    asyncio.run(main())
    assert order == ["busy", "new", "echo"]


def test_retry_delay_doubles_to_a_cap_and_permanent_answers_wait_the_cap():
    down = ConnectionError("refused")
    assert [retry_delay(down, n, base=1, cap=30) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]
    for status in (400, 403, 422):
        assert is_permanent(ApiError(status, "{}"))
        assert retry_delay(ApiError(status, "{}"), 1) == CAP_SECONDS
    for status in (409, 429, 500, 503):
        assert not is_permanent(ApiError(status, "{}"))
        assert retry_delay(ApiError(status, "{}"), 1, base=1) == 1
    typo = '{"message": "failed to create typed patch object (ns/x-decode; apps/v1, Kind=Deployment): ..."}'
    assert is_permanent(ApiError(500, typo))


def test_triggers_during_a_backoff_fold_into_one_retry_with_growing_waits():
    """Child events and resyncs must not turn a failing object into a hot loop."""
    calls: list[bool] = []
    asked: list[int] = []

    def fn(ns, name, fresh):
        calls.append(fresh)
        raise ApiError(500, '{"message": "etcd timeout"}')

    def backoff(error, failures):
        asked.append(failures)
        return 0.1

    async def main() -> float:
        start = time.monotonic()
        q = ReconcileQueue(fn, backoff=backoff)
        q.trigger(("ns", "c"), generation=1)
        for _ in range(100):  # a storm of child events and resyncs
            await asyncio.sleep(0.0035)
            q.trigger(("ns", "c"), delay=0.001)
            q.trigger(("ns", "c"), fresh=True)
        q.forget(("ns", "c"))
        return time.monotonic() - start

    elapsed = asyncio.run(main())
    # one run per 0.1 s backoff period (however slow this machine ran the storm), not one per trigger
    assert 2 <= len(calls) <= elapsed / 0.1 + 1, (calls, elapsed)
    assert asked == list(range(1, len(calls) + 1))  # the count of failures in a row grows
    assert all(calls[1:])  # retries read fresh


@pytest.mark.parametrize("status", [403, 422])
def test_permanent_error_waits_for_a_new_generation(status):
    generations: list[int] = []
    current = {"generation": 1}

    def fn(ns, name, fresh):
        generations.append(current["generation"])
        if current["generation"] == 1:
            raise ApiError(status, '{"message": "no"}')

    async def main():
        q = ReconcileQueue(fn)  # the real backoff: a permanent answer waits CAP_SECONDS
        q.trigger(("ns", "d"), generation=1)
        await asyncio.sleep(0.05)
        for _ in range(20):
            q.trigger(("ns", "d"))  # child events
            q.trigger(("ns", "d"), generation=1)  # our own status write, same generation
        await asyncio.sleep(0.1)
        assert generations == [1]
        current["generation"] = 2
        q.trigger(("ns", "d"), generation=2)  # the user fixed the spec
        await asyncio.sleep(0.1)
        q.forget(("ns", "d"))

    asyncio.run(main())
    assert generations == [1, 2]


def test_a_run_that_asks_for_a_recheck_runs_again_once():
    class Outcome:
        def __init__(self, after):
            self.recheck_after = after

    calls: list[bool] = []

    def fn(ns, name, fresh):
        calls.append(fresh)
        return Outcome(0.05 if len(calls) == 1 else None)

    async def main():
        q = ReconcileQueue(fn)
        q.trigger(("ns", "e"))
        await asyncio.sleep(0.4)

    asyncio.run(main())
    assert len(calls) == 2


def test_the_resync_spreads_its_objects_over_the_interval():
    """One fresh trigger per object per interval, one at a time, so new objects never wait behind all of
    them."""
    naps: list[float] = []
    triggered: list[list[tuple[str, str]]] = []

    async def main():
        q = ReconcileQueue(lambda ns, name, fresh: None)
        q.known.update({("ns", "a"), ("ns", "b"), ("ns", "c"), ("ns", "d")})
        seen: list[tuple[str, str]] = []
        q.trigger = lambda key, fresh=False, **_: seen.append(key) if fresh else None  # type: ignore[method-assign]

        async def sleep(s: float) -> None:
            naps.append(s)
            triggered.append(list(seen))
            if len(naps) == 9:
                raise asyncio.CancelledError

        with pytest.raises(asyncio.CancelledError):
            await q.resync_forever(40.0, sleep=sleep)

    asyncio.run(main())
    assert naps == [10.0] * 9
    assert [len(t) for t in triggered] == list(range(9))  # one object per nap, none in a burst
    assert sorted(triggered[-1][:4]) == sorted(triggered[-1][4:]) == [("ns", k) for k in "abcd"]

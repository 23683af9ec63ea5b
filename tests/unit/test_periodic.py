"""tandem.periodic.Every: calls its check each period, keeps going after a check raises, and stops."""

from __future__ import annotations

import threading

from tandem.periodic import Every


def test_every_keeps_calling_after_a_failure_and_stops_when_told():
    calls: list[int] = []
    third = threading.Event()

    def check() -> None:
        calls.append(len(calls))
        if len(calls) == 1:
            raise RuntimeError("the first check fails")
        if len(calls) >= 3:
            third.set()

    every = Every(0.01, check, "test-every").start()
    assert third.wait(5), f"only {len(calls)} calls"
    every.stop(join_s=5)
    stopped_at = len(calls)
    threading.Event().wait(0.1)
    assert len(calls) == stopped_at, "a stopped Every called its check again"
    assert not every._thread.is_alive()

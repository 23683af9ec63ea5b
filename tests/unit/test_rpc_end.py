"""on_rpc_end: cleanup runs when the call ends, and at once for a call already over (over real gRPC:
tests/integration/test_client_leaves.py)."""

from __future__ import annotations

from tandem.worker.serve.rpc_end import on_rpc_end


class _Context:
    def __init__(self, active: bool) -> None:
        self.active, self.callbacks = active, []

    def add_callback(self, fn) -> bool:
        if self.active:
            self.callbacks.append(fn)
        return self.active


def test_cleanup_waits_for_the_end_of_a_live_call_and_runs_at_once_for_a_finished_one():
    ran = []
    live = _Context(active=True)
    on_rpc_end(live, lambda: ran.append("live"))
    assert ran == []
    for fn in live.callbacks:  # what gRPC does when the call ends
        fn()
    assert ran == ["live"]
    on_rpc_end(_Context(active=False), lambda: ran.append("over"))
    assert ran == ["live", "over"]

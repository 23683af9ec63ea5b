"""Cleanup when a gRPC call ends, also for a call that ended before the cleanup could be registered."""

from __future__ import annotations

from collections.abc import Callable

import grpc


def on_rpc_end(context: grpc.ServicerContext, cleanup: Callable[[], None]) -> None:
    """`cleanup()` once the call ends (gRPC runs it on its polling thread: it must not wait); at once when
    the call is already over, which add_callback reports by returning False."""
    if not context.add_callback(cleanup):
        cleanup()

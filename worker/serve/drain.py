"""Drain-safe exit of a worker: on SIGTERM or a Drain RPC, stop taking work, finish what is held, then exit.

A draining worker reports NOT_SERVING at once and refuses new reservations, prefills and generations,
but keeps serving every RPC that finishes work already accepted (PushKv, StreamTokens, Abort, Load), so
a decode worker still receives the KV a prefill worker is pushing to it and its running sequences
stream to the end. It exits when nothing is held or when the drain deadline passes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

import grpc
from grpc_health.v1 import health, health_pb2

from tandem import names
from tandem.v1 import lifecycle_pb2, lifecycle_pb2_grpc

log = logging.getLogger(__name__)


class Drainable(Protocol):
    draining: bool

    def busy(self) -> int:
        """Work still held: sequences, reservations waiting for KV, requests in flight."""
        ...


def refuse_while_draining(context: grpc.ServicerContext, what: str) -> None:
    """Abort the RPC with UNAVAILABLE and the draining marker (the router retries elsewhere)."""
    context.set_trailing_metadata(((names.DRAINING_METADATA_KEY, "1"),))
    context.abort(grpc.StatusCode.UNAVAILABLE, f"{what} is draining")


class Drainer:
    """Starts the drain once (signal or RPC), then waits for the servicer to hold nothing or for the
    deadline."""

    def __init__(
        self,
        servicer: Drainable,
        health_servicer: health.HealthServicer,
        timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.servicer, self.health, self.timeout_s, self.clock = servicer, health_servicer, timeout_s, clock
        self.started = threading.Event()
        self._deadline = float("inf")
        self._lock = threading.RLock()  # a second signal may arrive inside begin()

    def begin(self, reason: str) -> None:
        with self._lock:
            if self.started.is_set():
                return
            self.servicer.draining = True
            self.health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
            self._deadline = self.clock() + self.timeout_s
            self.started.set()
        log.info(
            "draining (%r): %d held, exiting within %.0f s", reason, self.servicer.busy(), self.timeout_s
        )

    def seconds_left(self) -> float:
        return max(0.0, self._deadline - self.clock()) if self.started.is_set() else self.timeout_s

    def wait_drained(self, poll_s: float = 0.05) -> bool:
        """Block until a drain has begun and finished; False when the deadline cut it short."""
        while not self.started.wait(timeout=0.5):  # timed: a signal the kernel hands to another thread
            pass  # only runs its Python handler once the main thread wakes, which a bare wait() never does
        while self.servicer.busy() > 0:
            if self.clock() >= self._deadline:
                log.warning("drain deadline passed with %d still held", self.servicer.busy())
                return False
            time.sleep(poll_s)
        return True

    # --- the Drain RPC ------------------------------------------------------------------------
    def Drain(
        self, request: lifecycle_pb2.DrainRequest, context: grpc.ServicerContext
    ) -> lifecycle_pb2.DrainReply:
        self.begin(request.reason or "Drain RPC")
        return lifecycle_pb2.DrainReply(
            draining=True, busy=self.servicer.busy(), deadline_s=self.seconds_left()
        )


class Lifecycle:
    """The LifecycleService: Drain from the drainer, SetRole from what holds the worker's role."""

    def __init__(self, drainer: Drainer, roles: object | None = None) -> None:
        self.Drain = drainer.Drain
        self.roles = roles

    def SetRole(
        self, request: lifecycle_pb2.SetRoleRequest, context: grpc.ServicerContext
    ) -> lifecycle_pb2.SetRoleReply:
        if self.roles is None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "this server does not change role")
        return self.roles.SetRole(request, context)  # type: ignore[union-attr]


def add_to_server(server: grpc.Server, drainer: Drainer, roles: object | None = None) -> None:
    lifecycle_pb2_grpc.add_LifecycleServiceServicer_to_server(Lifecycle(drainer, roles), server)  # type: ignore[arg-type]

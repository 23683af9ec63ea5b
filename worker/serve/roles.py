"""A worker's role as state: its prefill, decode and colocated services live in the process on one engine,
and SetRole moves the work from one to another without reloading anything.

Only the current role's service takes work; the others refuse it the way a draining worker does
(UNAVAILABLE with the draining marker, so the router retries elsewhere). SetRole stops the current role
taking work, waits for what it holds to finish (the drain that exists, without exiting), then opens the
other role; Load (whichever service is asked) and the `role/<role>` health statuses report the role it
has now. Weights, KV cache, compiled graphs and the gRPC server are untouched.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import grpc
from grpc_health.v1 import health, health_pb2

from tandem import names
from tandem.v1 import common_pb2, lifecycle_pb2
from tandem.worker.serve.wire import ROLES

log = logging.getLogger(__name__)
ROLE_NAMES = {v: k for k, v in ROLES.items()}
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class RoleServicer(Protocol):
    draining: bool

    def busy(self) -> int: ...

    def own_load(self) -> common_pb2.LoadReport: ...

    def activate(self, active: bool) -> None: ...


class RoleRefused(Exception):
    """This worker cannot take the role asked for (FAILED_PRECONDITION)."""


class DrainTimedOut(Exception):
    """The old role's work did not finish in time; the worker keeps its role (ABORTED)."""


@dataclass(frozen=True)
class Flip:
    previous: str
    role: str
    drain_s: float
    switch_s: float


def refusal(
    to: str, current: str, servicers: Mapping[str, object], certified: frozenset[str] | None, exiting: bool
) -> str | None:
    """Why this worker may not take role `to` (pure); None when it may."""
    if exiting:
        return "the worker is draining to exit"
    if to not in servicers:
        return f"a {current} worker cannot take the role {to!r} (it serves {', '.join(sorted(servicers))})"
    if certified is not None and to not in certified:
        return (
            f"this worker's certificate does not name the role {to!r} (it names "
            f"{', '.join(sorted(certified))}); turn spec.roleFlip on so workers get certificates for every "
            "worker role"
        )
    return None


class RoleSwitch:
    """The worker's role and its services by role; the drain target of the exit drain (all roles at once)."""

    def __init__(
        self,
        servicers: Mapping[str, RoleServicer],
        role: str,
        info: common_pb2.WorkerInfo,
        health_servicer: health.HealthServicer | None = None,
        certified: frozenset[str] | None = None,
        drain_timeout_s: float = 30.0,
        on_switch: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.servicers, self.role, self.info, self.health = dict(servicers), role, info, health_servicer
        self.certified = certified  # roles this worker's certificate names; None in plaintext (any)
        self.drain_timeout_s, self.on_switch, self.clock = drain_timeout_s, on_switch, clock
        self._exiting = False
        self._flip = threading.Lock()  # one SetRole at a time
        for r, s in self.servicers.items():
            s.draining = r != role
            s.activate(r == role)
        self._report_health()

    # --- the exit drain sees the whole worker ---------------------------------------------------
    @property
    def draining(self) -> bool:
        return self._exiting

    @draining.setter
    def draining(self, value: bool) -> None:
        self._exiting = value
        if value:
            for s in self.servicers.values():
                s.draining = True

    def busy(self) -> int:
        return sum(s.busy() for s in self.servicers.values())

    def load(self) -> common_pb2.LoadReport:
        """The current role's load report, whichever service was asked."""
        return self.servicers[self.role].own_load()

    # --- the flip -------------------------------------------------------------------------------
    def set_role(self, to: str, drain_timeout_s: float = 0.0, reason: str = "") -> Flip:
        """Drain the current role's work, then serve `to`. Raises RoleRefused or DrainTimedOut."""
        with self._flip:
            current = self.role
            problem = refusal(to, current, self.servicers, self.certified, self._exiting)
            if problem:
                raise RoleRefused(problem)
            if to == current:
                return Flip(current, current, 0.0, 0.0)
            old = self.servicers[current]
            start = self.clock()
            old.draining = True  # new work is refused from now on; the router retries elsewhere
            log.info(
                "changing role %s -> %s (%s): draining %d held", current, to, reason or "SetRole", old.busy()
            )
            deadline = start + (drain_timeout_s or self.drain_timeout_s)
            while old.busy() > 0:
                if self.clock() >= deadline:
                    old.draining = self._exiting
                    raise DrainTimedOut(
                        f"{old.busy()} still held by the {current} role after "
                        f"{self.clock() - start:.1f} s; the worker stays {current}"
                    )
                time.sleep(0.01)
            drained = self.clock()
            old.activate(False)
            self.servicers[to].activate(True)
            self.info.role = ROLES[to]
            self.role = to
            if self.on_switch is not None:
                self.on_switch(to)
            self.servicers[to].draining = self._exiting
            self._report_health()
            done = self.clock()
        log.info(
            "now a %s worker (drained in %.3f s, switched in %.3f s)", to, drained - start, done - drained
        )
        return Flip(current, to, drained - start, done - drained)

    def _report_health(self) -> None:
        if self.health is None:
            return
        for r in self.servicers:
            self.health.set(names.WORKER_ROLE_SERVICE_PREFIX + r, SERVING if r == self.role else NOT_SERVING)

    # --- the SetRole RPC ------------------------------------------------------------------------
    def SetRole(
        self, request: lifecycle_pb2.SetRoleRequest, context: grpc.ServicerContext
    ) -> lifecycle_pb2.SetRoleReply:
        to = ROLE_NAMES.get(request.role)
        if to is None:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "SetRole needs a role: prefill, decode or colocated"
            )
        assert to is not None
        try:
            flip = self.set_role(to, request.drain_timeout_s, request.reason)
        except RoleRefused as e:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        except DrainTimedOut as e:
            context.abort(grpc.StatusCode.ABORTED, str(e))
        return lifecycle_pb2.SetRoleReply(
            role=ROLES[flip.role],
            previous_role=ROLES[flip.previous],
            drain_s=flip.drain_s,
            switch_s=flip.switch_s,
        )

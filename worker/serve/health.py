"""What a worker's health service says: liveness follows the engine loop itself (its thread alive, coming
round, its steps not failing one after another), readiness that and not draining."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from grpc_health.v1 import health, health_pb2

from tandem import names
from tandem.options import ENGINE_STALL_S
from tandem.periodic import Every
from tandem.worker.engine.runner.engine_loop import EngineLoop

log = logging.getLogger(__name__)

STALL_S = ENGINE_STALL_S  # an engine loop that has not come round for this long is stuck
FAILED_STEPS_LIMIT = 3  # steps failing in a row: a broken device or CUDA context, not one bad request
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def engine_problem(
    running: bool,
    beat_age_s: float,
    failed_steps: int,
    stall_s: float = STALL_S,
    failed_limit: int = FAILED_STEPS_LIMIT,
) -> str | None:
    """Why the engine is not live (pure), or None when it is."""
    if not running:
        return "the engine loop has stopped"
    if failed_steps >= failed_limit:
        return f"the last {failed_steps} engine steps failed"
    if beat_age_s > stall_s:
        return f"the engine loop has not come round for {beat_age_s:.0f} s"
    return None


class HealthWatch:
    """Keeps the health service's liveness and readiness in step with the engine, every `every_s` seconds."""

    def __init__(
        self,
        loop: EngineLoop,
        health_servicer: health.HealthServicer,
        draining: Callable[[], bool],
        every_s: float = 1.0,
        stall_s: float = STALL_S,
    ) -> None:
        self.loop, self.health, self.draining = loop, health_servicer, draining
        self.every_s, self.stall_s = every_s, stall_s
        self.problem: str | None = None
        self._every = Every(every_s, self.check, "health-watch")

    def check(self) -> str | None:
        """Set both statuses from the engine's state now; returns the problem, if any."""
        loop = self.loop
        problem = engine_problem(loop.running, time.monotonic() - loop.beat, loop.failed_steps, self.stall_s)
        if problem != self.problem:
            (log.error if problem else log.info)("engine %s", problem or "healthy again")
            self.problem = problem
        self.health.set(names.WORKER_LIVENESS_SERVICE, NOT_SERVING if problem else SERVING)
        self.health.set("", NOT_SERVING if problem or self.draining() else SERVING)  # a drain is for good
        return problem

    def start(self) -> HealthWatch:
        self.check()
        self._every.start()
        return self

    def stop(self) -> None:
        self._every.stop()

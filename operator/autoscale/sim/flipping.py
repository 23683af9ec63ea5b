"""Role flips in the simulator: a worker asked to flip stops taking work of its old role at once, hands its
queued work (prompts not started, sequences not admitted) to the rest of its pool, finishes what it runs,
and serves the new role `flip_s` after its drain. It is billed throughout, as the pod it is."""

from __future__ import annotations

from collections.abc import Sequence

from tandem.operator.autoscale.core.types import Pool
from tandem.operator.autoscale.sim.simulator import (
    Control,
    Controller,
    Replica,
    SimConfig,
    SimResult,
    Simulation,
)
from tandem.trace import TraceRequest


class FlipSimulation(Simulation):
    def __init__(self, trace: Sequence[TraceRequest], config: SimConfig, controller: Controller):
        self.homes: dict[int, Pool] = {}  # the pool each flipped worker was created in (its Deployment)
        super().__init__(trace, config, controller)

    def _act(self, out: dict[Pool, int] | Control) -> None:
        if not isinstance(out, Control):
            super()._act(out)
            return
        super()._act(out.replicas)  # the counts were decided before the flips: apply them first
        for source, target, count in out.flips:
            self.flip(source, target, count)

    def flip(self, source: Pool, target: Pool, count: int) -> int:
        """Flip up to `count` ready workers of `source`: those away from home first, then the least loaded."""
        candidates = sorted(
            (r for r in self.replicas[source] if r.ready(self.now)),
            key=lambda r: (self.homes.get(r.id) != target, self._work(r), r.id),
        )
        chosen = candidates[:count]
        for rep in chosen:
            self.homes.setdefault(rep.id, source)
            self._start_flip(rep, target)
        if chosen:
            self.flips.append((self.now, source, target, len(chosen)))
        return len(chosen)

    def _start_flip(self, rep: Replica, target: Pool) -> None:
        rep.flip_to, rep.draining, rep.flipped = target, True, True
        if rep.pool == Pool.prefill:
            queued, rep.queue = list(rep.queue), type(rep.queue)()
            rep.queued_tokens -= sum(r.input_len for r in queued)
            for req in queued:
                self._to_prefill(req)
        else:
            self._advance(rep)
            waiting, rep.waiting = list(rep.waiting), type(rep.waiting)()
            for req in waiting:
                self._to_decode(req)
        if rep.idle():
            self._drained(rep)

    def _drained(self, rep: Replica) -> None:
        if rep.flip_to is None:
            super()._drained(rep)
            return
        self.replicas[rep.pool].remove(rep)
        rep.pool, rep.flip_to, rep.draining = rep.flip_to, None, False
        rep.ready_at_s = self.now + self.cfg.flip_s
        rep.busy_until_s, rep.segment_start_s, rep.step_s = self.now, self.now, 0.0
        rep.version += 1
        self.replicas[rep.pool].append(rep)
        self._push(rep.ready_at_s, "ready", rep)

    def _incoming(self, pool: Pool) -> int:
        return sum(
            1 for reps in self.replicas.values() for r in reps if r.flip_to == pool and r.gone_s is None
        )


def simulate_with_flips(
    trace: Sequence[TraceRequest], config: SimConfig, controller: Controller
) -> SimResult:
    return FlipSimulation(trace, config, controller).run()

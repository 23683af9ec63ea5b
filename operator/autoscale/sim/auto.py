"""The service's shape as the autoscaler's choice in the simulator (`auto`): colocated workers or split pools,
switched by the shape rule (autoscale/shape.py) on top of tandem's per-pool policy.

Colocated workers serve as in sim/colocated.py and split pools as in sim/simulator.py, side by side in one
run. A shape change sends new requests to the new shape at once and flips the old shape's ready workers to
the new roles (sim/flipping.py: each drains what it holds, then serves its new role `flip_s` later); workers
the new shape does not need drain away, and a shortfall starts cold. Requests arriving while no worker of
the new shape is ready wait for the first one. A prompt whose prefill ends after every decode worker has
gone is decoded by a colocated worker (its KV was reserved there before the drain).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

from tandem.operator.autoscale.core.config import PolicyConfig
from tandem.operator.autoscale.core.policy import PolicyState, decide
from tandem.operator.autoscale.core.shape import (
    Learned,
    Shape,
    ShapeAction,
    ShapeConfig,
    ShapeLoad,
    decide_shape,
    learn_colocated,
    peak_load,
)
from tandem.operator.autoscale.core.types import Pool
from tandem.operator.autoscale.sim.colocated import ColocatedSimulation
from tandem.operator.autoscale.sim.flipping import FlipSimulation
from tandem.operator.autoscale.sim.simulator import (
    Control,
    Controller,
    Replica,
    Request,
    SimConfig,
    SimResult,
    Simulation,
    Snapshot,
)
from tandem.trace import TraceRequest

SPLIT = (Pool.prefill, Pool.decode)


@dataclass(frozen=True)
class ShapeChange(Control):
    """A controller's answer that changes the shape: flip the old shape's ready workers to `target`'s roles
    (up to its counts), let the rest drain away, and start what is still missing."""

    target: Shape = field(default_factory=Shape)
    reason: str = ""


class AutoSimulation(FlipSimulation, ColocatedSimulation):
    workers = Pool.colocated

    def __init__(self, trace: Sequence[TraceRequest], config: SimConfig, controller: Controller):
        self._split = not config.initial.get(Pool.colocated)  # the shape new requests go to
        self._pending_colocated: deque[Request] = deque()
        self.colocated_timeline: list[tuple[float, int]] = []
        self.shape_changes: list[tuple[float, str, str, str]] = []  # (t, from, to, reason)
        super().__init__(trace, config, controller)

    def run(self) -> SimResult:
        result = super().run()
        result.colocated_timeline, result.shape_changes = self.colocated_timeline, self.shape_changes
        return result

    def _observed_pools(self) -> tuple[Pool, ...]:
        return SPLIT if self._split else (Pool.colocated,)

    def _on_tick(self, payload: object) -> None:
        super()._on_tick(payload)
        self.colocated_timeline.append((self.now, len(self._billed(Pool.colocated))))

    # --- the shape change ----------------------------------------------------------------------------
    def _act(self, out: dict[Pool, int] | Control) -> None:
        if not isinstance(out, ShapeChange):
            super()._act(out)
            return
        before = self._shape()
        self._split = out.target.split
        wanted = (
            {Pool.prefill: out.target.prefill, Pool.decode: out.target.decode}
            if out.target.split
            else {Pool.colocated: out.target.colocated}
        )
        old = (Pool.colocated,) if out.target.split else SPLIT
        for (
            target,
            count,
        ) in wanted.items():  # the least loaded ready workers of the old shape take the new roles
            for source in old:
                count -= self.flip(source, target, count) if count > 0 else 0
        for pool in old:
            self._scale(pool, 0)  # the rest drain away; those still starting are cancelled
        for pool, count in wanted.items():
            self._scale(pool, count)  # flips in flight count as incoming: only a shortfall starts cold
        self.shape_changes.append((self.now, str(before), str(out.target), out.reason))
        held = [*self._pending_colocated, *self._pending_prefill]  # waiting for the old shape: to the new one
        self._pending_colocated.clear()
        self._pending_prefill.clear()
        for req in held:
            self._to_prefill(req)

    def _shape(self) -> Shape:
        live = {
            pool: len([r for r in self._billed(pool) if not r.draining]) + self._incoming(pool)
            for pool in self.replicas
        }
        return (
            Shape(prefill=live[Pool.prefill], decode=live[Pool.decode])
            if self._split
            else Shape(colocated=live[Pool.colocated])
        )

    def _start_flip(self, rep: Replica, target: Pool) -> None:
        if rep.pool != Pool.colocated:
            super()._start_flip(rep, target)
            return
        rep.flip_to, rep.draining, rep.flipped = target, True, True
        self._advance(rep)
        queued, rep.queue = list(rep.queue), deque()
        for req in queued:  # prompts not started go to the new shape (a partly prefilled one starts over)
            rep.queued_tokens -= req.input_len - self._prefilled.pop(req.id, 0)
            self._to_prefill(req)
        waiting, rep.waiting = list(rep.waiting), deque()
        for req in waiting:
            self._to_decode(req)
        if rep.idle():
            self._drained(rep)

    def _drained(self, rep: Replica) -> None:
        self._prefill_step.discard(rep.id)
        super()._drained(rep)

    # --- routing by shape ----------------------------------------------------------------------------
    def _to_prefill(self, req: Request) -> None:
        if self._split:
            Simulation._to_prefill(self, req)
        else:
            ColocatedSimulation._to_prefill(self, req)

    def _hold(self, req: Request) -> None:
        self._pending_colocated.append(req)

    def _dispatch_waiting(self, pool: Pool) -> None:
        if pool != Pool.colocated:
            super()._dispatch_waiting(pool)
            return
        while self._pending_colocated and any(r.ready(self.now) for r in self.replicas[pool]):
            self._to_prefill(self._pending_colocated.popleft())
        prefilled = list(self._pending_decode)
        self._pending_decode.clear()
        for req in prefilled:  # prefilled while no decode worker was left: a colocated worker decodes it
            self._to_decode(req)

    def _to_decode(self, req: Request) -> None:
        """A prefilled request: to a ready decode worker; else to one still draining (it reserved the KV);
        else to a colocated worker; else it waits for a decode worker."""
        if any(r.ready(self.now) for r in self.replicas[Pool.decode]):
            Simulation._to_decode(self, req)
            return
        draining = [
            r for r in self.replicas[Pool.decode] if r.gone_s is None and r.draining and r.flip_to is None
        ]
        colocated = [r for r in self.replicas[Pool.colocated] if r.ready(self.now)]
        req.remaining = req.output_len - 1
        if draining:
            rep = min(draining, key=lambda r: (len(r.running) + len(r.waiting), r.id))
            self._advance(rep)
            rep.waiting.append(req)
            if not rep.running:
                self._resegment(rep)
            else:
                steps = math.ceil((self.now - rep.segment_start_s) / rep.step_s - 1e-9)
                rep.version += 1
                self._push(rep.segment_start_s + steps * rep.step_s, "decoded", (rep, rep.version))
        elif colocated:
            rep = min(colocated, key=lambda r: (len(r.running) + len(r.waiting), r.id))
            rep.waiting.append(req)
            self._wake(rep)
        else:
            self._pending_decode.append(req)

    # --- steps by role -------------------------------------------------------------------------------
    def _resegment(self, rep: Replica) -> None:
        if rep.pool == Pool.colocated:
            ColocatedSimulation._resegment(self, rep)
        else:
            Simulation._resegment(self, rep)

    def _on_decoded(self, payload: object) -> None:
        rep = cast(tuple[Replica, int], payload)[0]
        if rep.pool == Pool.colocated:
            ColocatedSimulation._on_decoded(self, payload)
        else:
            Simulation._on_decoded(self, payload)

    def _work(self, rep: Replica) -> int:
        if rep.pool == Pool.colocated:
            return rep.queued_tokens + len(rep.running) + len(rep.waiting)
        return super()._work(rep)


def simulate_auto(trace: Sequence[TraceRequest], config: SimConfig, controller: Controller) -> SimResult:
    """Replay `trace` with the shape as the controller's choice (`config.initial` sets the starting shape)."""
    return AutoSimulation(trace, config, controller).run()


def auto_controller(config: PolicyConfig, shape: ShapeConfig) -> Controller:
    """tandem's policy for the pools of the current shape, and the shape rule above it: a change resets the
    per-pool policy's memory (the pools it remembered are gone)."""
    state, last_change_s = PolicyState(), -math.inf
    recent: tuple[tuple[float, ShapeLoad], ...] = ()
    learned = Learned()

    def control(snap: Snapshot) -> dict[Pool, int] | Control:
        nonlocal state, last_change_s, recent, learned
        obs = snap.observations
        split = Pool.colocated not in obs
        counts = {pool: o.replicas.ready + o.replicas.starting for pool, o in obs.items()}
        current = (
            Shape(prefill=max(counts[Pool.prefill], 1), decode=max(counts[Pool.decode], 1))
            if split
            else Shape(colocated=max(counts[Pool.colocated], 1))
        )
        load = ShapeLoad.observed(obs, shape.slo.percentile)
        if load is not None and snap.at_s >= max(o.window_s for o in obs.values()):  # a whole window seen
            peak, recent = peak_load(recent, load, snap.at_s, shape.dwell_s)
            learned = learn_colocated(learned, load, current, shape, snap.at_s)
            d = decide_shape(peak, current, snap.at_s - last_change_s, shape, learned.factor)
            if d.action != ShapeAction.keep:
                state, last_change_s = PolicyState(), snap.at_s
                return ShapeChange({}, target=d.target, reason=d.reason)
        decisions, state = decide(obs, state, config, snap.at_s)
        return {pool: dec.desired for pool, dec in decisions.items()}

    return control

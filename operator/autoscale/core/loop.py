"""One autoscaler tick, the same on Kubernetes and on the local stack: observe the pools, run the policy,
let the actuator apply what changes. The loop holds the policy's state between ticks; I/O is in the
source and the actuator it is given. With `spec.mode: auto` the shape rule speaks first (shape_tick.py):
a change of shape is the tick's one act, and otherwise the policy sizes the pools of the shape there is."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol, runtime_checkable

from tandem.operator.autoscale.core.config import PolicyConfig
from tandem.operator.autoscale.core.flip import Flip, FlipState, decide_with_flips
from tandem.operator.autoscale.core.shape import ShapeAction, ShapeConfig, ShapeDecision
from tandem.operator.autoscale.core.shape_tick import ShapeState, current_shape, shape_pools, shape_tick
from tandem.operator.autoscale.core.source import MetricSource, MetricsUnavailable, Target
from tandem.operator.autoscale.core.types import Decision, Pool, PoolObservation, Replicas

log = logging.getLogger(__name__)


class Actuator(Protocol):
    def replicas(self) -> dict[Pool, Replicas]:
        """Each pool's replicas now: ready, starting (capacity on its way) and draining."""
        ...

    def apply(self, decision: Decision) -> None:
        """Resize the decision's pool to `decision.desired` (drain-safe when it shrinks)."""
        ...


@runtime_checkable
class FlipActuator(Protocol):
    """An actuator that can change a worker's role (SetRole): the policy lends workers only through one."""

    def flip(self, flip: Flip) -> None:
        """Move `flip.count` workers serving `flip.source` to `flip.target` (a flip back picks lent ones
        first)."""
        ...


@runtime_checkable
class ShapeActuator(Protocol):
    """An actuator that can change the service's shape (mode auto): flips, starts and drains in a safe
    order."""

    def reshape(self, decision: ShapeDecision) -> None:
        """Move the pools from `decision.current` to `decision.target` (returns once the flips are done)."""
        ...


@dataclass(frozen=True)
class Tick:
    """What one tick saw and did; `unavailable` says why nothing could be decided (pools held)."""

    at_s: float
    replicas: Mapping[Pool, Replicas]
    observations: Mapping[Pool, PoolObservation] = field(default_factory=dict)
    decisions: Mapping[Pool, Decision] = field(default_factory=dict)
    applied: tuple[Decision, ...] = ()
    unavailable: str | None = None
    flips: tuple[Flip, ...] = ()
    shape: ShapeDecision | None = None  # mode auto: the shape rule's word this tick (a change, or why not)


class Autoscaler:
    def __init__(
        self,
        target: Target,
        source: MetricSource,
        actuator: Actuator,
        config: PolicyConfig,
        shape: ShapeConfig | None = None,
    ):
        if config.flip_enabled and not isinstance(actuator, FlipActuator):
            log.warning(
                "%s/%s: flips are on but this backend cannot change a worker's role; they stay off",
                target.namespace,
                target.service,
            )
        if shape is not None and not isinstance(actuator, ShapeActuator):
            log.warning(
                "%s/%s: mode auto, but this backend cannot change the shape; it keeps the one it has",
                target.namespace,
                target.service,
            )
            shape = None
        self.target, self.source, self.actuator, self.config = target, source, actuator, config
        self.state = FlipState()
        self.shape, self.shape_state = shape, ShapeState()

    def tick(self, now_s: float) -> Tick:
        replicas = self.actuator.replicas()
        try:
            observations = self.source.observe(self.target, replicas, now_s)
        except MetricsUnavailable as e:
            log.warning(
                "%s/%s: metrics unavailable, pools hold: %s", self.target.namespace, self.target.service, e
            )
            return Tick(now_s, replicas, unavailable=str(e))
        shaped = None
        if self.shape is not None:
            shaped, self.shape_state = shape_tick(
                observations, replicas, self.shape_state, self.shape, now_s, self.config.limits
            )
            if shaped is not None and shaped.action is not ShapeAction.keep:
                log.info("%s/%s: %s", self.target.namespace, self.target.service, shaped.reason)
                assert isinstance(self.actuator, ShapeActuator)
                self.actuator.reshape(shaped)
                self.state = FlipState()  # the pools' targets and loans were the old shape's
                return Tick(now_s, replicas, observations, shape=shaped)
            now = current_shape(replicas)
            if now is None:
                return Tick(now_s, replicas, observations, unavailable="a change of shape is in flight")
            observations = {p: o for p, o in observations.items() if p in shape_pools(now)}
        config = (
            self.config
            if isinstance(self.actuator, FlipActuator)
            else replace(self.config, flip_enabled=False)
        )
        decisions, flips, self.state = decide_with_flips(observations, self.state, config, now_s)
        applied = []
        for decision in decisions.values():  # counts first: they were decided before the flips
            if decision.changes:
                self.actuator.apply(decision)
                applied.append(decision)
                log.info("%s/%s: %s", self.target.namespace, self.target.service, decision.reason)
        for flip in flips:
            assert isinstance(self.actuator, FlipActuator)
            self.actuator.flip(flip)
            log.info("%s/%s: %s", self.target.namespace, self.target.service, flip.reason)
        return Tick(now_s, replicas, observations, decisions, tuple(applied), flips=flips, shape=shaped)

"""One autoscaler tick, the same on Kubernetes and on the local stack: observe the pools, run the policy,
let the actuator apply what changes. The loop holds the policy's state between ticks; I/O is in the
source and the actuator it is given."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol, runtime_checkable

from tandem.operator.autoscale.core.config import PolicyConfig
from tandem.operator.autoscale.core.flip import Flip, FlipState, decide_with_flips
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
        """Move `flip.count` workers serving `flip.source` to `flip.target` (a flip back picks lent ones first)."""
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


class Autoscaler:
    def __init__(self, target: Target, source: MetricSource, actuator: Actuator, config: PolicyConfig):
        if config.flip_enabled and not isinstance(actuator, FlipActuator):
            log.warning("%s/%s: flips are on but this backend cannot change a worker's role; they stay off",
                        target.namespace, target.service)  # fmt: skip
        self.target, self.source, self.actuator, self.config = target, source, actuator, config
        self.state = FlipState()

    def tick(self, now_s: float) -> Tick:
        replicas = self.actuator.replicas()
        try:
            observations = self.source.observe(self.target, replicas, now_s)
        except MetricsUnavailable as e:
            log.warning("%s/%s: metrics unavailable, pools hold: %s", self.target.namespace, self.target.service, e)
            return Tick(now_s, replicas, unavailable=str(e))
        config = self.config if isinstance(self.actuator, FlipActuator) else replace(self.config, flip_enabled=False)
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
        return Tick(now_s, replicas, observations, decisions, tuple(applied), flips=flips)

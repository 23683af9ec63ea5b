"""One autoscaler tick, the same on Kubernetes and on the local stack: observe the pools, run the policy,
let the actuator apply what changes. The loop holds the policy's state between ticks; I/O is in the
source and the actuator it is given."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from tandem.operator.autoscale.config import PolicyConfig
from tandem.operator.autoscale.policy import PolicyState, decide
from tandem.operator.autoscale.sources.base import MetricSource, MetricsUnavailable, Target
from tandem.operator.autoscale.types import Decision, Pool, PoolObservation, Replicas

log = logging.getLogger(__name__)


class Actuator(Protocol):
    def replicas(self) -> dict[Pool, Replicas]:
        """Each pool's replicas now: ready, starting (capacity on its way) and draining."""
        ...

    def apply(self, decision: Decision) -> None:
        """Resize the decision's pool to `decision.desired` (drain-safe when it shrinks)."""
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


class Autoscaler:
    def __init__(self, target: Target, source: MetricSource, actuator: Actuator, config: PolicyConfig):
        self.target, self.source, self.actuator, self.config = target, source, actuator, config
        self.state = PolicyState()

    def tick(self, now_s: float) -> Tick:
        replicas = self.actuator.replicas()
        try:
            observations = self.source.observe(self.target, replicas, now_s)
        except MetricsUnavailable as e:
            log.warning("%s/%s: metrics unavailable, pools hold: %s", self.target.namespace, self.target.service, e)
            return Tick(now_s, replicas, unavailable=str(e))
        decisions, self.state = decide(observations, self.state, self.config, now_s)
        applied = []
        for decision in decisions.values():
            if decision.changes:
                self.actuator.apply(decision)
                applied.append(decision)
                log.info("%s/%s: %s", self.target.namespace, self.target.service, decision.reason)
        return Tick(now_s, replicas, observations, decisions, tuple(applied))

"""One pool at one policy call: what the policy remembers between calls (PoolState), and the tick and plan
its rules read (policy.py runs the rules, scale_down.py holds the ones that bring a pool down)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

from tandem.operator.autoscale.core import forecast as fc
from tandem.operator.autoscale.core.config import PolicyConfig, PoolLimits
from tandem.operator.autoscale.core.sizing import Sizing
from tandem.operator.autoscale.core.types import Decision, Pool, PoolObservation

QUIET_SPELLS = 5  # how many past quiet spells the break-even rule weighs (their median)


@dataclass(frozen=True)
class PoolState:
    """What the policy remembers of one pool between calls."""

    forecaster: fc.RateForecaster | None = None
    target: int | None = None  # the last decided count, until the pool reaches it
    target_since_s: float = -math.inf
    last_change_s: float = -math.inf
    last_direction: int = 0  # +1 up, -1 down, 0 none yet
    low_since_s: float | None = None  # since when the need stayed below the current count
    idle_since_s: float | None = None  # since when the pool saw no traffic
    last_queue_tokens: float | None = None
    last_queue_at_s: float | None = None
    up_since_s: float | None = None  # since when a forecast alone has asked for more replicas
    quiet_spells_s: tuple[float, ...] = ()  # lengths of the last spells with the need below the count


@dataclass(frozen=True)
class PolicyState:
    pools: dict[Pool, PoolState] = field(default_factory=dict)


@dataclass(frozen=True)
class Tick:
    """One pool at one call: its observation, the settings, the clock and what the policy remembers."""

    obs: PoolObservation
    cfg: PolicyConfig
    now_s: float
    ps: PoolState
    arriving: bool = False  # capacity asked for is still on its way: only a larger need moves the pool now

    @property
    def current(self) -> int:
        return (
            self.obs.replicas.ready + self.obs.replicas.starting
        )  # starting replicas are capacity on its way

    @property
    def limits(self) -> PoolLimits:
        return self.cfg.limits_for(self.obs.pool)

    def hold(self, code: str, why: str, **details: float) -> Decision:
        return hold(self.obs, self.current, code, why, **details)

    def move(self, desired: int, code: str, why: str, details: dict[str, float] | None = None) -> Decision:
        pool, current = self.obs.pool, self.current
        return Decision(pool, current, desired, f"{pool} {current}->{desired}: {why}", code, details or {})


class Push(NamedTuple):
    """A reactive term: the replicas the present calls for, why, and its reason code ('' when none)."""

    replicas: int
    why: str
    code: str


@dataclass(frozen=True)
class Plan:
    """What the pool needs this tick: the capacity model's sizing, the reactive and predictive terms, the
    target."""

    sizing: Sizing
    text: str  # "predicted 12 req/s (holt) needs 2.4 replicas at batch 24": the tail of most reasons
    details: dict[str, float]
    push: Push
    predictive: int
    target: int


def hold(obs: PoolObservation, current: int, code: str, why: str, **details: float) -> Decision:
    return Decision(obs.pool, current, current, f"{obs.pool} holds at {current}: {why}", code, dict(details))

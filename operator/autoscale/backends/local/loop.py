"""`tandem up` with `autoscaling.enabled`: the same policy as the operator, in a thread, against the local
stack: metrics scraped from the processes' /metrics, pools resized by starting workers and draining them,
and with `autoscaling.flip` warm workers flipped between the pools (SetRole)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from tandem.operator.autoscale.core.config import policy_config
from tandem.operator.autoscale.core.flip import Flip
from tandem.operator.autoscale.core.loop import Autoscaler, Tick
from tandem.operator.autoscale.core.shape import ShapeDecision
from tandem.operator.autoscale.core.shape_tick import SHAPE_POOLS, reshape, shape_config
from tandem.operator.autoscale.core.source import MetricSource, Target
from tandem.operator.autoscale.core.types import Decision, Pool, Replicas
from tandem.operator.autoscale.sources.prometheus import PrometheusSource
from tandem.operator.autoscale.sources.scrape import ScrapeSource
from tandem.operator.local.flip import fewest_running
from tandem.operator.local.scale import LocalPools, running_of
from tandem.periodic import Every
from tandem.profile import load_profile, shipped_profile
from tandem.spec import InferenceService, Mode

log = logging.getLogger("tandem.up.autoscale")


class LocalActuator:
    def __init__(self, pools: LocalPools, roles: tuple[Pool, ...]):
        self.pools, self.roles = pools, roles
        self.homes: dict[str, str] = {}  # a worker flipped away from its first role -> that role

    def flip(self, flip: Flip) -> None:
        """SetRole on `flip.count` workers serving `flip.source` (it returns once each drained and switched):
        workers going home first (a flip back), then the fewest running sequences."""
        source, target = flip.source.value, flip.target.value
        home = [p.name for p in self.pools.members(source) if self.homes.get(p.name) == target][: flip.count]
        flipped = self.pools.flip_workers(home, target, flip.reason) if home else []
        if len(flipped) < flip.count:
            flipped += self.pools.flip(source, target, flip.count - len(flipped), flip.reason)
        for p in flipped:
            if self.homes.get(p.name) == target:
                del self.homes[p.name]
            else:
                self.homes.setdefault(p.name, source)
        if len(flipped) < flip.count:
            log.warning("%s: %d of %d workers flipped", flip.reason_code, len(flipped), flip.count)

    def reshape(self, decision: ShapeDecision, ready_within_s: float = 600.0) -> None:
        """mode auto: start the workers the target shape has beyond the ones there are and wait until they
        answer, flip warm workers wave by wave (each drains its old role's work first), then drain the
        rest."""
        members = [p for role in SHAPE_POOLS for p in self.pools.members(role.value)]
        order = fewest_running({p.name: running_of(self.pools.load(p)) for p in members}, len(members))
        moves = reshape({p.name: p.role for p in members}, decision.target, order)
        for role, count in moves.start.items():
            self.pools.scale(role, len(self.pools.members(role)) + count)
        deadline = time.monotonic() + ready_within_s
        while any(self.pools.replicas(role).starting for role in moves.start) and time.monotonic() < deadline:
            time.sleep(0.5)
        for wave in moves.waves:
            for role in sorted(set(wave.values())):
                self.pools.flip_wave([n for n, r in wave.items() if r == role], role, decision.reason)
        self.pools.drain(moves.drain)
        self.homes.clear()  # every worker is home in the new shape

    def replicas(self) -> dict[Pool, Replicas]:
        return {pool: self.pools.replicas(pool.value) for pool in self.roles}

    def apply(self, decision: Decision) -> None:
        self.pools.scale(decision.pool.value, decision.desired)


def local_autoscaler(pools: LocalPools, svc: InferenceService, base: Path) -> Autoscaler:
    roles = {Mode.colocated: (Pool.colocated,), Mode.auto: SHAPE_POOLS}.get(
        svc.spec.mode, (Pool.prefill, Pool.decode)
    )
    a = svc.spec.autoscaling
    path = a.profile
    profile = load_profile(path if Path(path).is_absolute() else base / path) if path else shipped_profile()
    target = Target("local", svc.name, roles, a.window_seconds, svc.spec.slo.percentile, a.interval_seconds)
    url = a.prometheus_url
    source: MetricSource = PrometheusSource(url) if url else ScrapeSource(pools.metrics_targets)
    config = policy_config(svc.spec, profile)
    return Autoscaler(target, source, LocalActuator(pools, roles), config, shape_config(svc.spec, config))


class LocalAutoscaleThread:
    """Ticks every `intervalSeconds` until stopped; `ticks` keeps what each tick saw and did."""

    def __init__(self, autoscaler: Autoscaler, interval_s: float, echo: bool = True):
        self.autoscaler, self.interval_s, self.echo = autoscaler, interval_s, echo
        self.ticks: list[Tick] = []
        self._every = Every(interval_s, self._tick, "autoscaler")

    def start(self) -> LocalAutoscaleThread:
        self._every.start()
        return self

    def stop(self) -> None:
        self._every.stop(join_s=30)

    def _tick(self) -> None:
        tick = self.autoscaler.tick(time.time())
        self.ticks.append(tick)
        if self.echo:
            for d in tick.applied:
                print(f"autoscaler: {d.reason} [{d.reason_code}]", flush=True)
            for f in tick.flips:
                print(f"autoscaler: {f.reason} [{f.reason_code}]", flush=True)
            if tick.shape is not None and tick.shape.target != tick.shape.current:
                print(f"autoscaler: {tick.shape.reason}", flush=True)

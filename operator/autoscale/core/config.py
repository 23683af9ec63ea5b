"""The policy's settings from an InferenceService spec (`slo`, `autoscaling`, pool bounds) and a profile."""

from __future__ import annotations

from dataclasses import dataclass

from tandem.operator.autoscale.core.types import Pool
from tandem.profile import Profile
from tandem.slo import Slo
from tandem.spec import InferenceServiceSpec, Mode


@dataclass(frozen=True)
class PoolLimits:
    min_replicas: int
    max_replicas: int
    gpus_per_replica: int = 1


@dataclass(frozen=True)
class PolicyConfig:
    slo: Slo
    profile: Profile
    limits: dict[Pool, PoolLimits]
    interval_s: float = 15.0
    stabilization_s: float = 180.0  # the need must stay below the current count this long before a step down
    scale_down_cooldown_s: float = 120.0  # between two steps down
    scale_up_cooldown_s: float = 0.0  # between two steps up (the in-flight hold already spaces them)
    margin: float = 0.8  # size for this share of the SLO
    up_tolerance: float = 0.1  # a forecast alone adds replicas only once N would run past (1 + this) x margin
    up_confirm_s: float = (
        0.0  # a forecast alone moves up only after asking this long (reactive terms act at once)
    )
    down_step_fraction: float = (
        0.25  # a step down removes up to this share of the pool (at least one replica)
    )
    hysteresis: float = 0.85  # step down only if N-1 replicas run at <= hysteresis x margin of the SLO
    stale_after_s: float = 60.0  # an observation older than this is not acted on
    in_flight_timeout_s: float = 600.0  # give up waiting for a change that never lands (pods unschedulable)
    gpu_budget: int | None = None
    cold_start_s: float | None = None  # None: the profile's
    flip_enabled: bool = False  # lend a warm worker of the pool with slack to a breaching pool (flip.py)
    flip_s: float = 2.0  # a drained worker serves its new role this long after it was asked to flip

    @property
    def cold_start(self) -> float:
        return self.profile.cold_start_ms / 1000 if self.cold_start_s is None else self.cold_start_s

    @property
    def horizon_s(self) -> float:
        """How far ahead the predictive floor looks: capacity asked for now serves only after this."""
        return self.cold_start + self.interval_s

    def limits_for(self, pool: Pool) -> PoolLimits:
        return self.limits.get(pool, PoolLimits(1, 1))


def policy_config(
    spec: InferenceServiceSpec, profile: Profile, cold_start_s: float | None = None
) -> PolicyConfig:
    """The policy settings an InferenceService asks for (the profile is read by the caller: file or
    ConfigMap)."""
    a = spec.autoscaling
    colocated = {
        Pool.colocated: _limits(
            spec.decode.min_replicas, spec.decode.max_replicas, spec.decode.resources.gpus
        )
    }
    if spec.mode == Mode.colocated:
        limits = colocated
    else:
        limits = {
            Pool.prefill: _limits(
                spec.prefill.min_replicas, spec.prefill.max_replicas, spec.prefill.resources.gpus
            ),
            Pool.decode: _limits(
                spec.decode.min_replicas, spec.decode.max_replicas, spec.decode.resources.gpus
            ),
            **(
                colocated if spec.mode == Mode.auto else {}
            ),  # auto: the colocated pool is sized as spec.decode
        }
    return PolicyConfig(
        slo=spec.slo.to_slo(),
        profile=profile,
        limits=limits,
        interval_s=a.interval_seconds,
        stabilization_s=a.stabilization_seconds,
        scale_down_cooldown_s=a.scale_down_cooldown_seconds,
        scale_up_cooldown_s=a.scale_up_cooldown_seconds,
        up_confirm_s=a.interval_seconds,
        margin=a.slo_margin_percent / 100,
        stale_after_s=max(a.window_seconds, 3 * a.interval_seconds),
        gpu_budget=a.gpu_budget,
        cold_start_s=cold_start_s,
        flip_enabled=a.flip.enabled,
        flip_s=a.flip.flip_seconds,
    )


def _limits(lo: int, hi: int, gpus: int) -> PoolLimits:
    return PoolLimits(lo, hi, gpus)

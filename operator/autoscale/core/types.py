"""The autoscaler's contract: what a metric source sees per pool, and what the policy decides (pure data)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class Pool(StrEnum):
    prefill = "prefill"
    decode = "decode"
    colocated = "colocated"


@dataclass(frozen=True)
class Replicas:
    """A pool's replicas as the actuator sees them: serving, started but not Ready yet, and draining away."""

    ready: int
    starting: int = 0
    draining: int = 0


@dataclass(frozen=True)
class PoolObservation:
    """One pool over the last window. A field is None when its metric is missing; NaN counts as missing.

    Rates are per second over the window; latencies are at the SLO percentile, in milliseconds.
    """

    pool: Pool
    at_s: float  # when the window ended (seconds, the source's clock)
    window_s: float
    replicas: Replicas
    arrival_rate_rps: float | None = None  # requests entering this pool
    prompt_tokens_mean: float | None = None
    prompt_tokens_p90: float | None = None
    output_tokens_mean: float | None = None
    prefix_hit_rate: float | None = None  # share of prompt tokens served from the prefix cache, 0..1
    ttft_ms: float | None = None  # prefill pool (and colocated)
    tpot_ms: float | None = None  # decode pool (and colocated)
    queued_prompt_tokens: float | None = None  # prefill backlog, summed over replicas
    running_sequences: float | None = None  # decode batch, summed over replicas
    kv_usage: float | None = None  # mean share of KV blocks in use, 0..1
    # Arrival rate in consecutive equal slices of the window (e.g. 6 x 10 s), oldest first: lets the policy
    # size prefill for bursts shorter than the window. None: the policy treats arrivals as Poisson.
    arrival_rate_slices_rps: tuple[float, ...] | None = None
    # Requests the router holds because this pool has no worker (scaled to zero, waking), and how long the
    # oldest has waited (seconds): the demand a pool at zero cannot report itself.
    held_requests: float | None = None
    held_oldest_s: float | None = None


@dataclass(frozen=True)
class Decision:
    """The policy's answer for one pool: the replica count it wants and why, in words a user reads in an
    Event."""

    pool: Pool
    current: int
    desired: int
    # e.g. "decode 2->3: TPOT p90 61 ms > 50 ms SLO; predicted 14 req/s needs 2.6 replicas at batch 24"
    reason: str
    reason_code: (
        str  # CamelCase, for metrics labels and conditions: SLOBreach, Forecast, ScaleDownIdle, Hold...
    )
    details: dict[str, float] = field(default_factory=dict)

    @property
    def changes(self) -> bool:
        return self.desired != self.current

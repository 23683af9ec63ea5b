"""`spec.slo` and `spec.autoscaling`: the latency objectives, and the built-in autoscaler that sizes each pool
for them (role flips and mode auto's shape changes included)."""

from __future__ import annotations

from pydantic import Field

from tandem.slo import DEFAULT as DEFAULT_SLO
from tandem.slo import Slo
from tandem.spec_base import Spec


class SloSpec(Spec):
    ttft_ms: int = Field(default=int(DEFAULT_SLO.ttft_ms), gt=0)
    """Time to first token objective, in milliseconds (sizes the prefill pool)."""
    tpot_ms: int = Field(default=int(DEFAULT_SLO.tpot_ms), gt=0)
    """Time per output token objective, in milliseconds (sizes the decode pool)."""
    percentile: int = Field(default=int(DEFAULT_SLO.percentile), gt=0, le=100)
    """The share of requests, in percent, that must meet ttftMs and tpotMs."""

    def to_slo(self) -> Slo:
        return Slo(self.ttft_ms, self.tpot_ms, self.percentile)


class FlipSpec(Spec):
    """Role flips as an autoscaling action: a warm worker of the pool with slack serves the breaching pool
    after its drain plus `flipSeconds`, while new pods of the right role start; it flips back once they are
    Ready."""

    enabled: bool = False
    """Let the autoscaler flip workers between the prefill and decode roles."""
    flip_seconds: int = Field(default=2, ge=0, le=600)
    """How long a drained worker takes to serve its new role (the autoscaler weighs drain plus this against a
    cold start)."""


class ShapeSpec(Spec):
    """How mode auto changes the shape: colocated workers or a prefill/decode split, whichever the capacity
    model says serves the load at the SLO on fewer GPUs."""

    dwell_seconds: int = Field(default=600, ge=0)
    """No change of shape sooner than this after the last one."""
    band_percent: int = Field(default=10, ge=0, le=90)
    """The other shape must need at least this share fewer GPUs (and at least one fewer) than the current
    one."""
    horizon_seconds: int = Field(default=1800, gt=0)
    """The GPUs a change saves over this long must repay its cost (every worker drains and flips)."""


class AutoscalingSpec(Spec):
    enabled: bool = False
    """Turn the built-in autoscaler on; off, kubectl scale, HPA or KEDA own the counts."""
    interval_seconds: int = Field(default=15, gt=0)
    """How often the autoscaler decides."""
    window_seconds: int = Field(default=60, gt=0)
    """How much recent traffic each decision looks at."""
    scale_up_cooldown_seconds: int = Field(default=30, ge=0)
    """Least time between two scale-ups of a pool."""
    scale_down_cooldown_seconds: int = Field(default=120, ge=0)
    """Least time between two scale-downs of a pool (one replica each)."""
    stabilization_seconds: int = Field(default=180, ge=0)
    """How long the need must stay below the current count before a pool scales down."""
    slo_margin_percent: int = Field(default=80, ge=1, le=100)
    """Size each pool for this share of its SLO; scale down only if one replica fewer still meets it."""
    gpu_budget: int | None = Field(default=None, ge=1)
    """GPUs both pools may hold together; unset: no shared cap (each pool keeps its maxReplicas)."""
    profile: str | None = None
    """The capacity profile (tandem profile JSON): a ConfigMap name on Kubernetes, a file path locally."""
    prometheus_url: str | None = Field(default=None, pattern="^https?://")
    """Prometheus HTTP API the autoscaler reads; unset, the operator's --prometheus-url, else a direct scrape
    of the pods."""
    shape: ShapeSpec = Field(default_factory=ShapeSpec)
    """mode auto: when the autoscaler collapses the split to colocated workers or splits them."""
    flip: FlipSpec = Field(default_factory=FlipSpec)
    """Role flips as a scaling action: when one pool breaches its SLO and the other has slack that survives
    losing a worker, a warm worker changes role (drain, then flipSeconds) while new pods start; it flips
    back once they are Ready."""

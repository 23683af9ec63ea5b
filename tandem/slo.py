"""The latency SLO, one type for every part that judges latency (spec, router, autoscaler, simulator, bench):
TTFT and TPOT targets in milliseconds, met by `percentile` percent of requests. User input is validated
where it enters (the InferenceService schema, the command lines); this type only carries and converts."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Slo:
    ttft_ms: float = 500
    tpot_ms: float = 50
    percentile: float = 90  # 0..100: the share of requests that must meet each target

    @classmethod
    def from_seconds(cls, ttft_s: float, tpot_s: float, objective: float | None = None) -> Slo:
        """From targets in seconds and the objective as a fraction 0..1 (Prometheus' and the client's
        units)."""
        return cls(ttft_s * 1000, tpot_s * 1000, cls.percentile if objective is None else objective * 100)

    @property
    def ttft_s(self) -> float:
        return self.ttft_ms / 1000

    @property
    def tpot_s(self) -> float:
        return self.tpot_ms / 1000

    @property
    def objective(self) -> float:
        """The share of requests that must meet each target, 0..1."""
        return self.percentile / 100

    def scaled(self, ttft_factor: float, tpot_factor: float) -> Slo:
        """The targets times these factors, at the same percentile."""
        return Slo(self.ttft_ms * ttft_factor, self.tpot_ms * tpot_factor, self.percentile)


DEFAULT = Slo()

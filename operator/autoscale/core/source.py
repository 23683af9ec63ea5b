"""The interface every metric source offers the autoscaler loop: per-pool observations of one service."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from tandem.operator.autoscale.core.types import Pool, PoolObservation, Replicas


class MetricsUnavailable(Exception):
    """The source could not be read at all (Prometheus down, no pod answered): the pools must hold."""


@dataclass(frozen=True)
class Target:
    """One InferenceService as its metrics label it, and the window and percentile the SLO is judged on."""

    namespace: str
    service: str
    pools: tuple[Pool, ...]
    window_s: float = 60.0
    percentile: float = 90.0
    interval_s: float = 15.0  # how often the loop observes: the length of the arrival slices


class MetricSource(Protocol):
    def observe(
        self, target: Target, replicas: Mapping[Pool, Replicas], now_s: float
    ) -> dict[Pool, PoolObservation]:
        """One observation per pool of `target` over its window; raises MetricsUnavailable."""
        ...

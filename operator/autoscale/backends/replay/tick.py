"""A metric source over the per-tick metrics of Dynamo's replay loop, so tandem's policy can be judged there.

The loop hands an external policy, at each tick, the worker counts per pool, each active worker's latest
forward pass (running and queued requests and tokens) and the traffic since the previous tick (arrivals and
mean ISL, OSL, TTFT and ITL). This source keeps the last `window_s` of those traffic slices, as a
Prometheus `rate()` window would, and maps them onto a PoolObservation:

| PoolObservation            | from the tick                                                            |
| -------------------------- | ------------------------------------------------------------------------ |
| replicas                   | active / starting / draining worker counts of the pool                   |
| arrival_rate_rps           | arrivals in the window / the window's duration                           |
| arrival_rate_slices_rps    | each slice's arrivals / its duration (the rate between two ticks)        |
| prompt_tokens_mean         | mean ISL over the window, weighted by requests                           |
| output_tokens_mean         | mean OSL over the window, weighted by requests                           |
| prefix_hit_rate            | mean KV hit rate over the window, weighted by its sample count           |
| ttft_ms, tpot_ms           | the SLO percentile of the slices' mean TTFT / ITL, weighted by samples   |
| queued_prompt_tokens       | queued prompt tokens summed over the prefill workers' last forward pass   |
| running_sequences          | running + queued decode requests summed over the decode workers          |
| kv_usage                   | decode KV tokens (running + queued) / (active decode workers x capacity) |

The loop gives means where the policy wants a percentile: the percentile is taken over the slices' means
(a 5 s slice per tick), which follows a burst that a window's mean would average away but still sits below
the true request percentile inside a slice. The prompt-length percentile is absent (the policy then uses
the mean). A window with no completed request leaves its latency missing, as an empty histogram would.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tandem.operator.autoscale.core.source import MetricsUnavailable, Target
from tandem.operator.autoscale.core.types import Pool, PoolObservation, Replicas


@dataclass(frozen=True)
class Slice:
    """The loop's traffic between two ticks."""

    end_s: float
    duration_s: float
    arrivals: float
    isl_mean: float
    osl_mean: float
    ttft_mean_ms: float
    ttft_count: float
    itl_mean_ms: float
    itl_count: float
    hit_rate: float
    hit_count: float

    @classmethod
    def from_traffic(cls, end_s: float, t: Mapping[str, Any]) -> Slice:
        return cls(
            end_s=end_s,
            duration_s=float(t.get("duration_s") or 0.0),
            arrivals=float(t.get("num_req") or 0.0),
            isl_mean=float(t.get("avg_isl") or 0.0),
            osl_mean=float(t.get("avg_osl") or 0.0),
            ttft_mean_ms=float(t.get("avg_ttft_ms") or 0.0),
            ttft_count=float(t.get("ttft_count") or 0.0),
            itl_mean_ms=float(t.get("avg_itl_ms") or 0.0),
            itl_count=float(t.get("itl_count") or 0.0),
            hit_rate=float(t.get("avg_kv_hit_rate") or 0.0),
            hit_count=float(t.get("hit_rate_count") or 0.0),
        )


def weighted_mean(pairs: list[tuple[float, float]]) -> float | None:
    """Mean of (value, weight) pairs; None when no weight (nothing observed)."""
    total = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / total if total > 0 else None


def weighted_percentile(pairs: list[tuple[float, float]], percentile: float) -> float | None:
    """The value below which `percentile` % of the weight lies; None when no weight."""
    total = sum(w for _, w in pairs if w > 0)
    if total <= 0:
        return None
    seen = 0.0
    for value, weight in sorted(p for p in pairs if p[1] > 0):
        seen += weight
        if seen >= total * percentile / 100 - 1e-9:
            return value
    return max(v for v, w in pairs if w > 0)


def pool_counts(m: Mapping[str, Any], pool: Pool) -> Replicas:
    return Replicas(
        ready=int(m.get(f"active_{pool.value}_count", 0)),
        starting=int(m.get(f"starting_{pool.value}_count", 0)),
        draining=int(m.get(f"draining_{pool.value}_count", 0)),
    )


class ReplayTickSource:
    """Fed one tick at a time (`push`), observed by the autoscaler loop like any metric source."""

    def __init__(self, kv_capacity_tokens: float, window_s: float = 60.0):
        self.kv_capacity_tokens = kv_capacity_tokens
        self.window_s = window_s
        self.slices: deque[Slice] = deque()
        self.tick: Mapping[str, Any] | None = None

    def push(self, m: Mapping[str, Any]) -> None:
        now_s = float(m["now_ms"]) / 1000
        self.tick = m
        traffic = m.get("traffic")
        if traffic:
            self.slices.append(Slice.from_traffic(now_s, traffic))
        while self.slices and self.slices[0].end_s <= now_s - self.window_s:
            self.slices.popleft()

    def replicas(self) -> dict[Pool, Replicas]:
        if self.tick is None:
            return {}
        return {pool: pool_counts(self.tick, pool) for pool in (Pool.prefill, Pool.decode)}

    def observe(
        self, target: Target, replicas: Mapping[Pool, Replicas], now_s: float
    ) -> dict[Pool, PoolObservation]:
        if self.tick is None:
            raise MetricsUnavailable("no tick yet")
        m, slices = self.tick, list(self.slices)
        duration = sum(s.duration_s for s in slices)
        requests = [(s.isl_mean, s.arrivals) for s in slices]
        rates = tuple(s.arrivals / s.duration_s for s in slices if s.duration_s > 0)
        common: dict[str, float | None] = {
            "arrival_rate_rps": sum(s.arrivals for s in slices) / duration if duration > 0 else None,
            "prompt_tokens_mean": weighted_mean(requests),
            "output_tokens_mean": weighted_mean([(s.osl_mean, s.arrivals) for s in slices]),
            "prefix_hit_rate": weighted_mean([(s.hit_rate, s.hit_count) for s in slices]),
        }
        prefill = list(m.get("prefill_fpm_snapshots") or [])
        decode = list(m.get("decode_fpm_snapshots") or [])
        active_decode = max(int(m.get("active_decode_count", 0)), 1)
        decode_kv = sum(
            float(s["sum_decode_kv_tokens"]) + float(s["sum_queued_decode_kv_tokens"]) for s in decode
        )
        per_pool: dict[Pool, dict[str, float | None]] = {
            Pool.prefill: {
                "ttft_ms": weighted_percentile(
                    [(s.ttft_mean_ms, s.ttft_count) for s in slices], target.percentile
                ),
                "queued_prompt_tokens": float(sum(s["sum_queued_prefill_tokens"] for s in prefill)),
            },
            Pool.decode: {
                "tpot_ms": weighted_percentile(
                    [(s.itl_mean_ms, s.itl_count) for s in slices], target.percentile
                ),
                "running_sequences": float(
                    sum(s["num_decode_requests"] + s["num_queued_decode"] for s in decode)
                ),
                "kv_usage": decode_kv / (active_decode * self.kv_capacity_tokens),
            },
        }
        return {
            pool: PoolObservation(
                pool=pool,
                at_s=now_s,
                window_s=self.window_s,
                replicas=replicas.get(pool, pool_counts(m, pool)),
                **common,
                **per_pool[pool],
                arrival_rate_slices_rps=rates if len(rates) > 1 else None,  # one slice is the mean
            )
            for pool in target.pools
            if pool in per_pool
        }

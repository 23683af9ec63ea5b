"""Kubernetes' HorizontalPodAutoscaler as an external policy of Dynamo's replay loop: the baseline a user has
without an LLM-aware autoscaler, judged on the same engine model and trace as tandem and Dynamo's planner.

    python replay.py --trace T.jsonl --startup-s 60 \
        --policy module:tandem.operator.autoscale.backends.replay.hpa.hpa_policy

Each pool is one HPA on a per-pod custom metric (AverageValue, as a Prometheus adapter serves the engines'
gauges), synced every 15 s: prefill on its queued prompt tokens per ready pod (target: `target` x the
engine's batched-token budget), decode on its running sequences per ready pod (target: `target` x the
engine's 256-sequence limit). The HPA's rules: the ratio over ready pods with its 10% tolerance and its
missing-pods rule (`hpa_recommendation`), a scale-up limit (double or +4 per sync) and a 300 s scale-down
stabilisation (the largest recommendation of the window). `TANDEM_HPA_OPTIONS` sets `target`.
"""

from __future__ import annotations

import json
import os
from collections import deque
from typing import Any

from tandem.operator.autoscale.backends.replay.tick import pool_counts
from tandem.operator.autoscale.core.hpa_rule import hpa_recommendation
from tandem.operator.autoscale.core.types import Pool

SYNC_S = 15.0
MAX_RUNNING_SEQUENCES = 256  # the engine's sequence limit in Dynamo's H200 profile (vLLM's max_num_seqs)


def pod_metric(m: dict[str, Any], pool: Pool) -> float | None:
    """The per-pod average of the pool's metric at this tick: queued prompt tokens (prefill) or running
    sequences (decode) over the active workers; None with no active worker (no pod reports)."""
    snaps = list(m.get(f"{pool.value}_fpm_snapshots") or [])
    if not snaps:
        return None
    if pool == Pool.prefill:
        return sum(float(s["sum_queued_prefill_tokens"]) for s in snaps) / len(snaps)
    return sum(float(s["num_decode_requests"]) + float(s["num_queued_decode"]) for s in snaps) / len(snaps)


class HpaPolicy:
    """Two HPAs, one per pool, driven by the loop's ticks."""

    def __init__(
        self, ctx: dict[str, Any], target: float = 0.7, tolerance: float = 0.1, stabilization_s: float = 300.0
    ):
        self.max_replicas = int(ctx.get("max_gpus") or 16) - 1
        self.targets = {
            Pool.prefill: target * float(ctx.get("max_num_batched_tokens") or 8192),
            Pool.decode: target * MAX_RUNNING_SEQUENCES,
        }
        self.tolerance, self.stabilization_s = tolerance, stabilization_s
        self.history: dict[Pool, deque[tuple[float, int]]] = {p: deque() for p in (Pool.prefill, Pool.decode)}

    def initial_tick_ms(self) -> float:
        return SYNC_S * 1000

    def desired(self, m: dict[str, Any], pool: Pool) -> int:
        now_s = float(m["now_ms"]) / 1000
        r = pool_counts(m, pool)
        current = r.ready + r.starting
        metric = pod_metric(m, pool)
        recommendation = current
        if metric is not None and r.ready > 0:
            recommendation = hpa_recommendation(
                r.ready, r.starting, metric, self.targets[pool], self.tolerance
            )
        recommendation = min(recommendation, max(2 * current, current + 4))
        history = self.history[pool]
        history.append((now_s, recommendation))
        while history and history[0][0] < now_s - self.stabilization_s:
            history.popleft()
        # up at once; down only to the largest recommendation of the stabilisation window
        want = recommendation if recommendation > current else min(current, max(v for _, v in history))
        return min(max(want, 1), self.max_replicas)

    def on_tick(self, m: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"next_tick_ms": float(m["now_ms"]) + SYNC_S * 1000}
        for pool in (Pool.prefill, Pool.decode):
            want, r = self.desired(m, pool), pool_counts(m, pool)
            out[f"target_{pool.value}"] = want if want != r.ready + r.starting else None
        return out


def hpa_policy(ctx: dict[str, Any]) -> HpaPolicy:
    """The factory `replay.py --policy module:tandem.operator.autoscale.backends.replay.hpa.hpa_policy`
    calls."""
    return HpaPolicy(ctx, **json.loads(os.environ.get("TANDEM_HPA_OPTIONS") or "{}"))

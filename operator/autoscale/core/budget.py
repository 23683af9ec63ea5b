"""The shared GPU budget: when the pools together want more GPUs than the budget, each GPU goes to the pool
whose predicted latency (as a share of its SLO) drops most per replica, above each pool's minimum (pure)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from tandem.operator.autoscale.core.config import PolicyConfig
from tandem.operator.autoscale.core.types import Decision, Pool

_SATURATED = 1000.0  # a pool that cannot keep up at all ranks above any latency share


def apply_budget(
    decisions: dict[Pool, Decision],
    latency_shares: Mapping[Pool, Callable[[int], float] | None],
    cfg: PolicyConfig,
) -> dict[Pool, Decision]:
    """Cut the desired counts to the budget: each GPU goes to the pool whose SLO gains most from it."""
    assert cfg.gpu_budget is not None
    gpus = {p: cfg.limits_for(p).gpus_per_replica for p in decisions}
    wanted = sum(d.desired * gpus[p] for p, d in decisions.items())
    if wanted <= cfg.gpu_budget:
        return decisions
    alloc = {p: min(cfg.limits_for(p).min_replicas, d.desired) for p, d in decisions.items()}
    left = cfg.gpu_budget - sum(alloc[p] * gpus[p] for p in alloc)

    def shortfall(p: Pool, n: int) -> float:
        """Predicted latency / SLO; past saturation, a large number that still falls with every replica."""
        share = latency_shares.get(p)
        value = 0.0 if share is None else share(n)
        if math.isinf(value):
            return _SATURATED + max(decisions[p].details.get("load_replicas", 0.0) - n, 0.0) + 1.0
        return min(value, _SATURATED)

    def gain(p: Pool) -> float:
        drop = shortfall(p, alloc[p]) - shortfall(p, alloc[p] + 1)
        return drop / gpus[p] if gpus[p] else math.inf

    while True:
        open_pools = [p for p in alloc if alloc[p] < decisions[p].desired and gpus[p] <= left]
        if not open_pools:
            break
        best = max(open_pools, key=lambda p: (gain(p), decisions[p].desired - alloc[p]))
        alloc[best] += 1
        left -= gpus[best]
    out = {}
    for p, d in decisions.items():
        if alloc[p] >= d.desired:
            out[p] = d
            continue
        why = f"{d.reason}; GPU budget {cfg.gpu_budget} allows {alloc[p]}"
        out[p] = Decision(
            p,
            d.current,
            alloc[p],
            why.replace(f"{d.current}->{d.desired}", f"{d.current}->{alloc[p]}"),
            "GPUBudget",
            d.details,
        )
    return out

"""tandem's autoscaling policy as an external policy of Dynamo's replay loop: judged by a simulator it does
not own.

    python replay.py --trace T.jsonl --startup-s 60 \
        --policy module:tandem.operator.autoscale.backends.replay.dynamo.dynamo_policy

Each tick of Dynamo's loop goes through the same `Autoscaler.tick` the operator runs: a metric source
(`ReplayTickSource`, which maps the loop's per-tick metrics onto what Prometheus would give; its docstring
lists every mapping), the pure `decide`, and an actuator that hands the decided counts back to the loop. The
capacity profile defaults to Dynamo's own H200 profile converted
(`tandem/profiles/h200-llama-3.1-8b-fp8.json`).

Settings come from the loop's context (SLO, GPU budget, cold start) and, for sweeps, from the environment:
`TANDEM_ANCHOR_OPTIONS` is a JSON object of PolicyConfig fields (e.g. {"margin": 0.7, "stabilization_s":
300}), `TANDEM_ANCHOR_PROFILE` a profile path or a shipped profile's name, `TANDEM_ANCHOR_LOG` a file that
gets every scaling decision as JSON lines.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, replace
from typing import Any

from tandem.operator.autoscale.backends.replay.tick import ReplayTickSource
from tandem.operator.autoscale.core.config import PolicyConfig, PoolLimits
from tandem.operator.autoscale.core.loop import Autoscaler
from tandem.operator.autoscale.core.source import Target
from tandem.operator.autoscale.core.types import Decision, Pool, Replicas
from tandem.profile import profile_named
from tandem.slo import Slo

DEFAULT_PROFILE = "h200-llama-3.1-8b-fp8"
POOLS = (Pool.prefill, Pool.decode)


class _Targets:
    """The actuator: remembers what the policy decided, for the loop to apply at this tick."""

    def __init__(self, source: ReplayTickSource):
        self.source = source
        self.pending: dict[Pool, int] = {}

    def replicas(self) -> dict[Pool, Replicas]:
        return self.source.replicas()

    def apply(self, decision: Decision) -> None:
        self.pending[decision.pool] = decision.desired


def anchor_config(ctx: dict[str, Any], options: dict[str, Any] | None = None) -> PolicyConfig:
    """The policy settings for one replay: SLO and budget from the loop's context, the rest from `options`."""
    options = dict(options or {})
    profile_path = options.pop("profile", None) or os.environ.get("TANDEM_ANCHOR_PROFILE")
    profile = profile_named(profile_path or DEFAULT_PROFILE)
    budget = int(ctx.get("max_gpus") or 16)
    limits = {pool: PoolLimits(1, budget - 1) for pool in POOLS}
    config = PolicyConfig(
        slo=Slo(float(ctx["slo_ttft_ms"]), float(ctx["slo_tpot_ms"]), float(options.pop("percentile", 90.0))),
        profile=profile,
        limits=limits,
        gpu_budget=budget,
        cold_start_s=float(ctx.get("startup_s") or 0.0),
    )
    config = replace(config, **options)
    if "up_confirm_s" not in options:  # as the operator sets it: a forecast alone must hold for one interval
        config = replace(config, up_confirm_s=config.interval_s)
    return config


class DynamoPolicy:
    """The object Dynamo's loop drives: `initial_tick_ms`, `on_tick(metrics)`, `finalize(operations)`."""

    def __init__(
        self, ctx: dict[str, Any], options: dict[str, Any] | None = None, log_path: str | None = None
    ):
        self.config = anchor_config(ctx, options)
        window_s = max(60.0, 4 * self.config.interval_s)
        self.source = ReplayTickSource(float(ctx["max_kv_tokens"]), window_s)
        self.actuator = _Targets(self.source)
        target = Target(
            "replay", "anchor", POOLS, window_s, self.config.slo.percentile, self.config.interval_s
        )
        self.autoscaler = Autoscaler(target, self.source, self.actuator, self.config)
        self.decisions: list[dict[str, Any]] = []
        self.log_path = log_path

    def initial_tick_ms(self) -> float:
        return self.config.interval_s * 1000

    def on_tick(self, m: dict[str, Any]) -> dict[str, Any]:
        self.source.push(m)
        self.actuator.pending = {}
        tick = self.autoscaler.tick(float(m["now_ms"]) / 1000)
        for d in tick.applied:
            self.decisions.append(
                {"at_s": tick.at_s, **{k: v for k, v in asdict(d).items() if k != "details"}}
            )
        return {
            "target_prefill": self.actuator.pending.get(Pool.prefill),
            "target_decode": self.actuator.pending.get(Pool.decode),
            "next_tick_ms": float(m["now_ms"]) + self.config.interval_s * 1000,
        }

    def finalize(self, lifecycle_operations: Any = None) -> None:
        if self.log_path:
            with open(self.log_path, "w") as f:
                for d in self.decisions:
                    f.write(json.dumps(d, default=str) + "\n")


def dynamo_policy(ctx: dict[str, Any]) -> DynamoPolicy:
    """The factory `replay.py --policy module:tandem.operator.autoscale.backends.replay.dynamo.dynamo_policy`
    calls."""
    options = json.loads(os.environ.get("TANDEM_ANCHOR_OPTIONS") or "{}")
    return DynamoPolicy(ctx, options, os.environ.get("TANDEM_ANCHOR_LOG"))

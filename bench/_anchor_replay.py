"""One replay through the Dynamo harness (its Rust loop, in this process) for the autoscaling benchmark: the
case it replays, the harness's own argument parser, and the key a replay's result is cached under."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from dataclasses import dataclass
from typing import Any

HPA_POLICY = "module:tandem.operator.autoscale.backends.replay.hpa.hpa_policy"


@dataclass(frozen=True)
class Case:
    trace: str  # Mooncake JSONL path
    label: str  # e.g. conv x8
    slo_ttft_ms: float
    slo_tpot_ms: float
    startup_s: float
    max_gpus: int
    init: str = "1,1"  # the pools a scaling policy starts from
    referee: str = "dynamo"  # dynamo (its replay) | simulate (tandem's simulator, bench/_anchor_sim.py)


# --- I/O: the replay ---------------------------------------------------------------------------------------

_replay: Any = None


def _load_replay(replay_dir: str) -> Any:
    global _replay
    if _replay is None:
        sys.path.insert(0, replay_dir)
        # the harness (a script, not a distribution): Dynamo's mocker + Rust loop, fixed pools, its planner,
        # external policies
        _replay = importlib.import_module("replay")
    return _replay


def replay_once(
    replay_dir: str, case: Case, policy: str, options: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One replay through the harness, in this process (its Rust loop runs single-threaded)."""
    replay = _load_replay(replay_dir)
    argv = [
        "--trace",
        case.trace,
        "--policy",
        policy,
        "--slo-ttft-ms",
        str(case.slo_ttft_ms),
        "--slo-tpot-ms",
        str(case.slo_tpot_ms),
        "--startup-s",
        str(case.startup_s),
        "--max-gpus",
        str(case.max_gpus),
        "--init",
        case.init,
    ]
    if policy.startswith("dynamo") and options:
        argv += ["--planner-json", json.dumps(options)]
    if policy.startswith("module:"):
        os.environ["TANDEM_HPA_OPTIONS" if policy == HPA_POLICY else "TANDEM_ANCHOR_OPTIONS"] = json.dumps(
            options or {}
        )
    return dict(replay.run(_harness_args(replay, argv)))


def _harness_args(replay: Any, argv: list[str]) -> argparse.Namespace:
    """The harness's argparse Namespace for `argv`, built by its own parser (captured from its main)."""
    captured: dict[str, argparse.Namespace] = {}

    def grab(a: argparse.Namespace) -> dict[str, Any]:
        captured["ns"] = a
        return {}

    real_run, replay.run = replay.run, grab
    try:
        replay.main(argv)
    finally:
        replay.run = real_run
    return captured["ns"]


def cache_key(case: Case, policy: str, options: dict[str, Any]) -> str:
    """What makes a replay's result: the trace (by label), SLO, budget, the policy and, for a scaling policy,
    its cold start and start (a fixed pool starts whole and never adds a worker, so neither changes it)."""
    static = policy.startswith(("static", "colocated"))
    key = [
        case.label,
        case.slo_ttft_ms,
        case.slo_tpot_ms,
        0.0 if static else case.startup_s,
        case.max_gpus,
        "" if static else case.init,
        policy,
        options,
    ]
    return json.dumps(key if case.referee == "dynamo" else [case.referee, *key], sort_keys=True)

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
    profile: str = ""  # the engine's profile (a file or a shipped name); "": NVIDIA's H200 vLLM profile


# --- the engine profile in Dynamo's layout, once per process ---------------------------------------------

_exports: dict[str, str] = {}


def dynamo_profile_dir(profile: str) -> str:
    """`profile` exported in Dynamo's profiler layout (`tandem profile export-dynamo`), once per process."""
    if profile not in _exports:
        import atexit
        import shutil
        import tempfile

        from tandem.profile import profile_named
        from tandem.profile_dynamo import to_dynamo

        folder = tempfile.mkdtemp(prefix="tandem-profile-dynamo-")
        atexit.register(shutil.rmtree, folder, True)
        to_dynamo(profile_named(profile), folder)
        _exports[profile] = folder
    return _exports[profile]


def profile_argv(case: Case) -> list[str]:
    """The harness's arguments that time its mocker with the case's profile (none: NVIDIA's, its default);
    tandem's policy inside it sizes with the same profile."""
    if not case.profile:
        os.environ.pop("TANDEM_ANCHOR_PROFILE", None)
        return []
    os.environ["TANDEM_ANCHOR_PROFILE"] = case.profile
    return ["--profile-dir", dynamo_profile_dir(case.profile)]


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
        *profile_argv(case),
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
    if case.profile:
        key.append({"profile": case.profile})
    return json.dumps(key if case.referee == "dynamo" else [case.referee, *key], sort_keys=True)

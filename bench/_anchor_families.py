"""The families the referee compares (fixed split and colocated pools, Dynamo's planner, HPA, tandem, auto):
each one's settings, the replay of one setting on one case, and the fixed pools' searches in hindsight."""

from __future__ import annotations

import itertools
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from typing import Any

from bench._anchor_replay import HPA_POLICY, Case, cache_key, replay_once
from bench._anchor_search import Point, box_search, count_search, staircase
from bench._anchor_sim import AUTO_POLICY, gpu_timeline, simulate_once

TANDEM_SETTINGS = [
    {"margin": m, "stabilization_s": s} for m, s in itertools.product((0.5, 0.8), (180.0, 600.0))
]
AUTO_SETTINGS = [
    {"margin": 0.8, "stabilization_s": s} for s in (180.0, 600.0)
]  # the shape rule at its defaults
HPA_SETTINGS = [
    {"target": t} for t in (0.3, 0.6, 0.9)
]  # of the engine's token budget / sequence limit per pod
DYNAMO_SETTINGS: list[tuple[str, dict[str, Any]]] = [
    ("dynamo:throughput", {}),
    ("dynamo:latency", {}),
    (
        "dynamo:load",
        {
            "prefill_scale_up_queue_tokens": 16384,
            "prefill_scale_down_queue_tokens": 1024,
            "decode_scale_up_kv_rate": 0.7,
            "decode_scale_down_kv_rate": 0.3,
        },
    ),
    (
        "dynamo:load",
        {
            "prefill_scale_up_queue_tokens": 4096,
            "prefill_scale_down_queue_tokens": 256,
            "decode_scale_up_kv_rate": 0.5,
            "decode_scale_down_kv_rate": 0.2,
        },
    ),
]

QUICK_SETTINGS = {
    "tandem": [TANDEM_SETTINGS[2], TANDEM_SETTINGS[3]],
    "dynamo": DYNAMO_SETTINGS[:2],
    "hpa": HPA_SETTINGS[1:2],
    "auto": AUTO_SETTINGS,
}


def run_job(args: tuple[str, Case, str, str, dict[str, Any]]) -> tuple[Case, Point]:
    """One setting of a family replayed on one case by the case's referee: (replay dir, case, family,
    policy, options) in, the case and its point out."""
    replay_dir, case, family, policy, options = args
    timeline: tuple[tuple[float, int], ...] = ()
    if case.referee == "simulate":
        out, result = simulate_once(case, policy, options)
        if " day " in case.label and family in ("tandem", "auto"):
            timeline = tuple(gpu_timeline(result))
    else:
        if policy == AUTO_POLICY or policy.startswith("colocated:"):
            raise ValueError(f"{policy}: Dynamo's replay runs a fixed shape per run; use --referee simulate")
        out = replay_once(replay_dir, case, policy, options)
    setting = policy if not options else f"{policy} {json.dumps(options, separators=(',', ':'))}"
    return case, Point(
        family,
        setting,
        float(out["gpu_hours"]),
        float(out["slo_attainment"]),
        float(out["reversals_per_hour"]),
        float(out["ttft_p90_ms"] or 0.0),
        float(out["tpot_p90_ms"] or 0.0),
        float(out.get("shape_changes_per_hour", 0.0)),
        timeline,
    )


def scaling_jobs(
    replay_dir: str, cases: list[Case], families: set[str], quick: bool = False
) -> list[tuple[str, Case, str, str, dict[str, Any]]]:
    """Every setting of each scaling family asked for (two or one each with `quick`) on every case, as
    `run_job`'s arguments."""
    dynamo = QUICK_SETTINGS["dynamo"] if quick else DYNAMO_SETTINGS
    tandem = QUICK_SETTINGS["tandem"] if quick else TANDEM_SETTINGS
    hpa = QUICK_SETTINGS["hpa"] if quick else HPA_SETTINGS
    return [
        (replay_dir, c, fam, pol, opt)
        for c in cases
        for fam, pol, opt in (
            [("dynamo", pol, opt) for pol, opt in dynamo] * ("dynamo" in families)
            + [
                ("tandem", "module:tandem.operator.autoscale.backends.replay.dynamo.dynamo_policy", opt)
                for opt in tandem
            ]
            * ("tandem" in families)
            + [("hpa", HPA_POLICY, opt) for opt in hpa] * ("hpa" in families)
            + [("auto", AUTO_POLICY, opt) for opt in AUTO_SETTINGS] * ("auto" in families)
        )
    ]


def static_search(
    replay_dir: str,
    case: Case,
    target: float,
    cache: dict[str, dict[str, Any]],
    box: tuple[int, ...] | None = None,
    hint: tuple[int, int] | None = None,
) -> list[Point]:
    """The fixed pools replayed finding the cheapest that reaches `target`: the staircase over the whole
    budget (walking only pools cheaper than `hint` when that reaches it), or `box_search` inside (P, D) <=
    `box`."""
    memo: dict[tuple[int, int], Point] = {}

    def evaluate(p: int, d: int) -> float:
        if (p, d) not in memo:
            key = cache_key(case, f"static:{p},{d}", {})
            memo[(p, d)] = (
                Point(**cache[key])
                if key in cache
                else run_job((replay_dir, case, "static", f"static:{p},{d}", {}))[1]
            )
            print(f"{case.label} ttft {case.slo_ttft_ms:g}: {memo[(p, d)]}", file=sys.stderr, flush=True)
        return memo[(p, d)].attainment

    if box:
        box_search(evaluate, target, box[0], box[1])
    else:
        staircase(evaluate, target, case.max_gpus, hint)
    return list(memo.values())


def colocated_search(
    replay_dir: str, case: Case, target: float, cache: dict[str, dict[str, Any]]
) -> list[Point]:
    """The fixed colocated pools replayed finding the fewest workers that reach `target` (`count_search`)."""
    memo: dict[int, Point] = {}

    def evaluate(n: int) -> float:
        if n not in memo:
            key = cache_key(case, f"colocated:{n}", {})
            memo[n] = (
                Point(**cache[key])
                if key in cache
                else run_job((replay_dir, case, "static", f"colocated:{n}", {}))[1]
            )
            print(f"{case.label} ttft {case.slo_ttft_ms:g}: {memo[n]}", file=sys.stderr, flush=True)
        return memo[n].attainment

    count_search(evaluate, target, case.max_gpus)
    return list(memo.values())


def static_searches(
    pool: ProcessPoolExecutor,
    replay_dir: str,
    cases: dict[tuple[str, float], Case],
    target: float,
    cache: dict[str, dict[str, Any]],
    boxes: dict[tuple[str, float], tuple[int, ...]],
    hints: dict[str, tuple[int, int]] | None = None,
) -> dict[tuple[str, float], list[Point]]:
    """Each case's fixed-pool search, in parallel; every replay joins the cache as its search ends."""
    hints = hints or {}
    done = {
        k: pool.submit(static_search, replay_dir, c, target, cache, boxes.get(k), hints.get(c.label))
        for k, c in cases.items()
    }
    found = {}
    for k, future in done.items():
        found[k] = future.result()
        for pt in found[k]:
            cache[cache_key(cases[k], pt.setting, {})] = asdict(pt)
    return found


def cheapest_fixed(points: list[Point], target: float) -> str | None:
    """The cheapest fixed split pool that reaches `target`, as "P,D" (where scaling policies start); None if
    none does."""
    reaching = [
        p for p in points if p.attainment >= target and p.setting.startswith("static:")
    ]  # split pools
    if not reaching:
        return None
    return min(reaching, key=lambda p: p.gpu_hours).setting.removeprefix("static:")

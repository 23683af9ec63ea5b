"""tandem's simulator against Dynamo's replay on fixed pools: TTFT and TPOT p50 / p90 of each, side by side
(`python -m bench.autoscale_dynamo --crosscheck`)."""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bench._anchor_replay import Case, _harness_args, _load_replay, profile_argv

CROSSCHECK_SHAPES = ((1, 1), (1, 2), (2, 1), (2, 2))


def crosscheck(replay_dir: str, case: Case, shapes: Iterable[tuple[int, int]]) -> list[dict[str, Any]]:
    """Fixed pools through tandem's simulator and Dynamo's replay: latency percentiles of each."""
    from tandem.operator.autoscale.core.types import Pool
    from tandem.operator.autoscale.sim.baselines import static_controller
    from tandem.operator.autoscale.sim.replay import summarise as sim_summary
    from tandem.operator.autoscale.sim.simulator import SimConfig, simulate
    from tandem.profile import profile_named
    from tandem.slo import Slo
    from tandem.trace import load_trace as read

    profile, trace = profile_named(case.profile or None), read(case.trace)
    rows = []
    for p, d in shapes:
        replay = _load_replay(replay_dir)
        with tempfile.NamedTemporaryFile(suffix=".json") as dump:
            argv = [
                "--trace",
                case.trace,
                "--policy",
                f"static:{p},{d}",
                "--dump",
                dump.name,
                "--slo-ttft-ms",
                str(case.slo_ttft_ms),
                "--slo-tpot-ms",
                str(case.slo_tpot_ms),
                *profile_argv(case),
            ]
            replay.run(_harness_args(replay, argv))
            theirs = json.loads(Path(dump.name).read_text())["summary"]
        sizes = {Pool.prefill: p, Pool.decode: d}
        config = SimConfig(profile=profile, cold_start_s=0.0, initial=sizes)
        result = simulate(trace, config, static_controller(sizes))
        ours = _percentiles(result)
        row: dict[str, Any] = {
            "trace": case.label,
            "pools": f"{p}P+{d}D",
            "sim_attainment": sim_summary("static", result, Slo(case.slo_ttft_ms, case.slo_tpot_ms, 90))[
                "slo_attainment"
            ],
        }
        for metric, key in (
            ("ttft_p50", "median_ttft_ms"),
            ("ttft_p90", "p90_ttft_ms"),
            ("tpot_p50", "median_tpot_ms"),
            ("tpot_p90", "p90_tpot_ms"),
        ):
            row[f"{metric}_dynamo"], row[f"{metric}_tandem"] = float(theirs[key]), ours[metric]
            row[f"{metric}_ratio"] = ours[metric] / float(theirs[key]) if theirs[key] else None
        rows.append(row)
        print(row, file=sys.stderr)
    return rows


def _percentiles(result: Any) -> dict[str, float]:
    from tandem.operator.autoscale.sim.metrics import percentile

    done = [
        r for r in result.requests if r.first_token_s is not None and r.finish_s is not None and not r.failed
    ]
    ttft = [(r.first_token_s - r.arrival_s) * 1000 for r in done]
    tpot = [(r.finish_s - r.first_token_s) / (r.output_len - 1) * 1000 for r in done if r.output_len > 1]
    return {
        "ttft_p50": percentile(ttft, 50),
        "ttft_p90": percentile(ttft, 90),
        "tpot_p50": percentile(tpot, 50),
        "tpot_p90": percentile(tpot, 90),
    }


def render_crosscheck(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| trace | pools | TTFT p50 ms (tandem / Dynamo) | TTFT p90 ms | TPOT p50 ms | TPOT p90 ms |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        cells = [
            f"{r[m + '_tandem']:.1f} / {r[m + '_dynamo']:.1f} ({r[m + '_ratio']:.2f}x)"
            for m in ("ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90")
        ]
        lines.append(f"| {r['trace']} | {r['pools']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)

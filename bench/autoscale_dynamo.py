"""tandem's autoscaler judged inside Dynamo's own replay, against Dynamo's planner and the cheapest fixed
pool.

    python -m bench.autoscale_dynamo --json out.json        # run with the Python that has ai-dynamo installed

The referee is NVIDIA Dynamo 1.6.1's offline replay (its mocker engine model in its Rust loop) with NVIDIA's
measured H200 profile of Llama-3.1-8B-Instruct-FP8 (or, with `--profile FILE`, any tandem profile, such as
tandem's own engine measured by `tandem profile`, exported in Dynamo's profiler layout), driven through the
harness in `--replay-dir` (set-up in its README: `pip install --no-deps ai-dynamo==1.6.1
ai-dynamo-runtime==1.6.1` and the planner's imports, then `pip install --no-deps -e .` of tandem). tandem runs
as `module:tandem.operator.autoscale.backends.replay.dynamo.dynamo_policy`, the same `decide` the operator
runs, fed only what the loop's per-tick metrics hold.

For each trace, rate scale, TTFT SLO and cold start, every policy is swept over its knob:
- static (P, D): the cheapest pool reaching the attainment target, found by a staircase search over the
  (P, D) grid in hindsight (attainment only grows with either count; `--pool-hints` names a pool known to
  reach it, so only cheaper pools are walked);
- Dynamo's planner: its load-based modes (throughput, latency) and the load mode at two threshold pairs
  (its SLA mode needs a package that is not installable here);
- HPA: Kubernetes' HorizontalPodAutoscaler rules on per-pod queue and batch metrics
(`tandem.operator.autoscale.backends.replay.hpa`),
  at three targets;
- tandem: SLO margin x scale-down stabilisation. A family's cost at the target is its cheapest setting that
reaches it, or the GPU-hours interpolated on its Pareto front between the settings on either side, or
"unreachable". Dynamo's replay is deterministic, so one run per setting is the figure. `--plot FILE` draws
each case's settings and fronts (GPU-hours against joint attainment); with `--plot-from JSON` it draws them
from an earlier `--json` without a replay.

`--referee simulate` runs the same search on tandem's own simulator (`tandem simulate`, the H200 profile
converted) instead: it also replays fixed colocated pools (`--families colocated`: the fewest workers that
reach the target, `count_search`, joining the static family, so the cheapest fixed pool is the cheaper of N
colocated and (P, D)) and `auto`, the shape as the autoscaler's choice (operator/autoscale/sim/auto.py).
Dynamo's replay runs one fixed shape per run (its policy API sets a disaggregated run's prefill and decode
counts), so neither runs there. `--plot-day FILE` draws each day's GPUs over time for `auto`, split-only
tandem and the cheapest fixed pool.

`--crosscheck` instead replays fixed pools through both `tandem simulate` (the H200 profile converted) and
Dynamo's replay, and prints TTFT and TPOT p50 / p90 of each side by side with their ratio (target: within
25%).

Traces are the Azure LLM inference traces (conversation and code, one hour each) at their own rate and at
`--rate-scales` times it (whole copies shifted by fractions of 10 s, so the rate curve above 10 s keeps
its shape); with `--windows N` also each cut into N consecutive windows (each its own case, its own
hindsight pool); and with `--day-hour-s` as a diurnal day (`tandem.trace.diurnal`: hour h of the curve
replays the next stretch of the trace at a rate factor on a cosine from x1 at 04:00 to x8 at 16:00),
whose fixed-pool search stays inside the peak hour's cheapest pool (the x8 hour's, from this run or
`--pool-hints`): `box_search`. All converted to Mooncake JSONL with no shared prefixes (the traces carry
no prompt text).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from bench._anchor_crosscheck import CROSSCHECK_SHAPES, crosscheck, render_crosscheck
from bench._anchor_families import cheapest_fixed, colocated_search, run_job, scaling_jobs, static_searches
from bench._anchor_plot import write_day_plot, write_pareto_plot
from bench._anchor_replay import Case, cache_key
from bench._anchor_report import render, summarise
from bench._anchor_search import Point
from bench._traces import TRACES as TRACE_DIR
from tandem.profile import profile_named
from tandem.profile_compare import profile_caption
from tandem.trace import AZURE_ATTRIBUTION, diurnal, load_trace, scale_rate, to_mooncake_jsonl, windows

ROOT = Path(__file__).resolve().parents[1]
TRACES = ("azure_llm_2023_conv.csv", "azure_llm_2023_code.csv")
DAY_LOW, DAY_HIGH = 1.0, 8.0  # the diurnal curve's rate factors at 04:00 and 16:00


def variants(
    requests: list[Any], short: str, scales: list[float], day_hour_s: float = 0.0, window_count: int = 0
) -> list[tuple[str, list[Any]]]:
    """(label, requests) of one trace: at each rate scale; cut into `window_count` windows, each at each
    scale; and as a diurnal day if asked."""
    made = [(f"{short} x{k:g}", scale_rate(requests, k)) for k in scales]
    if window_count > 1:
        for i, (start, part) in enumerate(windows(requests, window_count)):
            when = (
                f"min {start / 60:.0f}-{(start + max(r.arrival_s for r in part)) / 60:.0f}"
                if part
                else "empty"
            )
            made += [
                (f"{short} x{k:g} window {i + 1}/{window_count} ({when})", scale_rate(part, k))
                for k in scales
                if part
            ]
    if day_hour_s:
        made.append(
            (
                f"{short} day ({24 * day_hour_s / 3600:g} h)",
                diurnal(requests, 24, DAY_LOW, DAY_HIGH, day_hour_s),
            )
        )
    return made


def traces(
    folder: Path,
    scales: list[float],
    out_dir: Path,
    day_hour_s: float = 0.0,
    window_count: int = 0,
    only: tuple[str, ...] = ("conv", "code"),
) -> list[tuple[str, str]]:
    """(label, Mooncake JSONL path) of every variant of each Azure trace named in `only` (`variants`)."""
    made = []
    for name in TRACES:
        short = name.removeprefix("azure_llm_2023_").removesuffix(".csv")
        if short not in only:
            continue
        for label, reqs in variants(load_trace(folder / name), short, scales, day_hour_s, window_count):
            slug = "".join(c if c.isalnum() or c in "._-" else "_" for c in label)
            path = out_dir / f"{slug}.jsonl"
            path.write_text("\n".join(to_mooncake_jsonl(reqs)) + "\n")
            made.append((label, str(path)))
    return made


def parse_hints(text: str) -> dict[str, tuple[int, int]]:
    """`conv x8=3,1;code x8=7,1` -> {label: (P, D)}."""
    hints = {}
    for item in filter(None, (x.strip() for x in text.split(";"))):
        label, _, pools = item.rpartition("=")
        p, d = (int(x) for x in pools.split(","))
        hints[label.strip()] = (p, d)
    return hints


def peak_label(day_label: str) -> str:
    """The label of the rate-scaled hour the day's peak replays: `conv day (6 h)` -> `conv x8`."""
    return f"{day_label.split(' day ')[0]} x{DAY_HIGH:g}"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.autoscale_dynamo", description=__doc__.split("\n\n")[0])
    p.add_argument("--replay-dir", default=str(ROOT.parent / "shared" / "tools" / "dynamo-replay"))
    p.add_argument("--traces", default=str(TRACE_DIR), help="folder with the Azure CSVs")
    p.add_argument("--rate-scales", default="1,8", help="arrival-rate multiples of each trace ('' for none)")
    p.add_argument(
        "--day-hour-s",
        type=float,
        default=0.0,
        help="also a diurnal day of each trace (rate x1 at 04:00 to x8 at 16:00), each hour of the curve "
        "this long (900: the day's curve in 6 h; 3600: a real day); 0: none",
    )
    p.add_argument(
        "--start-small",
        action="store_true",
        help="scaling policies start from 1P+1D (as a day starts at night), not the cheapest fixed pool",
    )
    p.add_argument("--trace-names", default="conv,code", help="which Azure traces (conv, code)")
    p.add_argument(
        "--windows",
        type=int,
        default=0,
        help="also each trace cut into this many consecutive windows, each a case at each rate scale",
    )
    p.add_argument("--slo-ttft-ms", default="2000,1000")
    p.add_argument("--slo-tpot-ms", type=float, default=50.0)
    p.add_argument(
        "--startup-s",
        default="60",
        help="cold starts to replay, seconds or 'profile' (the profile's measured cold start); the static "
        "search ignores them",
    )
    p.add_argument("--max-gpus", type=int, default=16)
    p.add_argument("--target", type=float, default=0.95, help="joint SLO attainment to compare at")
    p.add_argument(
        "--families",
        default="static,dynamo,hpa,tandem",
        help="static (fixed split pools), colocated (fixed colocated pools, joining static's search), "
        "dynamo, hpa, tandem, auto (the shape as the autoscaler's choice: --referee simulate)",
    )
    p.add_argument(
        "--referee",
        choices=["dynamo", "simulate"],
        default="dynamo",
        help="Dynamo's replay, or tandem's own simulator with the H200 profile converted (the only one that "
        "runs colocated pools and auto here)",
    )
    p.add_argument(
        "--pool-hints",
        default="",
        help="'LABEL=P,D;...': a fixed pool believed to reach the target per case (from an earlier run); "
        "the search then walks only cheaper pools, and the same answer costs fewer replays",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="two settings per scaling family (tandem margin 0.8 at stabilisation 180 and 600 s; Dynamo's "
        "throughput and latency modes) for long traces",
    )
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--json", help="write every point and the summary rows here")
    p.add_argument(
        "--plot", help="write the Pareto plot (GPU-hours against joint attainment per family) here, PNG"
    )
    p.add_argument(
        "--plot-from",
        type=Path,
        help="draw --plot from the points of an earlier --json (nothing is replayed)",
    )
    p.add_argument(
        "--plot-day",
        help="write each day's GPUs over time (auto, split-only tandem, the cheapest fixed "
        "pool) here, PNG (--referee simulate)",
    )
    p.add_argument(
        "--cache", help="a JSON file of replays already run (read, then extended): reruns reuse them"
    )
    p.add_argument(
        "--crosscheck", action="store_true", help="tandem simulate vs Dynamo's replay on fixed pools"
    )
    p.add_argument(
        "--profile",
        default="",
        help="the engine's capacity profile (a file, or a shipped profile's name) that times Dynamo's mocker "
        "(exported in its profiler layout), tandem's simulator and tandem's policy; default: NVIDIA's H200 "
        "vLLM profile",
    )
    return p


def cold_start_s(value: str, profile: str) -> float:
    """A --startup-s entry in seconds: a number, or 'profile' for the profile's own (measured) cold start."""
    return profile_named(profile or None).cold_start_ms / 1000 if value == "profile" else float(value)


def panel_title(c: Case) -> str:
    return f"{c.label}, TTFT {c.slo_ttft_ms / 1000:g} s, cold start {c.startup_s:g} s"


def points_from_json(doc: dict[str, Any]) -> dict[str, list[Point]]:
    """The plot's panels from a --json document's points, each under its case's title."""
    panels: dict[str, list[Point]] = {}
    for row in doc["points"]:
        point = {k: v for k, v in row.items() if k != "case"}
        panels.setdefault(panel_title(Case(**row["case"])), []).append(Point(**point))
    return panels


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    if a.plot_from:
        if not a.plot:
            raise SystemExit("--plot-from needs --plot FILE")
        print(
            "Pareto plot: "
            f"{write_pareto_plot(points_from_json(json.loads(a.plot_from.read_text())), a.plot, a.target)}"
        )
        return 0
    families = set(a.families.split(","))
    scales = [float(x) for x in a.rate_scales.split(",") if x]
    with tempfile.TemporaryDirectory(prefix="tandem-anchor-") as tmp:
        made = traces(
            Path(a.traces), scales, Path(tmp), a.day_hour_s, a.windows, tuple(a.trace_names.split(","))
        )
        if a.crosscheck:
            slo = float(a.slo_ttft_ms.split(",")[0])
            checks = [
                Case(path, label, slo, a.slo_tpot_ms, 0.0, a.max_gpus, profile=a.profile)
                for label, path in made
            ]
            with ProcessPoolExecutor(a.jobs) as pool:
                found = pool.map(
                    crosscheck, [a.replay_dir] * len(checks), checks, [CROSSCHECK_SHAPES] * len(checks)
                )
                rows = [row for rs in found for row in rs]
            print(f"Engine profile: {profile_caption(a.profile)}\n")
            print(render_crosscheck(rows))
            if a.json:
                Path(a.json).write_text(json.dumps({"crosscheck": rows}, indent=1))
            return 0
        cases = [
            Case(
                path,
                label,
                float(ttft),
                a.slo_tpot_ms,
                cold_start_s(startup, a.profile),
                a.max_gpus,
                referee=a.referee,
                profile=a.profile,
            )
            for (label, path), ttft, startup in itertools.product(
                made, a.slo_ttft_ms.split(","), a.startup_s.split(",")
            )
        ]
        cache: dict[str, dict[str, Any]] = (
            json.loads(Path(a.cache).read_text()) if a.cache and Path(a.cache).exists() else {}
        )
        points: dict[Case, list[Point]] = {}
        with ProcessPoolExecutor(a.jobs) as pool:
            statics: dict[tuple[str, float], list[Point]] = {}
            if "static" in families:  # one search per trace and SLO: a fixed pool has no cold start
                days = {(c.trace, c.slo_ttft_ms): c for c in cases if " day " in c.label}
                hours = {(c.trace, c.slo_ttft_ms): c for c in cases if " day " not in c.label}
                statics = static_searches(
                    pool, a.replay_dir, hours, a.target, cache, {}, parse_hints(a.pool_hints)
                )
                _save(a.cache, cache)
                # a day's search stays in the box of its peak hour's cheapest pool (the day is never faster)
                by_label = {(c.label, c.slo_ttft_ms): k for k, c in hours.items()}
                boxes = {}
                for k, c in days.items():
                    peak = by_label.get((peak_label(c.label), c.slo_ttft_ms))
                    pool_size = cheapest_fixed(statics[peak], a.target) if peak else None
                    hint = parse_hints(a.pool_hints).get(peak_label(c.label))
                    if pool_size is None and hint is None:
                        raise SystemExit(
                            f"{c.label}: the day's fixed-pool search is bounded by the peak hour's pool; "
                            f"add {DAY_HIGH:g} to --rate-scales or give it in --pool-hints"
                        )
                    boxes[k] = tuple(int(x) for x in pool_size.split(",")) if pool_size else hint
                statics |= static_searches(pool, a.replay_dir, days, a.target, cache, boxes)
                _save(a.cache, cache)
            if "colocated" in families:  # the cheapest fixed pool is the cheaper of N colocated and (P, D)
                for k, c in {(c.trace, c.slo_ttft_ms): c for c in cases}.items():
                    found = colocated_search(a.replay_dir, c, a.target, cache)
                    for pt in found:
                        cache[cache_key(c, pt.setting, {})] = asdict(pt)
                    statics[k] = statics.get(k, []) + found
                _save(a.cache, cache)
            # every scaling policy starts warm, from the cheapest fixed pool of its case (1,1 if none or
            # --start-small)
            cheapest = {k: cheapest_fixed(ps, a.target) for k, ps in statics.items()}
            cases = [
                replace(c, init="1,1" if a.start_small else cheapest.get((c.trace, c.slo_ttft_ms)) or "1,1")
                for c in cases
            ]
            points = {c: list(statics.get((c.trace, c.slo_ttft_ms), [])) for c in cases}
            jobs = []
            for job in scaling_jobs(a.replay_dir, cases, families, a.quick):
                key = cache_key(job[1], job[3], job[4])
                if key in cache:
                    points[job[1]].append(Point(**cache[key]))
                else:
                    jobs.append(job)
            for (case, point), job in zip(pool.map(run_job, jobs), jobs, strict=True):
                points[case].append(point)
                cache[cache_key(case, job[3], job[4])] = asdict(point)
                _save(a.cache, cache)
                print(
                    f"{case.label} ttft {case.slo_ttft_ms:g} cold {case.startup_s:g}: {point}",
                    file=sys.stderr,
                )
    rows = summarise(points, a.target)
    print(f"Engine profile: {profile_caption(a.profile)}\n")
    print(render(rows, a.target))
    print(f"\nTraces: {AZURE_ATTRIBUTION}")
    if a.plot:
        panels = {panel_title(c): ps for c, ps in points.items()}
        print(f"Pareto plot: {write_pareto_plot(panels, a.plot, a.target)}")
    if a.plot_day:
        days = {
            f"{c.label}, TTFT {c.slo_ttft_ms / 1000:g} s, cold start {c.startup_s:g} s": ps
            for c, ps in points.items()
            if " day " in c.label
        }
        print(f"Day plot: {write_day_plot(days, a.plot_day, a.target, a.day_hour_s)}")
    if a.json:
        Path(a.json).write_text(
            json.dumps(
                {
                    "rows": rows,
                    "points": [
                        {"case": asdict(c), **asdict(p), "gpus_over_time": None}
                        for c, ps in points.items()
                        for p in ps
                    ],
                },
                indent=1,
            )
        )
    return 0


def _save(path: str | None, cache: dict[str, dict[str, Any]]) -> None:
    if path:
        Path(path).write_text(json.dumps(cache))


if __name__ == "__main__":
    sys.exit(main())

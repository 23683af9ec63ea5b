"""The autoscaling benchmark in Dynamo's replay, its parts that need no Dynamo: trace windows, the bounded
fixed-pool search for the day, the case labels, the Pareto plot and the HPA baseline as a loop policy."""

import itertools
import json
import os
import random
import struct
from dataclasses import replace
from pathlib import Path

import pytest

from bench._anchor_families import cheapest_fixed, run_job
from bench._anchor_plot import day_choice, fixed_gpus, front_series, write_day_plot, write_pareto_plot
from bench._anchor_replay import Case, cache_key
from bench._anchor_report import summarise
from bench._anchor_search import Point, box_search, count_search, staircase
from bench.autoscale_dynamo import main, peak_label, points_from_json, variants
from tandem.operator.autoscale.backends.replay.hpa import HpaPolicy
from tandem.trace import TraceRequest, to_mooncake_jsonl, windows
from tests.unit.test_autoscale_anchor import CTX, tick


def test_windows_cut_the_trace_into_equal_consecutive_parts():
    reqs = [TraceRequest(t * 1.5 + 0.25, 100 + t, 10) for t in range(100)]  # 0.25 .. 148.75 s
    parts = windows(reqs, 3)
    length = 148.75 / 3
    assert [start for start, _ in parts] == pytest.approx([0.0, length, 2 * length])
    assert sum(len(rs) for _, rs in parts) == len(reqs)
    # every request in exactly one window, in order, its time from the window's start
    assert [r.input_len for _, rs in parts for r in rs] == [r.input_len for r in reqs]
    assert all(0 <= r.arrival_s < length for _, rs in parts for r in rs)
    first = parts[1][1][0]  # 49.75 s: the first request past a third of the span
    assert first.input_len == 133 and first.arrival_s == pytest.approx(49.75 - length)
    assert parts[2][1][-1].arrival_s == pytest.approx(
        148.75 - 2 * length
    )  # the last request: the last window
    assert windows(reqs, 1) == [(0.0, reqs)] and windows([], 4) == []
    with pytest.raises(ValueError):
        windows(reqs, 0)


def test_variants_label_each_scale_window_and_day_and_the_day_names_its_peak_hour():
    reqs = [TraceRequest(float(t), 100, 10) for t in range(120)]
    made = dict(variants(reqs, "conv", [1.0, 8.0], day_hour_s=10.0, window_count=2))
    assert list(made) == [
        "conv x1",
        "conv x8",
        "conv x1 window 1/2 (min 0-1)",
        "conv x8 window 1/2 (min 0-1)",
        "conv x1 window 2/2 (min 1-2)",
        "conv x8 window 2/2 (min 1-2)",
        "conv day (0.0666667 h)",
    ]
    assert len(made["conv x8 window 2/2 (min 1-2)"]) == 8 * 60
    assert max(r.arrival_s for r in made["conv x1 window 2/2 (min 1-2)"]) < 60
    assert peak_label("conv day (0.0666667 h)") == "conv x8" and peak_label("code day (6 h)") == "code x8"


def _monotone(need_p):
    """Attainment of a grid where (P, D) reaches the target iff P >= need_p[D] (need_p never grows with D)."""
    return lambda p, d: (
        1.0 if p >= need_p[min(d, len(need_p) - 1)] else 0.5 * p / need_p[min(d, len(need_p) - 1)]
    )


@pytest.mark.parametrize("seed", range(40))
def test_box_search_finds_the_cheapest_pool_in_the_box(seed):
    rng = random.Random(seed)
    p_max, d_max = rng.randint(1, 9), rng.randint(1, 9)
    need = sorted((rng.randint(1, p_max + 2) for _ in range(d_max + 1)), reverse=True)
    attainment = _monotone(need)
    seen = box_search(attainment, 0.95, p_max, d_max)
    assert all(1 <= p <= p_max and 1 <= d <= d_max for p, d, _ in seen)
    grid = [
        (p, d)
        for p, d in itertools.product(range(1, p_max + 1), range(1, d_max + 1))
        if attainment(p, d) >= 0.95
    ]
    found = [(p, d) for p, d, a in seen if a >= 0.95]
    if not grid:
        assert not found
    else:
        assert min(p + d for p, d in found) == min(p + d for p, d in grid)


def test_box_search_walks_the_short_side():
    # the code trace's shape: prefill-bound, one decode worker is enough; the peak hour's pool is 7P+1D
    calls = []

    def attainment(p, d):
        calls.append((p, d))
        return 1.0 if p >= 5 else 0.6

    seen = box_search(attainment, 0.95, 7, 1)
    assert min((p + d, p, d) for p, d, a in seen if a >= 0.95) == (6, 5, 1)
    boxed = len(calls)
    assert boxed <= 4  # one binary search over P at D = 1
    assert len(staircase(attainment, 0.95, 16)) > 2 * boxed  # the open staircase tries P = 1, 2, ... first
    hinted = staircase(attainment, 0.95, 16, hint=(7, 1))  # exact: every pool cheaper than the hint is walked
    assert min((p + d, p, d) for p, d, a in hinted if a >= 0.95) == (6, 5, 1)
    assert boxed < len(hinted) < len(staircase(attainment, 0.95, 16))


def test_the_pareto_plot_draws_each_familys_front_per_case(tmp_path):
    pts = [
        Point("static", "static:1,1", 2.0, 0.80),
        Point("static", "static:2,1", 3.0, 0.97),
        Point("tandem", "a", 2.5, 0.96),
        Point("tandem", "b", 2.8, 0.95),
        Point("dynamo", "t", 1.5, 0.6),
    ]
    series = front_series(pts)
    assert series["tandem"] == ([2.5], [96.0])  # b costs more and attains less: off the front
    assert series["static"] == ([2.0, 3.0], [80.0, 97.0]) and series["dynamo"] == ([1.5], [60.0])
    out = write_pareto_plot({f"case {i}": pts for i in range(2)}, tmp_path / "pareto.png", 0.95)
    head = out.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", head[16:24])
    assert (width, height) == (round(5.2 * 2 * 110), round(4.2 * 110))  # 2 panels side by side
    with pytest.raises(ValueError):
        write_pareto_plot({}, tmp_path / "empty.png", 0.95)


def test_plot_from_draws_a_recorded_runs_points_without_a_replay(tmp_path):
    """--plot-from reads the points of a --json document (the committed tables' points here) into one panel
    per case and draws them; docs/img/pareto.png is this command's output."""
    recorded = Path(__file__).resolve().parents[2] / "bench/results/autoscale_dynamo_tables.json"
    panels = points_from_json(json.loads(recorded.read_text()))
    assert "conversation x8, TTFT 2 s, cold start 60 s" in panels and len(panels) == 4
    assert {p.family for ps in panels.values() for p in ps} == {"static", "dynamo", "tandem", "hpa"}
    assert main(["--plot-from", str(recorded), "--plot", str(tmp_path / "p.png")]) == 0
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_hpa_in_the_loop_scales_on_the_ratio_over_ready_pods_and_waits_out_its_stabilisation():
    hpa = HpaPolicy(CTX, target=0.5)  # prefill: 4096 queued tokens per pod; decode: 128 running sequences
    assert hpa.initial_tick_ms() == 15_000
    # 4 x the target waits on one ready prefill pod: x4 at once (within the double-or-+4 limit)
    out = hpa.on_tick(tick(15_000.0, queued=4 * 4096, running=100))
    assert (out["target_prefill"], out["target_decode"], out["next_tick_ms"]) == (4, None, 30_000.0)
    # 1 ready + 3 starting, 2 x the target on the ready one: the missing pods count as 0%, so the ratio over
    # all four is 0.5 -- a reversal of the direction, which the HPA does not make
    assert hpa.on_tick(tick(30_000.0, queued=2 * 4096, p=1, starting_p=3))["target_prefill"] is None
    # decode: 300 running on one pod = 2.3 x 128 -> 3 pods
    assert hpa.on_tick(tick(45_000.0, queued=0, running=300, p=4))["target_decode"] == 3
    # the queue empties: the 4 prefill pods stay for the 300 s window of larger recommendations, then go to 1
    quiet = [hpa.on_tick(tick(t * 1000.0, queued=0, running=100, p=4, d=3)) for t in range(60, 400, 15)]
    down = [i for i, o in enumerate(quiet) if o["target_prefill"] is not None]
    assert down and 60 + 15 * down[0] >= 30 + 300 and quiet[down[0]]["target_prefill"] == 1


@pytest.mark.parametrize("seed", range(30))
def test_a_hint_that_reaches_leaves_the_staircases_answer_and_saves_replays(seed):
    rng = random.Random(seed)
    need = sorted((rng.randint(1, 8) for _ in range(12)), reverse=True)
    attainment = _monotone(need)

    def cheapest(seen):
        return min(p + d for p, d, a in seen if a >= 0.95)

    open_walk = staircase(attainment, 0.95, 12)
    best = min(((p, d) for p, d, a in open_walk if a >= 0.95), key=sum)
    hinted = staircase(
        attainment, 0.95, 12, hint=(best[0] + 1, best[1] + 1)
    )  # a pool that reaches, not the best
    assert cheapest(hinted) == cheapest(open_walk)
    assert len(hinted) <= len(open_walk) + 1
    assert len(staircase(attainment, 0.95, 12, hint=(1, 1))) >= len(
        open_walk
    )  # a hint that fails changes nothing


def test_pool_hints_parse():
    from bench.autoscale_dynamo import parse_hints

    assert parse_hints("conv x8=3,1; code x8 window 1/3 (min 0-19)=7,2;") == {
        "conv x8": (3, 1),
        "code x8 window 1/3 (min 0-19)": (7, 2),
    }
    assert parse_hints("") == {}


def test_a_fixed_pools_replay_is_cached_once_for_every_cold_start():
    from dataclasses import replace

    from bench._anchor_replay import Case, cache_key

    cold = Case("t.jsonl", "conv day (2 h)", 2000.0, 50.0, 60.0, 16, init="2,1")
    warm = replace(cold, startup_s=0.0, init="1,1")
    assert cache_key(cold, "static:2,1", {}) == cache_key(warm, "static:2,1", {})
    assert cache_key(
        cold, "module:tandem.operator.autoscale.backends.replay.dynamo.dynamo_policy", {}
    ) != cache_key(warm, "module:tandem.operator.autoscale.backends.replay.dynamo.dynamo_policy", {})
    assert cache_key(cold, "static:2,1", {}) != cache_key(replace(cold, slo_ttft_ms=1000.0), "static:2,1", {})


@pytest.mark.parametrize("need", [1, 2, 3, 5, 9, 16, 17])
def test_count_search_finds_the_fewest_colocated_workers(need):
    calls = []

    def attainment(n):
        calls.append(n)
        return 0.99 if n >= need else 0.5

    seen = count_search(attainment, 0.95, 16)
    found = [n for n, a in seen if a >= 0.95]
    assert (min(found) if found else None) == (need if need <= 16 else None)
    assert len(calls) == len(set(calls)) and len(calls) <= 9  # doubling, then a binary search: no count twice


def test_the_cheapest_fixed_pool_is_the_cheaper_shape_and_scaling_starts_from_the_split():
    pts = [
        Point("static", "static:2,1", 3.0, 0.97),
        Point("static", "colocated:2", 2.0, 0.96),
        Point("static", "colocated:1", 1.0, 0.7),
        Point("auto", "auto", 1.2, 0.96),
    ]
    case = Case("t.jsonl", "conv day (4 h)", 2000.0, 50.0, 60.0, 16)
    (row,) = summarise({case: pts}, 0.95)
    assert row["static"] == pytest.approx(1.0 + (0.95 - 0.7) / (0.96 - 0.7) * 1.0)  # on the colocated front
    assert row["auto_vs_static"] == pytest.approx(1.2 / row["static"])
    assert cheapest_fixed(pts, 0.95) == "2,1"  # a scaling policy starts from a split pool


def test_the_day_plot_draws_each_policy_and_the_fixed_pool(tmp_path):
    day = ((0.0, 2), (600.0, 1), (1200.0, 4))
    pts = [
        Point("auto", "auto", 1.0, 0.96, gpus_over_time=day),
        Point("tandem", "t", 1.5, 0.97, gpus_over_time=day),
        Point("static", "colocated:4", 2.0, 0.99),
        Point("static", "static:2,1", 1.5, 0.9),
    ]
    assert (
        day_choice(pts, "tandem", 0.95) == pts[1]
        and fixed_gpus("static:2,1") == 3
        and fixed_gpus("colocated:4") == 4
    )
    out = write_day_plot({"conv day": pts}, tmp_path / "day.png", 0.95, hour_s=150.0)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size < 200_000


def test_the_simulator_referee_runs_colocated_pools_and_auto(tmp_path):
    rng, t, reqs = random.Random(5), 0.0, []
    while t < 240.0:
        t += rng.expovariate(1.0)
        reqs.append(TraceRequest(t, 300, 40))
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(to_mooncake_jsonl(reqs)) + "\n")
    case = Case(str(trace), "tiny day (0.1 h)", 2000.0, 50.0, 10.0, 8, referee="simulate")
    _, fixed = run_job(("", case, "static", "colocated:1", {}))
    _, auto = run_job(("", case, "auto", "auto", {"shape_dwell_s": 60.0}))
    assert fixed.attainment > 0.95 and fixed.setting == "colocated:1" and not fixed.gpus_over_time
    assert (
        auto.attainment > 0.95 and auto.gpus_over_time and auto.shape_changes_per_hour > 0
    )  # 1P+1D collapses
    assert cache_key(case, "colocated:1", {}) != cache_key(replace(case, referee="dynamo"), "colocated:1", {})


def test_a_case_on_another_profile_replays_on_it_and_is_cached_apart(tmp_path, monkeypatch):
    from bench._anchor_replay import profile_argv
    from tandem.profile import shipped_profile
    from tandem.profile_dynamo import from_dynamo

    rng, t, reqs = random.Random(7), 0.0, []
    while t < 120.0:
        t += rng.expovariate(0.5)
        reqs.append(TraceRequest(t, 200, 20))
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(to_mooncake_jsonl(reqs)) + "\n")
    nvidia = Case(str(trace), "small", 2000.0, 50.0, 0.0, 4, referee="simulate")
    tiny = replace(nvidia, profile="tiny-cpu")
    assert cache_key(nvidia, "static:1,1", {}) != cache_key(tiny, "static:1,1", {})
    # the simulator referee times the engine with the case's profile: the tiny CPU model is far slower
    _, fast = run_job(("", nvidia, "static", "static:1,1", {}))
    _, slow = run_job(("", tiny, "static", "static:1,1", {}))
    assert slow.ttft_p90_ms > 3 * fast.ttft_p90_ms
    # Dynamo's harness gets the profile exported in its layout, and tandem's policy inside it the same profile
    monkeypatch.setenv("TANDEM_ANCHOR_PROFILE", "an earlier case's")  # restored, so unset, after the test
    assert profile_argv(nvidia) == [] and "TANDEM_ANCHOR_PROFILE" not in os.environ
    flag, folder = profile_argv(tiny)
    assert flag == "--profile-dir" and os.environ["TANDEM_ANCHOR_PROFILE"] == "tiny-cpu"
    back = from_dynamo(folder, model="m", device="d")
    assert [p.step_ms for p in back.decode] == [p.step_ms for p in shipped_profile("tiny-cpu").decode]


def test_a_cold_start_can_be_the_profiles_own():
    from bench.autoscale_dynamo import cold_start_s
    from tandem.profile import shipped_profile

    assert cold_start_s("30", "tiny-cpu") == 30.0
    assert cold_start_s("profile", "tiny-cpu") == shipped_profile("tiny-cpu").cold_start_ms / 1000
    assert cold_start_s("profile", "") == 60.0  # NVIDIA's data holds none: the 60 s the import assumed

"""tandem's policy as an external policy of Dynamo's replay loop: the tick mapping, the adapter, the imported
H200 profile, the trace conversion and the benchmark's frontier arithmetic (Dynamo itself is not needed)."""

import json
import subprocess
import sys

import numpy as np
import pytest

from bench._anchor_search import Point, cost_at, pareto, staircase
from tandem.operator.autoscale.backends.replay.dynamo import DynamoPolicy, anchor_config
from tandem.operator.autoscale.backends.replay.tick import ReplayTickSource, weighted_percentile
from tandem.operator.autoscale.core.source import Target
from tandem.operator.autoscale.core.types import Pool
from tandem.profile import shipped_profile
from tandem.profile_dynamo import from_dynamo
from tandem.trace import TraceRequest, parse_jsonl, scale_rate, to_mooncake_jsonl

CTX = {
    "slo_ttft_ms": 2000.0,
    "slo_tpot_ms": 50.0,
    "max_gpus": 16,
    "init_prefill": 1,
    "init_decode": 1,
    "max_kv_tokens": 945_029,
    "max_num_batched_tokens": 8192,
    "max_model_len": 131072,
    "startup_s": 60.0,
}


def fpm(**kw):
    base = {
        "worker_id": 1,
        "dp_rank": 0,
        "wall_time": 0.0,
        "num_prefill_requests": 0,
        "sum_prefill_tokens": 0,
        "var_prefill_length": 0.0,
        "sum_prefill_kv_tokens": 0,
        "num_decode_requests": 0,
        "sum_decode_kv_tokens": 0,
        "var_decode_kv_tokens": 0.0,
        "num_queued_prefill": 0,
        "sum_queued_prefill_tokens": 0,
        "var_queued_prefill_length": 0.0,
        "num_queued_decode": 0,
        "sum_queued_decode_kv_tokens": 0,
        "var_queued_decode_kv_tokens": 0.0,
    }
    return {**base, **kw}


def tick(
    now_ms,
    *,
    req=50,
    isl=1000.0,
    osl=200.0,
    ttft=100.0,
    itl=8.0,
    p=1,
    d=1,
    queued=0,
    running=0,
    starting_p=0,
    draining_d=0,
    duration_s=5.0,
):
    return {
        "tick_ordinal": int(now_ms // 5000),
        "now_ms": now_ms,
        "active_prefill_count": p,
        "starting_prefill_count": starting_p,
        "draining_prefill_count": 0,
        "active_decode_count": d,
        "starting_decode_count": 0,
        "draining_decode_count": draining_d,
        "non_draining_prefill_count": p + starting_p,
        "non_draining_decode_count": d,
        "prefill_fpm_snapshots": [fpm(sum_queued_prefill_tokens=queued // max(p, 1)) for _ in range(p)],
        "decode_fpm_snapshots": [
            fpm(num_decode_requests=running // max(d, 1), sum_decode_kv_tokens=running * 1100 // max(d, 1))
            for _ in range(d)
        ],
        "traffic": {
            "duration_s": duration_s,
            "num_req": req,
            "avg_isl": isl,
            "avg_osl": osl,
            "avg_ttft_ms": ttft,
            "avg_itl_ms": itl,
            "ttft_count": req if ttft else 0,
            "itl_count": req * 10 if itl else 0,
            "avg_kv_hit_rate": 0.0,
            "hit_rate_count": 0,
            "shape_count": req,
        },
    }


def test_the_tick_source_maps_the_loop_onto_what_prometheus_would_give():
    src = ReplayTickSource(kv_capacity_tokens=1_000_000, window_s=60)
    for i in range(1, 13):
        src.push(
            tick(
                i * 5000.0,
                req=10 * i,
                ttft=100.0 * i,
                queued=6000,
                running=300,
                p=2,
                d=3,
                starting_p=1,
                draining_d=1,
            )
        )
    target = Target("r", "a", (Pool.prefill, Pool.decode), 60, 90)
    obs = src.observe(target, src.replicas(), 60.0)
    p, d = obs[Pool.prefill], obs[Pool.decode]
    assert p.arrival_rate_rps == pytest.approx(sum(10 * i for i in range(1, 13)) / 60)
    # the rate between two ticks, as the direct scrape cuts its window: what the policy sizes bursts from
    assert p.arrival_rate_slices_rps == pytest.approx(tuple(10 * i / 5 for i in range(1, 13)))
    assert (p.replicas.ready, p.replicas.starting, d.replicas.draining) == (2, 1, 1)
    assert p.prompt_tokens_mean == pytest.approx(1000.0) and d.output_tokens_mean == pytest.approx(200.0)
    # the p90 of the slices' means, weighted by samples: above the window's mean, at most its worst slice
    mean_ttft = sum(100.0 * i * 10 * i for i in range(1, 13)) / sum(10 * i for i in range(1, 13))
    assert mean_ttft < p.ttft_ms <= 1200.0
    assert p.queued_prompt_tokens == 6000 and d.running_sequences == 300
    assert d.kv_usage == pytest.approx(300 * 1100 / (3 * 1_000_000))
    assert p.prompt_tokens_p90 is None  # the loop has no length percentile: the policy uses the mean


def test_the_window_forgets_old_slices_and_an_empty_window_has_no_latency():
    src = ReplayTickSource(kv_capacity_tokens=1_000_000, window_s=60)
    src.push(tick(5000.0, req=100, ttft=900.0))
    for i in range(2, 20):
        src.push(tick(i * 5000.0, req=0, ttft=0.0, itl=0.0))
    obs = src.observe(Target("r", "a", (Pool.prefill,), 60, 90), src.replicas(), 95.0)[Pool.prefill]
    assert obs.arrival_rate_rps == 0.0 and obs.ttft_ms is None
    assert obs.arrival_rate_slices_rps == (0.0,) * 12


def test_one_tick_gives_no_slices_the_policy_takes_the_mean():
    src = ReplayTickSource(kv_capacity_tokens=1_000_000, window_s=60)
    src.push(tick(15_000.0, req=30))
    obs = src.observe(Target("r", "a", (Pool.prefill,), 60, 90), src.replicas(), 15.0)[Pool.prefill]
    assert obs.arrival_rate_rps == pytest.approx(30 / 5) and obs.arrival_rate_slices_rps is None


def test_weighted_percentile():
    assert weighted_percentile([(1.0, 9.0), (100.0, 1.0)], 90) == 1.0
    assert weighted_percentile([(1.0, 8.0), (100.0, 2.0)], 90) == 100.0
    assert weighted_percentile([(5.0, 0.0)], 90) is None


def test_the_adapter_runs_the_operators_policy_and_answers_the_loop():
    policy = DynamoPolicy(CTX)
    assert policy.initial_tick_ms() == policy.config.interval_s * 1000
    calm = policy.on_tick(tick(15_000.0, req=10, queued=0, running=20))
    assert calm["target_prefill"] is None and calm["target_decode"] is None
    assert calm["next_tick_ms"] == 15_000.0 + policy.config.interval_s * 1000
    # 400k prompt tokens wait (10 s of backlog on one replica) and no prompt finishes
    outs = [
        policy.on_tick(tick(t, req=60, ttft=0.0, queued=400_000, running=20)) for t in (30_000.0, 45_000.0)
    ]
    assert outs[0]["target_prefill"] is not None and outs[0]["target_prefill"] > 1
    assert outs[1]["target_prefill"] is None  # the loop has not started it yet: capacity is on its way
    assert [d["pool"] for d in policy.decisions] == ["prefill"]


def test_anchor_settings_come_from_the_loop_and_the_options():
    cfg = anchor_config(CTX, {"margin": 0.6, "stabilization_s": 300})
    assert (cfg.slo.ttft_ms, cfg.slo.tpot_ms, cfg.cold_start, cfg.gpu_budget) == (2000, 50, 60, 16)
    assert (cfg.margin, cfg.stabilization_s, cfg.up_confirm_s) == (0.6, 300, cfg.interval_s)
    assert cfg.profile.model == "nvidia/Llama-3.1-8B-Instruct-FP8"


def _write_dynamo_result(root, isl, ttft, usage, ctx, itl, max_kv):
    (root / "selected_prefill_interpolation").mkdir(parents=True)
    (root / "selected_decode_interpolation").mkdir(parents=True)
    np.savez(
        root / "selected_prefill_interpolation" / "raw_data.npz",
        prefill_isl=np.array(isl),
        prefill_ttft=np.array(ttft),
        prefill_thpt_per_gpu=np.zeros(len(isl)),
    )
    np.savez(
        root / "selected_decode_interpolation" / "raw_data.npz",
        x_kv_usage=np.array(usage),
        y_context_length=np.array(ctx),
        z_itl=np.array(itl),
        z_thpt_per_gpu=np.zeros(len(itl)),
        max_kv_tokens=np.array([max_kv]),
    )


def test_import_dynamo_turns_kv_usage_into_batches(tmp_path):
    _write_dynamo_result(
        tmp_path,
        [100, 1000, 4000],
        [20.0, 40.0, 90.0],
        [0.0, 0.1, 0.2, 0.1],
        [1000, 1000, 1000, 2000],
        [5.0, 15.0, 25.0, 15.0],
        100_000,
    )
    prof = from_dynamo(tmp_path, model="m", device="H200")
    assert [(p.batch, p.context_tokens, p.step_ms) for p in prof.decode] == [
        (1, 1000, 5.0),
        (10, 1000, 15.0),
        (20, 1000, 25.0),
        (5, 2000, 15.0),
    ]
    assert prof.prefill_ms(1000) == pytest.approx(40.0) and prof.kv_capacity_tokens == 100_000
    assert prof.decode_step_ms(10, 1000) == pytest.approx(15.0, rel=0.05)


def test_import_dynamo_cli_and_its_refusal(tmp_path):
    _write_dynamo_result(
        tmp_path / "ok",
        [100, 1000],
        [20.0, 40.0],
        [0.0, 0.1, 0.2],
        [1000, 1000, 2000],
        [5.0, 15.0, 25.0],
        100_000,
    )
    out = tmp_path / "p.json"
    cmd = [sys.executable, "-m", "tandem", "profile", "import-dynamo"]
    ok = subprocess.run(
        [*cmd, str(tmp_path / "ok"), "-o", str(out), "--model", "m", "--device", "H200"],
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads(out.read_text())["kv_capacity_tokens"] == 100_000
    bad = subprocess.run(
        [*cmd, str(tmp_path), "-o", str(out), "--model", "m", "--device", "H200"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "not a Dynamo profiler result" in bad.stderr


def test_the_shipped_h200_profile_is_dynamos_data():
    prof = shipped_profile("h200-llama-3.1-8b-fp8")
    assert prof.prefill_ms(100) == pytest.approx(19.525, rel=1e-3)  # Dynamo's first prefill point
    assert prof.kv_capacity_tokens == 945_029 and prof.max_running_sequences == 256
    assert "Apache-2.0" in prof.scale.note
    # the fit stays within 17% of the measured ITL where batches fit the engine's 256 sequences
    errors = [
        abs(prof.decode_step_ms(p.batch, p.context_tokens) / p.step_ms - 1)
        for p in prof.decode
        if p.batch <= 256
    ]
    assert sorted(errors)[len(errors) // 2] < 0.05 and max(errors) < 0.17


def test_rate_scaling_keeps_the_rate_curve_and_mooncake_lines_round_trip():
    reqs = [TraceRequest(float(t), 100 + t, 10) for t in range(0, 100, 2)]
    x3 = scale_rate(reqs, 3)
    assert len(x3) == 3 * len(reqs)
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(x3, x3[1:], strict=False))
    assert max(r.arrival_s for r in x3) < 100 + 10  # copies shift by less than the 10 s spread
    half = scale_rate(reqs, 1.5)
    assert len(half) == len(reqs) + len(reqs) // 2
    lines = list(to_mooncake_jsonl(x3[:4], block_tokens=64))
    records = [json.loads(line) for line in lines]
    assert (
        records[0]["hash_ids"] == [0, 1] and records[1]["hash_ids"][0] == 2
    )  # no two requests share a block
    back = parse_jsonl(lines)
    assert [r.input_len for r in back] == [r.input_len for r in x3[:4]]
    with pytest.raises(ValueError):
        scale_rate(reqs, 0)


def test_mooncake_timestamps_are_milliseconds():
    lines = [
        json.dumps({"timestamp": t, "input_length": 10, "output_length": 5, "hash_ids": [0]})
        for t in (0, 1500, 3000)
    ]
    assert [r.arrival_s for r in parse_jsonl(lines)] == [0.0, 1.5, 3.0]


def test_frontier_and_cost_at_the_target():
    pts = [
        Point("x", "a", 2.0, 0.90),
        Point("x", "b", 3.0, 0.94),
        Point("x", "c", 4.0, 0.98),
        Point("x", "d", 5.0, 0.97),
    ]
    assert [p.setting for p in pareto(pts)] == ["a", "b", "c"]
    cost, how = cost_at(pts, 0.95)
    assert cost == pytest.approx(3.25) and "between b and c" in how
    assert cost_at(pts, 0.99) == (None, "unreachable (best 98.0%)")
    assert cost_at([Point("x", "e", 1.0, 0.99)], 0.95) == (1.0, "e")


def test_staircase_finds_the_cheapest_fixed_pool():
    def attainment(p, d):  # needs P >= 3 or (P >= 2 and D >= 4), and D >= 2
        return 1.0 if d >= 2 and (p >= 3 or (p >= 2 and d >= 4)) else 0.5

    seen = staircase(attainment, 0.95, max_gpus=12)
    reaching = [(p, d) for p, d, a in seen if a >= 0.95]
    assert min(reaching, key=lambda pd: pd[0] + pd[1]) == (3, 2)
    assert len(seen) < 40  # far fewer than the 66 pools of the grid


def test_a_diurnal_day_follows_its_rate_curve():
    from tandem.trace import diurnal

    hour = [TraceRequest(t * 0.5, 100, 10) for t in range(200)]  # 2 req/s for 100 s
    day = diurnal(hour, hours=24, low=1.0, high=8.0, hour_s=50.0)
    per_hour = [sum(1 for r in day if h * 50 <= r.arrival_s < (h + 1) * 50) for h in range(24)]
    # x1 at 04:00, x8 at 16:00 (50 s of 2 req/s each); copies shift by up to 10 s into the next hour
    assert per_hour[4] == pytest.approx(100, rel=0.1) and per_hour[16] == pytest.approx(800, rel=0.1)
    assert len(day) == pytest.approx(100 * 24 * 4.5, rel=0.01)  # the cosine's mean factor is 4.5
    assert min(range(24), key=lambda h: per_hour[h]) == 4 and max(range(24), key=lambda h: per_hour[h]) == 16
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(day, day[1:], strict=False))

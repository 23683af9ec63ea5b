"""The GPU serving bench's arithmetic and tables (pure): a probe's latencies beside the engine-alone step at
the same batch, goodput at the SLO, KV transfer time per prompt against the copy floor, startup phases."""

from __future__ import annotations

from collections.abc import Sequence

from bench._goodput_sweep import Latency, attainment, goodput
from tandem.loadgen.report import percentile
from tandem.slo import Slo

# Every probe row carries these keys (the JSON's columns; a test holds the dry run to them)
PROBE_COLUMNS = (
    "mode",
    "rate",
    "requests",
    "completed",
    "ttft_p50_ms",
    "ttft_p90_ms",
    "tpot_p50_ms",
    "tpot_p90_ms",
    "attainment",
    "mean_batch",
    "engine_batch",
    "engine_step_ms",
    "tpot_over_engine",
)
KV_COLUMNS = (
    "prompt_tokens",
    "transport",
    "kv_bytes",
    "span_ms",
    "tail_ms",
    "copy_floor_ms",
    "tail_over_floor",
)
STARTUP_COLUMNS = ("mode", "worker", "load_s", "warmup_s", "ready_s")


def _ms(values: Sequence[float], q: float) -> float | None:
    p = percentile(values, q)
    return None if p is None else 1000 * p


def probe_row(
    mode: str, rate: float, requests: Sequence[Latency], mean_batch: float | None, slo: Slo
) -> dict:
    """One rate's latencies (p50/p90, ms) and SLO attainment; the engine columns are filled in later."""
    ok = [r for r in requests if r.ok]
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    tpots = [r.tpot_s for r in ok if r.tpot_s is not None]
    return {
        "mode": mode,
        "rate": rate,
        "requests": len(requests),
        "completed": len(ok),
        "ttft_p50_ms": _ms(ttfts, 50),
        "ttft_p90_ms": _ms(ttfts, 90),
        "tpot_p50_ms": _ms(tpots, 50),
        "tpot_p90_ms": _ms(tpots, 90),
        "attainment": attainment(requests, slo),
        "mean_batch": mean_batch,
        "engine_batch": None,
        "engine_step_ms": None,
        "tpot_over_engine": None,
    }


def engine_batch(mean_batch: float | None) -> int:
    """The batch the engine alone is timed at for a probe: its decode worker's mean sequences per step,
    rounded."""
    return max(1, round(mean_batch or 1))


def with_engine_step(row: dict, step_ms: dict[int, float]) -> dict:
    """The row with the engine-alone step time at its batch and the stack's TPOT p50 over it."""
    batch = engine_batch(row["mean_batch"])
    step = step_ms.get(batch)
    ratio = row["tpot_p50_ms"] / step if step and row["tpot_p50_ms"] is not None else None
    return {**row, "engine_batch": batch, "engine_step_ms": step, "tpot_over_engine": ratio}


def saturated(row: dict, floor: float = 0.5) -> bool:
    """A probe past saturation: fewer than `floor` of its requests met the SLO; higher rates only queue
    more."""
    return row["attainment"] < floor


def mode_goodput(rows: Sequence[dict], mode: str, slo: Slo) -> str:
    """Goodput (req/s) of `mode` over its probed rates, as the goodput sweep reads it ("<" below the grid,
    ">=" at its top)."""
    points = [(r["rate"], r["attainment"]) for r in rows if r["mode"] == mode]
    return str(goodput(points, slo.objective)) if points else "-"


def kv_row(
    prompt_tokens: int, transport: str, kv_bytes: float, span_s: float, tail_s: float, copy_gbps: float
) -> dict:
    """One prompt length's KV push, per prompt: bytes, span and tail (ms), and the floor of copying those
    bytes once at the measured device copy bandwidth (GB/s)."""
    floor_ms = 1000 * kv_bytes / (copy_gbps * 1e9) if copy_gbps > 0 else None
    return {
        "prompt_tokens": prompt_tokens,
        "transport": transport,
        "kv_bytes": kv_bytes,
        "span_ms": 1000 * span_s,
        "tail_ms": 1000 * tail_s,
        "copy_floor_ms": floor_ms,
        "tail_over_floor": (1000 * tail_s / floor_ms) if floor_ms else None,
    }


def fmt(value: float | None, pattern: str = "{:.1f}") -> str:
    return "-" if value is None else pattern.format(value)


def report(result: dict) -> str:
    cfg, slo = result["config"], Slo(**result["slo"])
    lines = [
        f"tandem on one GPU ({result['device']}): {cfg['model_shape']}, {cfg['dtype']}, decode step "
        f"{cfg['decode_step']}; trace {cfg['trace']} (inputs <= {cfg['max_input_len']}, outputs <= "
        f"{cfg['max_output_len']}); SLO TTFT {slo.ttft_ms:g} ms, TPOT {slo.tpot_ms:g} ms at "
        f"p{slo.percentile:g}",
        "",
        "| mode | rate req/s | ok/sent | TTFT p50 / p90 ms | TPOT p50 / p90 ms | SLO met | mean batch "
        "| engine step ms (batch) | TPOT p50 / engine step |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in result["probes"]:
        lines.append(
            f"| {r['mode']} | {r['rate']:g} | {r['completed']}/{r['requests']} | {fmt(r['ttft_p50_ms'])} / "
            f"{fmt(r['ttft_p90_ms'])} | {fmt(r['tpot_p50_ms'], '{:.2f}')} / "
            f"{fmt(r['tpot_p90_ms'], '{:.2f}')} | {r['attainment']:.0%} | {fmt(r['mean_batch'])} | "
            f"{fmt(r['engine_step_ms'], '{:.2f}')} ({r['engine_batch']}) | "
            f"{fmt(r['tpot_over_engine'], '{:.2f}')} |"
        )
    lines += [
        "",
        "goodput (req/s at the SLO): " + ", ".join(f"{m} {g}" for m, g in result["goodput"].items()),
    ]
    lines += [
        "",
        "KV transfer per prompt (disaggregated, prefill -> decode on one GPU), device copy "
        f"{result['copy_gbps']:.1f} GB/s:",
        "| prompt tokens | transport | KV MiB | span ms (first chunk -> commit ack) | tail ms (first token "
        "-> commit ack) | copy floor ms | tail / floor |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for k in result["kv"]:
        lines.append(
            f"| {k['prompt_tokens']} | {k['transport']} | {k['kv_bytes'] / 2**20:.1f} | {k['span_ms']:.2f} | "
            f"{k['tail_ms']:.2f} | {fmt(k['copy_floor_ms'], '{:.3f}')} | {fmt(k['tail_over_floor'])} |"
        )
    lines += [
        "",
        "startup (tandem_worker_startup_seconds by phase; ready: the stack's start to the router's "
        "readiness):",
        "| mode | worker | load s | warm-up s | stack ready s |",
        "| --- | --- | --- | --- | --- |",
    ]
    for s in result["startup"]:
        lines.append(
            f"| {s['mode']} | {s['worker']} | {fmt(s['load_s'], '{:.2f}')} | {fmt(s['warmup_s'], '{:.2f}')} "
            f"| {s['ready_s']:.1f} |"
        )
    lines.append(f"wall {result['wall_s']:.0f} s")
    return "\n".join(lines)

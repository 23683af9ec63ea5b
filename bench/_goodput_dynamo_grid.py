"""bench.goodput_dynamo's pure pieces: the pools it compares, its sweeps, a goodput as a table cell."""

from __future__ import annotations

from bench._goodput_sweep import Goodput, Latency
from tandem.trace import TraceRequest

ATTAINMENT = 0.9
FIXED_TTFT_SCALE = 5.0
AGGREGATED = "aggregated"
Pool = dict[str, int]


def pools(gpus: int) -> dict[str, Pool]:
    """The aggregated pool and every disaggregated split of `gpus` GPUs, by label."""
    if gpus < 2:
        raise ValueError("a disaggregated pool needs at least 2 GPUs")
    out: dict[str, Pool] = {AGGREGATED: {"agg": gpus}}
    for p in range(1, gpus):
        out[f"{p}P+{gpus - p}D"] = {"prefill": p, "decode": gpus - p}
    return out


def sweep_points(scales: list[float]) -> dict[str, list[tuple[float, float]]]:
    """(TTFT scale, TPOT scale) of each sweep, as bench.goodput reports them."""
    return {
        "both SLOs at s x idle": [(s, s) for s in scales],
        f"TTFT at {FIXED_TTFT_SCALE:g}x idle, TPOT at s x idle": [(FIXED_TTFT_SCALE, s) for s in scales],
    }


def latencies(rows: list[list[float | None]]) -> list[Latency]:
    """The replay's [input, TTFT ms, TPOT ms] rows as the sweep's latencies (unfinished: failed)."""
    return [
        Latency(
            ttft is not None,
            None if ttft is None else ttft / 1000,
            None if ttft is None else (tpot or 0) / 1000,
            int(n or 0),
        )
        for n, ttft, tpot in rows
    ]


def cell(g: Goodput, grid: list[float]) -> str:
    """A goodput as the table prints it: below the grid as '< lowest rate'."""
    return f"< {grid[0]:g}" if g.bound == "<" else f"{g.bound}{g.rate:.2f}"


def best_split(per_pool: dict[str, Goodput]) -> tuple[str, Goodput]:
    """The disaggregated split with the highest goodput (ties: fewer prefill workers)."""
    splits = [(label, g) for label, g in per_pool.items() if label != AGGREGATED]
    return max(splits, key=lambda kv: kv[1].rate)


def share_local(trace: list[TraceRequest], local_prefill_max_tokens: int) -> float:
    """Share of the trace's prompts tandem's conditional rule prefills on the decode worker while the prefill
    pool is not saturated: those of at most `local_prefill_max_tokens` tokens."""
    return sum(r.input_len <= local_prefill_max_tokens for r in trace) / len(trace)


def median_request(trace: list[TraceRequest]) -> TraceRequest:
    ins = sorted(r.input_len for r in trace)
    outs = sorted(r.output_len for r in trace)
    return TraceRequest(0.0, ins[len(ins) // 2], outs[len(outs) // 2])


def rate_of(cell_text: str) -> float | None:
    """A table cell's goodput per GPU as a number ('>=32.00' counts as 32), None below the grid."""
    return None if cell_text.startswith("<") else float(cell_text.lstrip(">="))

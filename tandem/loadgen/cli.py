"""`tandem bench`: argument parsing and the edges (files, terminal output) around the load generator."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tandem.loadgen.report import (
    format_table,
    summarize,
    summary_rows,
    throughput_timeseries,
    timeseries_bin_s,
)
from tandem.loadgen.result import RequestResult
from tandem.loadgen.trace import attribution_for, load_trace
from tandem.loadgen.workload import RequestSpec, parse_length, poisson_workload, shape_workload


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tandem bench",
        description="Load generator for any OpenAI-compatible endpoint: Poisson arrivals or trace replay, "
        "streamed requests, TTFT/TPOT/ITL percentiles, joint SLO attainment and goodput.",
    )
    p.add_argument("--url", default="http://127.0.0.1:8000", help="base URL of the server")
    p.add_argument("--model", help="model name (default: the first one at /v1/models)")
    p.add_argument("--endpoint", choices=("completions", "chat"), default="completions")
    w = p.add_argument_group("workload: Poisson arrivals (default) or a trace")
    w.add_argument("--rate", type=float, default=float("inf"), help="requests/s (default inf: all at once)")
    w.add_argument("--num-requests", type=int, default=100)
    w.add_argument("--input-len", type=parse_length, default=parse_length("128"), help="N or LO:HI")
    w.add_argument("--output-len", type=parse_length, default=parse_length("128"), help="N or LO:HI")
    w.add_argument("--trace", type=Path, help="Azure CSV (TIMESTAMP,ContextTokens,GeneratedTokens) or JSONL")
    w.add_argument("--time-scale", type=float, default=1.0, help="speed-up factor for trace arrivals")
    w.add_argument("--max-requests", type=int, help="send at most this many requests")
    w.add_argument("--max-input-len", type=int, help="clamp prompt lengths")
    w.add_argument("--max-output-len", type=int, help="clamp output lengths")
    w.add_argument("--duration", type=float, help="stop sending new requests after this many seconds")
    w.add_argument("--seed", type=int, default=0)
    w.add_argument(
        "--tokenizer",
        type=Path,
        help="tokenizer.json (or a model directory) to calibrate prompt lengths; default: one word per token",
    )
    s = p.add_argument_group("SLOs")
    s.add_argument("--slo-ttft-ms", type=float, help="time-to-first-token SLO")
    s.add_argument("--slo-tpot-ms", type=float, help="time-per-output-token SLO")
    o = p.add_argument_group("run and output")
    o.add_argument("--concurrency", type=int, help="at most this many requests in flight")
    o.add_argument("--timeout", type=float, default=600.0, help="per-request timeout in seconds")
    o.add_argument("--out", type=Path, help="directory for results.json and PNG plots")
    o.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    return p


def build_workload(args: argparse.Namespace) -> list[RequestSpec]:
    """The requests to send, from the trace or the Poisson options, shaped by the clamps and caps."""
    if args.trace is not None:
        specs = load_trace(args.trace)
    else:
        rng = random.Random(args.seed)
        specs = poisson_workload(args.rate, args.num_requests, args.input_len, args.output_len, rng)
    return shape_workload(
        specs,
        time_scale=args.time_scale,
        max_requests=args.max_requests,
        max_input_len=args.max_input_len,
        max_output_len=args.max_output_len,
        duration_s=args.duration,
    )


def _config(args: argparse.Namespace, model: str) -> dict[str, Any]:
    config: dict[str, Any] = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    config["input_len"] = asdict(args.input_len)
    config["output_len"] = asdict(args.output_len)
    config["rate"] = (
        None if args.trace is not None else str(args.rate) if args.rate == float("inf") else args.rate
    )
    config["model"] = model
    return config


def _request_record(r: RequestResult) -> dict[str, Any]:
    return {
        "start_s": r.start_s,
        "end_s": r.end_s,
        "input_len": r.input_len,
        "output_len": r.output_len,
        "ok": r.ok,
        "status": r.status,
        "error": r.error or None,
        "ttft_s": r.ttft_s,
        "tpot_s": r.tpot_s,
        "e2e_s": r.e2e_s,
        "output_tokens": r.output_tokens,
        "usage_reported": r.usage_reported,
    }


def print_summary(summary: dict[str, Any], title: str) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(title)
        print(format_table(summary))
        return
    table = Table(title=title, show_header=False)
    table.add_column(style="bold")
    table.add_column(justify="right")
    for label, value in summary_rows(summary):
        table.add_row(label, value)
    Console().print(table)


def write_outputs(
    out: Path, args: argparse.Namespace, model: str, results: list[RequestResult], summary: dict[str, Any]
) -> list[Path]:
    from tandem.loadgen.plots import plot_latency_cdfs, plot_throughput

    out.mkdir(parents=True, exist_ok=True)
    bin_s = timeseries_bin_s(summary["duration_s"])
    document = {
        "tool": "tandem bench",
        "config": _config(args, model),
        "trace_attribution": attribution_for(args.trace),
        "summary": summary,
        "throughput_timeseries": [
            {"t_s": t, "output_tokens_per_s": tok, "requests_per_s": req}
            for t, tok, req in throughput_timeseries(results, bin_s)
        ],
        "throughput_bin_s": bin_s,
        "requests": [_request_record(r) for r in results],
    }
    results_path = out / "results.json"
    results_path.write_text(json.dumps(document, indent=2) + "\n")
    return [
        results_path,
        plot_latency_cdfs(results, out / "latency_cdf.png", args.slo_ttft_ms, args.slo_tpot_ms),
        plot_throughput(results, out / "throughput.png", bin_s),
    ]


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from tandem.loadgen.prompts import DEFAULT_VOCABULARY, load_vocabulary
    from tandem.loadgen.runner import run_workload

    specs = build_workload(args)
    if not specs:
        print("tandem bench: the workload is empty", file=sys.stderr)
        return 2
    vocab = DEFAULT_VOCABULARY if args.tokenizer is None else load_vocabulary(args.tokenizer)
    to_s = lambda ms: None if ms is None else ms / 1000  # noqa: E731
    try:
        outcome = asyncio.run(
            run_workload(
                args.url,
                args.endpoint,
                specs,
                model=args.model,
                concurrency=args.concurrency,
                seed=args.seed,
                timeout_s=args.timeout,
                duration_s=args.duration,
                progress=False if args.no_progress else None,
                vocab=vocab,
            )
        )
    except KeyboardInterrupt:
        print("tandem bench: interrupted", file=sys.stderr)
        return 130
    summary = summarize(outcome.results, outcome.duration_s, to_s(args.slo_ttft_ms), to_s(args.slo_tpot_ms))
    source = f"trace {args.trace.name}" if args.trace is not None else f"Poisson rate {args.rate:g}/s"
    print_summary(summary, f"tandem bench: {outcome.model} at {args.url} ({args.endpoint}, {source})")
    attribution = attribution_for(args.trace)
    if attribution:
        print(f"Trace: {attribution}")
    if args.out is not None:
        for path in write_outputs(args.out, args, outcome.model, outcome.results, summary):
            print(f"wrote {path}")
    return 0 if summary["completed"] else 1

"""Disaggregation overhead: TTFT of one 2k-token prompt, disaggregated against colocated, in one run.

    python -m bench.disagg_overhead [--prompt-len 2048] [--repeat 7] [--hidden 512] [--layers 8]
                                    [--out r.json]

Three stacks run at once on loopback, every worker with the same torch thread count (default 1): colocated
(one worker), disaggregated with the KV transport on auto (shared memory on one host) and disaggregated with
it forced to gRPC. On an otherwise idle stack, one request at a time goes to each stack in turn (the order
rotates every repetition so drifting background load hits all alike), each with a fresh random prompt of
exactly --prompt-len token ids (no prefix-cache hits), streamed, TTFT timed at the client. Reported: the
median TTFT of each stack, disaggregated / colocated for both transports against the target (<= 1.10), the KV
bytes per request, and from the prefill worker's metrics the bytes on its PushKv stream per request (headers
only with shared memory) and its mean KV transfer span (first chunk to the commit's acknowledgement).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path

from bench._smoke import add_smoke, smoke_sizes
from bench._stacks import (
    ModelShape,
    make_model,
    median,
    round_order,
    running_stacks,
    scrape_metric,
    service_object,
    timed_round,
    vocab_size,
    warm_up,
)
from tandem import names

TARGET = 1.10
COLOCATED, AUTO, GRPC = "colocated", "disagg-auto", "disagg-grpc"
DISAGG_TRANSPORTS = {AUTO: "auto", GRPC: "grpc"}


def summarize(ttfts_s: dict[str, list[float]], target: float = TARGET) -> dict:
    """Median and best TTFT per stack (ms); disaggregated / colocated as a ratio of medians and as the
    median of per-repetition ratios (requests of one repetition ran back to back, so that one is the
    least sensitive to background load drifting between repetitions)."""
    med = {label: 1000 * median(values) for label, values in ttfts_s.items()}
    best = {label: 1000 * min(values) for label, values in ttfts_s.items()}
    disagg = [label for label in med if label != COLOCATED]
    ratios = {label: med[label] / med[COLOCATED] for label in disagg}
    paired = {
        label: median([d / c for d, c in zip(ttfts_s[label], ttfts_s[COLOCATED], strict=True)])
        for label in disagg
    }
    return {
        "ttft_median_ms": med,
        "ttft_min_ms": best,
        "ttft_all_ms": {label: [round(1000 * v, 1) for v in values] for label, values in ttfts_s.items()},
        "ratio_vs_colocated": ratios,
        "paired_ratio_median": paired,
        "target": target,
        "meets_target": {label: r <= target for label, r in ratios.items()},
    }


def kv_bytes(prompt_len: int, layers: int, kv_heads: int, head_dim: int, dtype_bytes: int = 4) -> int:
    """Bytes of K and V for a prompt: what a transfer has to move, whatever the transport."""
    return 2 * prompt_len * layers * kv_heads * head_dim * dtype_bytes


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.disagg_overhead", description=__doc__.splitlines()[0])
    p.add_argument("--prompt-len", type=int, default=2048)
    p.add_argument("--max-tokens", type=int, default=2, help="tokens to generate per request")
    p.add_argument("--repeat", type=int, default=7, help="timed requests per stack")
    p.add_argument("--warmup", type=int, default=2, help="untimed requests per stack first")
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--threads", type=int, default=1, help="torch threads of every worker")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    add_smoke(p)
    return smoke_sizes(p.parse_args(argv), prompt_len=32, repeat=1, warmup=0, hidden=64, layers=2)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    shape = ModelShape(args.hidden, args.layers)
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="tandem-overhead-") as tmp:
        model_dir = make_model(Path(tmp) / "model", shape)
        vocab = vocab_size(model_dir)
        blocks = 4 * (args.prompt_len + args.max_tokens) // 16 + 64
        common = dict(threads=args.threads, num_kv_blocks=blocks, max_context=args.prompt_len + 256)
        objects = {COLOCATED: service_object("overhead-colo", model_dir, mode="colocated", **common)}
        for label, transport in DISAGG_TRANSPORTS.items():
            objects[label] = service_object(
                f"overhead-{transport}", model_dir, mode="disaggregated", transport=transport, **common
            )
        with running_stacks(objects, Path(tmp) / "logs") as running:
            labels = list(objects)
            prefill_metrics = {
                label: next(p.metrics_port for p in running[label][0].plans if p.role == "prefill")
                for label in DISAGG_TRANSPORTS
            }
            warm_up(running, args.warmup, args.prompt_len, args.max_tokens, rng, vocab)
            before = {label: _prefill_counters(port) for label, port in prefill_metrics.items()}
            ttfts: dict[str, list[float]] = {label: [] for label in labels}
            for rep in range(args.repeat):
                for label, t in timed_round(
                    running, round_order(labels, rep), args.prompt_len, args.max_tokens, rng, vocab
                ).items():
                    ttfts[label].append(t.ttft_s)
                    print(f"  rep {rep} {label:<12} TTFT {1000 * t.ttft_s:8.1f} ms", flush=True)
            after = {label: _prefill_counters(port) for label, port in prefill_metrics.items()}
    result = summarize(ttfts)
    result["prefill_worker"] = {
        label: {
            "wire_bytes_per_request": (after[label][0] - before[label][0]) / args.repeat,
            "kv_span_mean_ms": 1000
            * (after[label][1] - before[label][1])
            / max(1, after[label][2] - before[label][2]),
        }
        for label in DISAGG_TRANSPORTS
    }
    tiny = shape.tiny_spec()
    result["kv_bytes_per_request"] = kv_bytes(
        args.prompt_len, tiny.layers, tiny.kv_heads, tiny.hidden // tiny.heads
    )
    result["config"] = {
        "prompt_len": args.prompt_len,
        "max_tokens": args.max_tokens,
        "repeat": args.repeat,
        "warmup": args.warmup,
        "model": vars(tiny),
        "threads_per_worker": args.threads,
        "dtype": "float32",
    }
    print(report(result))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


def _prefill_counters(metrics_port: int) -> tuple[float, float, float]:
    """(KV bytes pushed, sum and count of KV transfer spans (first chunk to commit), every transport) from a
    prefill worker."""
    return (
        scrape_metric(metrics_port, names.KV_TRANSFER_BYTES_TOTAL),
        scrape_metric(metrics_port, names.KV_TRANSFER_SECONDS + "_sum"),
        scrape_metric(metrics_port, names.KV_TRANSFER_SECONDS + "_count"),
    )


def report(result: dict) -> str:
    cfg = result["config"]
    med, ratios = result["ttft_median_ms"], result["ratio_vs_colocated"]
    lines = [
        f"Disaggregation overhead: one {cfg['prompt_len']}-token prompt on an idle stack, median of "
        f"{cfg['repeat']} (model hidden {cfg['model']['hidden']}, {cfg['model']['layers']} layers, "
        f"{cfg['dtype']}, {cfg['threads_per_worker']} torch thread per worker)",
        f"  TTFT colocated              median {med[COLOCATED]:8.1f} ms  best "
        f"{result['ttft_min_ms'][COLOCATED]:8.1f} ms",
    ]
    for label, transport in DISAGG_TRANSPORTS.items():
        pw = result["prefill_worker"][label]
        lines.append(
            f"  TTFT disaggregated ({transport:<4})  median {med[label]:8.1f} ms  best "
            f"{result['ttft_min_ms'][label]:8.1f} ms  ratio {ratios[label]:.3f} (paired "
            f"{result['paired_ratio_median'][label]:.3f}; target <= {result['target']:.2f}: "
            f"{'met' if result['meets_target'][label] else 'MISSED'})  KV span {pw['kv_span_mean_ms']:.1f} "
            f"ms, {pw['wire_bytes_per_request'] / 2**20:.2f} MiB/request on the PushKv stream"
        )
    lines.append(f"  KV per request: {result['kv_bytes_per_request'] / 2**20:.1f} MiB (K and V, all layers)")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

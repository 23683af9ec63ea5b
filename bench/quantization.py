"""Int8 weights and the 8-bit KV cache against the unquantized engine, side by side in one run.

Four variants of one random-weight Llama (built here; ~100M parameters by default, big enough that a
decode step's weight reads leave the CPU caches): the baseline, int8 weights (`model.quantization`),
the 8-bit KV cache (`engine.kvCacheDtype`), and both. For each: decode tokens/s at batch 1 and 32
(median and spread over the repeats; the variants take turns inside each repeat), the bytes of the
weights, the sequences at the full context the KV planner fits in the same budget, and the accuracy
against the baseline over 64 greedy tokens (logits error, top-1 agreement, tokens before the first
disagreement), teacher-forced on the baseline's own tokens.

    python -m bench.quantization [--threads 1] [--dtype bfloat16] [--repeats 3] [--out result.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from bench._smoke import add_smoke, smoke_sizes
from bench.engine_timing import random_prompts, time_engine, use_cpu_clock
from tandem.worker.devtools.accuracy import Agreement, agreement, greedy_continuation
from tandem.worker.devtools.tiny import TinySpec, create_tiny_model
from tandem.worker.engine.layers.weight_int8 import weight_nbytes
from tandem.worker.engine.loading import load_model
from tandem.worker.engine.memory import plan_kv_cache
from tandem.worker.engine.runner.engine import Engine, EngineConfig

BLOCK_SIZE = 16
CONTEXT = 4096  # the context the KV capacity is counted at
VARIANTS = {  # name: (model.quantization, engine.kvCacheDtype)
    "baseline": ("none", "auto"),
    "int8 weights": ("int8", "auto"),
    "int8 KV": ("none", "int8"),
    "both": ("int8", "int8"),
}


@dataclass(frozen=True)
class VariantResult:
    name: str
    decode_tok_s: dict[int, list[float]]  # batch -> one figure per repeat
    weight_bytes: int
    kv_sequences: float  # sequences at CONTEXT in the planner's CPU budget
    accuracy: list[Agreement]  # one per prompt; empty for the baseline


def median_spread(xs: list[float]) -> tuple[float, float, float]:
    return statistics.median(xs), min(xs), max(xs)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    p.add_argument("--batches", default="1,32")
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=16, help="tokens per sequence in each timed run")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--accuracy-prompts", type=int, default=4)
    p.add_argument("--accuracy-tokens", type=int, default=64)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--intermediate", type=int, default=2048)
    p.add_argument(
        "--clock", choices=["cpu", "wall"], default="cpu", help="cpu: this process's CPU time (a shared host)"
    )
    p.add_argument("--out", type=Path, default=None, help="also write the results as JSON")
    add_smoke(p)
    args = smoke_sizes(
        p.parse_args(argv),
        batches="1,2",
        prompt_len=8,
        new_tokens=4,
        repeats=1,
        accuracy_prompts=1,
        accuracy_tokens=4,
        layers=2,
        hidden=64,
        heads=4,
        kv_heads=2,
        intermediate=128,
    )
    args.batch_sizes = [int(b) for b in args.batches.split(",")]
    return args


def run(args: argparse.Namespace, model_dir: Path) -> dict:
    torch.set_num_threads(args.threads)
    if args.clock == "cpu":
        use_cpu_clock()
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    models = {q: load_model(model_dir, args.dtype, quantization=q) for q in ("none", "int8")}
    base = models["none"]
    vocab, params = base.config.vocab_size, sum(p.numel() for p in base.parameters())
    max_batch = max(args.batch_sizes)
    config = EngineConfig(
        block_size=BLOCK_SIZE,
        num_kv_blocks=max_batch * -(-(args.prompt_len + args.new_tokens + 1) // BLOCK_SIZE) + 8,
        max_running_sequences=max_batch,
        max_batch_tokens=max(2048, max_batch * args.prompt_len),
        prefill_chunk_tokens=max(512, args.prompt_len),
        enable_prefix_caching=False,
    )
    engines = {
        name: Engine(models[q], dataclasses.replace(config, kv_cache_dtype=kv))
        for name, (q, kv) in VARIANTS.items()
    }
    log(f"model: {params / 1e6:.1f}M parameters in {args.dtype}, {args.threads} threads; warming up")
    for engine in engines.values():
        time_engine(engine, random_prompts(2, args.prompt_len, vocab, seed=1), 4)
    tok_s: dict[str, dict[int, list[float]]] = {name: {b: [] for b in args.batch_sizes} for name in VARIANTS}
    for r in range(args.repeats):
        for batch in args.batch_sizes:
            prompts = random_prompts(batch, args.prompt_len, vocab, seed=100 + r * 100 + batch)
            for name, engine in engines.items():  # the variants take turns on the same prompts
                timing = time_engine(engine, prompts, args.new_tokens)
                tok_s[name][batch].append(timing.decode_tok_s)
                log(f"repeat {r + 1} batch {batch:>2} {name:<13} {timing.decode_tok_s:8.1f} tok/s")
    acc_prompts = [random_prompts(1, 20, vocab, seed=7000 + i)[0] for i in range(args.accuracy_prompts)]
    ref_tokens = [greedy_continuation(base, p, args.accuracy_tokens) for p in acc_prompts]
    results = []
    for name, (q, kv) in VARIANTS.items():
        plan = plan_kv_cache(models[q], dataclasses.replace(config, kv_cache_dtype=kv, max_model_len=CONTEXT))
        accuracy = (
            []
            if name == "baseline"
            else [
                agreement(base, models[q], p, kv_cache_dtype=kv, continuation=t)
                for p, t in zip(acc_prompts, ref_tokens, strict=True)
            ]
        )
        results.append(
            VariantResult(
                name, tok_s[name], weight_nbytes(models[q]), plan.max_concurrent_sequences, accuracy
            )
        )
    title = (
        f"{params / 1e6:.0f}M-parameter random-weight Llama ({args.layers} layers, hidden {args.hidden}, "
        f"{args.heads} heads / {args.kv_heads} KV heads, head_dim {base.config.head_dim}) in {args.dtype}, "
        f"{args.threads} thread(s), {args.clock} clock, prompt {args.prompt_len}, {args.new_tokens} new "
        f"tokens, median [min-max] of {args.repeats}; torch {torch.__version__}"
    )
    print_table(results, args.batch_sizes, title)
    return {
        "title": title,
        "args": {k: v for k, v in vars(args).items() if k != "out"},
        "variants": [_json(r) for r in results],
    }


def _json(r: VariantResult) -> dict:
    return {**asdict(r), "accuracy": [asdict(a) for a in r.accuracy]}


def print_table(results: list[VariantResult], batches: list[int], title: str) -> None:
    base = results[0]
    print(f"\n{title}\n")
    print("| figure | " + " | ".join(r.name for r in results) + " |")
    print("| --- |" + " --- |" * len(results))
    for b in batches:
        cells = []
        for r in results:  # each repeat's ratio is measured side by side with that repeat's baseline
            med, lo, hi = median_spread(r.decode_tok_s[b])
            ratio = median_spread(
                [x / y for x, y in zip(r.decode_tok_s[b], base.decode_tok_s[b], strict=True)]
            )
            cells.append(f"{med:.1f} [{lo:.1f}-{hi:.1f}], {ratio[0]:.2f}x [{ratio[1]:.2f}-{ratio[2]:.2f}]")
        print(f"| decode tok/s, batch {b}: median [min-max], ratio to baseline | " + " | ".join(cells) + " |")
    print(
        "| weight memory (MiB) | "
        + " | ".join(
            f"{r.weight_bytes / 2**20:.0f} ({r.weight_bytes / base.weight_bytes:.2f}x)" for r in results
        )
        + " |"
    )
    print(
        f"| KV capacity, sequences at {CONTEXT} tokens | "
        + " | ".join(f"{r.kv_sequences:.1f} ({r.kv_sequences / base.kv_sequences:.2f}x)" for r in results)
        + " |"
    )
    acc = results[1:]
    print(
        "| logits max abs error (rel. to max logit) | - | "
        + " | ".join(
            f"{max(a.max_abs_error for a in r.accuracy):.3g} ({max(a.rel_error for a in r.accuracy):.2%})"
            for r in acc
        )
        + " |"
    )
    print(
        "| top-1 agreement over 64 tokens, mean [min] | - | "
        + " | ".join(
            f"{statistics.mean(a.top1_agreement for a in r.accuracy):.1%} "
            f"[{min(a.top1_agreement for a in r.accuracy):.0%}]"
            for r in acc
        )
        + " |"
    )
    print(
        "| greedy tokens before the first disagreement, per prompt | - | "
        + " | ".join(",".join(str(a.greedy_prefix) for a in r.accuracy) for r in acc)
        + " |"
    )
    margin = statistics.median(a.median_margin for a in acc[0].accuracy)
    print(
        f"\nThe baseline's median gap between its top two logits: {margin:.3g} (random weights: near-ties)."
    )


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tandem-bench-") as tmp:
        spec = TinySpec(
            layers=args.layers,
            hidden=args.hidden,
            heads=args.heads,
            kv_heads=args.kv_heads,
            intermediate=args.intermediate,
            max_positions=CONTEXT,
        )
        result = run(args, create_tiny_model(Path(tmp) / "model", spec))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

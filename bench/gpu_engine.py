"""How close our engine gets to an H200's limits with a Llama-3.2-1B shape: bandwidth, FLOPs, batch decode.

A random-weight model with Llama-3.2-1B's shape (hidden 2048, 16 layers, 32 heads, 8 KV heads,
intermediate 8192, vocab 128256, tied embeddings) is written in bf16 with the tiny-model tools and loaded
through the real loading path. Reported:

- decode memory-bandwidth utilisation at batch 1: (weight bytes + KV bytes read per step) / step time
  / 4.8 TB/s, target >= 70%;
- prefill FLOP utilisation for one 2048-token prompt: model FLOPs / time / 790 TFLOP/s, target >= 50%;
- decode tokens/s at batch 64;
- the host's CPU time per decode step at batch 1 and 256 (bench/step_cpu.py): schedule + update, and the eager
  forward's launch, each timed on the engine thread's CPU clock with the device drained around it;
- decode tokens/s at batch 1 and 64 for each `--decode-steps` mode (default: eager, then the static step
  captured as CUDA graphs), with the decode step's warm-up time; a fresh engine per mode, same weights;
- a mixture of experts (Mixtral layout, 8 experts, top 2, at the same hidden size, 8 layers; `--no-moe`
  skips it): prefill time of one `--prefill-tokens` prompt and decode tokens/s at batch 1 and `--batch`.

- FP8 weights at Llama-3.1-8B's shape (`--no-fp8` skips; bench/fp8_rows.py): ms per decode step at batch 1
  and 64 (context 512) and 49 (context 3,072), and a 2,134-token prefill, each beside vLLM's FP8 figure on
  an H200 from tandem/profiles/h200-llama-3.1-8b-fp8.json.
- decode attention alone, each backend side by side (`sdpa`, `flex`, `triton`; general path and the static
  step captured as a CUDA graph), at batch 1/16/64 and context 512/4096, ms and % of the copy floor it
  measures (bench/attention_backends.py; `--attention-backends ''` skips it);

- tensor parallelism (`--tensor-parallel 2`, 0 skips): the same model split across that many GPUs (NCCL),
  prefill time and decode tokens/s at batch 1 and `--batch`, each with its runs; skipped, saying so, on a
  host with fewer GPUs (the dry run: that many gloo processes on the CPU).

    python -m bench.gpu_engine [--decode-steps eager,cudaGraphs] [--out result.json]
    python -m bench.gpu_engine --dry-run    # the same code on the CPU at a tiny size (cudaGraphs: compiled)
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import torch

from bench import attention_backends
from bench._roofline import Result, decode_bandwidth, median_of, prefill_utilisation
from bench._shapes import MOE_SHAPE, write_llama_1b_shaped, write_llama_8b_shaped
from bench.engine_timing import random_prompts, time_engine
from bench.fp8_rows import fp8_rows
from bench.step_cpu import host_step_table
from tandem.worker.devtools.tiny import (
    TinySpec,
    create_tiny_model,
)
from tandem.worker.engine.loading import load_model
from tandem.worker.engine.runner.compiled import compile_layers
from tandem.worker.engine.runner.compiled import warm_up as compiled_warm_up
from tandem.worker.engine.runner.decode_graphs import DECODE_STEPS
from tandem.worker.engine.runner.engine import Engine, EngineConfig

BLOCK_SIZE = 16


def engine_config(args: argparse.Namespace, decode_step: str = "eager") -> EngineConfig:
    longest = max(args.context, args.prefill_tokens) + args.new_tokens
    return EngineConfig(
        block_size=BLOCK_SIZE,
        num_kv_blocks=args.batch * -(-longest // BLOCK_SIZE) + 64,
        max_running_sequences=max(64, args.batch),
        max_batch_tokens=max(args.prefill_tokens, args.batch * args.context, 2048),
        prefill_chunk_tokens=max(args.prefill_tokens, args.context),
        max_model_len=longest,  # bounds the static decode step's page-table buckets
        attention=args.attention,
        decode_step=decode_step,
    )


def decode_tok_s(engine: Engine, batch: int, args: argparse.Namespace, seed: int) -> float:
    """Median decode tokens/s of `batch` sequences after `args.context`-token prompts."""
    vocab = engine.model.config.vocab_size
    time_engine(engine, random_prompts(batch, args.context, vocab, seed=seed), 4)  # this batch's shapes, once
    runs = [
        time_engine(engine, random_prompts(batch, args.context, vocab, seed=seed + 1 + i), args.new_tokens)
        for i in range(args.repeats)
    ]
    return statistics.median(r.decode_tok_s for r in runs)


def compare_decode_steps(model: torch.nn.Module, args: argparse.Namespace, device: str) -> list[Result]:
    """Decode tokens/s at batch 1 and `args.batch` for each decode-step mode, a fresh engine (and cache)
    each."""
    results = []
    for mode in args.decode_step_modes:
        if mode == "cudaGraphs" and device != "cuda":
            mode = "compiled"  # the dry run: the same step without capture
        engine = Engine(model, engine_config(args, mode), eos_token_ids=())
        warm_s = 0.0
        if engine.decode_step is not None:
            start = time.perf_counter()
            compiled_warm_up(engine)  # every bucket compiled (and captured) before timing
            warm_s = time.perf_counter() - start
            print(
                f"{mode}: {len(engine.decode_step.start_shapes)} of {len(engine.decode_step.shapes)} decode "
                f"buckets warmed up at start in {warm_s:.1f} s",
                flush=True,
            )
        for batch in (1, args.batch):
            results.append(
                Result(
                    f"decode batch {batch}, {mode} decode step: tokens/s",
                    decode_tok_s(engine, batch, args, 400 + batch),
                    "tok/s",
                )
            )
        if engine.decode_step is not None:
            results.append(Result(f"{mode} decode step: warm-up", warm_s, "s"))
        del engine
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    return results


def run(args: argparse.Namespace, model_dir: Path, device: str = "cuda") -> list[Result]:
    model = load_model(model_dir, args.dtype, device)
    if args.compile:
        compile_layers(model)
    print(
        f"model: {sum(p.numel() for p in {id(p): p for p in model.parameters()}.values()) / 1e9:.2f}B params"
    )
    results = utilisation(model, args)  # its engine and cache are freed before the next ones
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    results += host_step_rows(model, args, device)
    return results + compare_decode_steps(model, args, device)


def host_step_rows(model: torch.nn.Module, args: argparse.Namespace, device: str) -> list[Result]:
    """The host's CPU time per decode step at batch 1 and 256 (bench/step_cpu.py), eager, after `--context`
    tokens."""
    table = host_step_table(model, engine_config(args), args.context, max(4, min(args.new_tokens, 16)))  # type: ignore[arg-type]
    rows = []
    for batch, step in table.items():
        rows.append(
            Result(
                f"decode batch {batch}: host CPU per step, schedule + update",
                step.schedule_update_s * 1e3,
                "ms",
            )
        )
        rows.append(
            Result(f"decode batch {batch}: host CPU per step, eager launch", step.launch_s * 1e3, "ms")
        )
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return rows


def utilisation(model: torch.nn.Module, args: argparse.Namespace) -> list[Result]:
    """Bandwidth and FLOP utilisation and batch decode tokens/s on the general path (`--attention`,
    `--compile`)."""
    engine = Engine(model, engine_config(args), eos_token_ids=())
    if args.compile or args.attention in ("flex", "triton"):
        compiled_warm_up(engine)  # compile outside the timed runs
    vocab = model.config.vocab_size
    time_engine(engine, random_prompts(4, args.context, vocab, seed=1), 8)  # warm up kernels and allocator
    mbu, step_s = median_of(
        args.repeats, lambda s: decode_bandwidth(engine, args.context, args.new_tokens, s), 100
    )
    mfu, prefill_s = median_of(
        args.repeats, lambda s: prefill_utilisation(engine, args.prefill_tokens, s), 200
    )
    time_engine(engine, random_prompts(args.batch, args.context, vocab, seed=2), 4)  # warm up the batch shape
    batch_runs = [
        time_engine(engine, random_prompts(args.batch, args.context, vocab, seed=300 + i), args.new_tokens)
        for i in range(args.repeats)
    ]
    return [
        Result("decode batch 1: memory-bandwidth utilisation", 100 * mbu, "% of 4.8 TB/s", 70.0),
        Result("decode batch 1: step time", step_s * 1e3, "ms"),
        Result(
            f"prefill {args.prefill_tokens} tokens: FLOP utilisation", 100 * mfu, "% of 790 TFLOP/s", 50.0
        ),
        Result(f"prefill {args.prefill_tokens} tokens: time", prefill_s * 1e3, "ms"),
        Result(
            f"decode batch {args.batch}: tokens/s",
            statistics.median(r.decode_tok_s for r in batch_runs),
            "tok/s",
        ),
    ]


def moe_rows(args: argparse.Namespace, model_dir: Path, device: str) -> list[Result]:
    """Prefill time and decode tokens/s of a mixture-of-experts model on the general path."""
    model = load_model(model_dir, args.dtype, device)
    config = model.config
    engine = Engine(model, engine_config(args), eos_token_ids=())
    time_engine(engine, random_prompts(4, args.context, config.vocab_size, seed=1), 8)  # warm up
    prefill = [
        time_engine(
            engine, random_prompts(1, args.prefill_tokens, config.vocab_size, seed=500 + i), 2
        ).prefill_s
        for i in range(args.repeats)
    ]
    name = f"MoE {config.num_experts} experts top {config.num_experts_per_tok}"
    results = [
        Result(f"{name}: prefill {args.prefill_tokens} tokens: time", 1e3 * statistics.median(prefill), "ms")
    ]
    for batch in (1, args.batch):
        results.append(
            Result(
                f"{name}: decode batch {batch}: tokens/s",
                decode_tok_s(engine, batch, args, 600 + batch),
                "tok/s",
            )
        )
    return results


def tp_rows(args: argparse.Namespace, model_dir: Path, device: str) -> list[Result]:
    """Prefill time and decode tokens/s with the model split across `args.tensor_parallel` ranks (eager
    steps)."""
    ranks = args.tensor_parallel
    if ranks < 2:
        return []
    if device == "cuda" and torch.cuda.device_count() < ranks:
        print(
            f"tensor parallel: skipped, {ranks} ranks need {ranks} GPUs and this host has "
            f"{torch.cuda.device_count()}"
        )
        return []
    from tandem.worker.engine.tp.group import start_ranks
    from tandem.worker.engine.tp.model import load_tensor_parallel

    group = start_ranks(ranks, device, threads=1 if device == "cpu" else None)
    model = load_tensor_parallel(model_dir, args.dtype, "none", group)
    engine = Engine(model, engine_config(args), eos_token_ids=())  # type: ignore[arg-type]
    vocab = model.config.vocab_size
    time_engine(engine, random_prompts(4, args.context, vocab, seed=1), 8)  # warm up
    prefill = [
        time_engine(engine, random_prompts(1, args.prefill_tokens, vocab, seed=700 + i), 2).prefill_s * 1e3
        for i in range(args.repeats)
    ]
    name = f"tensor parallel {ranks} ranks"
    results = [
        Result(
            f"{name}: prefill {args.prefill_tokens} tokens: time (runs {_runs(prefill)})",
            statistics.median(prefill),
            "ms",
        )
    ]
    for batch in (1, args.batch):
        runs = []
        for i in range(args.repeats):
            prompts = random_prompts(batch, args.context, vocab, seed=800 + 10 * batch + i)
            runs.append(time_engine(engine, prompts, args.new_tokens).decode_tok_s)
        results.append(
            Result(
                f"{name}: decode batch {batch}: tokens/s (runs {_runs(runs)})",
                statistics.median(runs),
                "tok/s",
            )
        )
    model.stop()
    return results


def _runs(values: list[float]) -> str:
    return ", ".join(f"{v:,.1f}" for v in values)


def print_results(results: list[Result], caption: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="tandem engine on the GPU (Llama-3.2-1B shape, bf16)", caption=caption)
    for col in ("metric", "value", "unit", "target", "met"):
        table.add_column(col)
    for r in results:
        target = "-" if r.target is None else f">= {r.target:g}"
        table.add_row(
            r.metric, f"{r.value:,.1f}", r.unit, target, {True: "yes", False: "NO", None: "-"}[r.met]
        )
    Console().print(table)


def attention_rows(args: argparse.Namespace, device: torch.device, caption: str) -> dict | None:
    """The attention backends side by side (printed as their own table); their JSON, or None when skipped."""
    if not args.backends:
        return None
    rows, bandwidth = attention_backends.run(args, device)
    attention_backends.print_table(rows, caption)
    return attention_backends.as_json(rows, bandwidth)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--model", type=Path, default=None, help="an existing model directory instead of a random one"
    )
    p.add_argument("--context", type=int, default=512, help="prompt tokens of each decoding sequence")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--prefill-tokens", type=int, default=2048)
    p.add_argument("--batch", type=int, default=64, help="batch size of the decode tokens/s run")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--attention",
        choices=["sdpa", "flex", "triton"],
        default="sdpa",
        help="the engine's attention backend (the decode-step rows use it too: triton or sdpa)",
    )
    attention_backends.add_arguments(p, shapes="llama-3.2-1b")
    p.add_argument("--compile", action="store_true", help="torch.compile norms and MLPs (warmed up first)")
    p.add_argument(
        "--decode-steps",
        default="eager,cudaGraphs",
        help="decode-step modes to compare at batch 1 and --batch (eager, compiled, cudaGraphs; empty: none)",
    )
    p.add_argument("--no-moe", action="store_true", help="skip the mixture-of-experts rows")
    p.add_argument(
        "--no-fp8", action="store_true", help="skip the FP8 rows (Llama-3.1-8B shape, beside vLLM FP8)"
    )
    p.add_argument(
        "--tensor-parallel", type=int, default=2, help="ranks of the tensor-parallel rows (0: skip them)"
    )
    p.add_argument(
        "--dry-run", action="store_true", help="run on the CPU at a tiny size: checks the code, not the GPU"
    )
    p.add_argument("--out", type=Path, default=None, help="also write the results as JSON")
    args = p.parse_args(argv)
    args.decode_step_modes = [m for m in args.decode_steps.split(",") if m]
    unknown = set(args.decode_step_modes) - set(DECODE_STEPS)
    if unknown:
        p.error(f"unknown decode steps {sorted(unknown)}; choose from {', '.join(DECODE_STEPS)}")
    args.dtype = "bfloat16"
    attention_backends.finish_arguments(args, args.dry_run)
    if args.dry_run:  # small enough for a CPU in a minute or two
        args.context, args.new_tokens, args.prefill_tokens, args.batch, args.repeats = 24, 6, 48, 4, 1
        args.dtype = "float32"
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.dry_run:
        with tempfile.TemporaryDirectory(prefix="tandem-gpu-bench-dry-") as tmp:
            model_dir = args.model or create_tiny_model(Path(tmp) / "model", TinySpec(layers=2))
            results = run(args, model_dir, "cpu")
            if not args.no_moe:
                moe_dir = create_tiny_model(Path(tmp) / "moe", TinySpec(arch="mixtral", layers=2))
                results += moe_rows(args, moe_dir, "cpu")
            results += tp_rows(args, model_dir, "cpu")
            if not args.no_fp8:
                points = ((1, args.context), (args.batch, args.context))
                results += fp8_rows(args, model_dir, "cpu", points, args.prefill_tokens)
            print_results(results, "dry run on the CPU, tiny model: not a measurement")
        attention_rows(args, torch.device("cpu"), "dry run on the CPU, tiny shape: not a measurement")
        return 0
    if not torch.cuda.is_available():
        print(
            "bench/gpu_engine.py needs a CUDA GPU and torch with CUDA; none is available here",
            file=sys.stderr,
        )
        return 2
    with tempfile.TemporaryDirectory(prefix="tandem-gpu-bench-") as tmp:
        model_dir = args.model or write_llama_1b_shaped(Path(tmp) / "model")
        results = run(args, model_dir)
        if not args.no_moe:
            gc.collect()
            torch.cuda.empty_cache()
            results += moe_rows(args, create_tiny_model(Path(tmp) / "moe", MOE_SHAPE), "cuda")
        gc.collect()
        torch.cuda.empty_cache()
        results += tp_rows(args, model_dir, "cuda")
        if not args.no_fp8:
            gc.collect()
            torch.cuda.empty_cache()
            results += fp8_rows(
                args, write_llama_8b_shaped(Path(tmp) / "llama-3.1-8b", device="cuda"), "cuda"
            )
    caption = (
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}; batch-1 decode after {args.context} "
        f"prompt tokens, {args.new_tokens} new tokens; median of {args.repeats}"
    )
    print_results(results, caption)
    gc.collect()
    torch.cuda.empty_cache()
    attention = attention_rows(args, torch.device("cuda"), caption.split(";")[0])
    if args.out is not None:
        data = {
            "caption": caption,
            "results": [{**asdict(r), "met": r.met} for r in results],
            "attention": attention,
        }
        args.out.write_text(json.dumps(data, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

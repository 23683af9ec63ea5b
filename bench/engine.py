"""Our engine against Hugging Face transformers' `generate`, in one run: prefill and decode tokens/s.

Both load the same random-weight checkpoint (written by `create_tiny_model`) in the same dtype and run
under the same torch thread count. Each run sends a batch of B random prompts of L tokens and generates
N tokens per prompt, greedy, never stopping early. Prefill time is from submission until every sequence
has its first token; decode time is from then until the last token, over B * (N - 1) tokens.

With `--arch mixtral` or `--arch qwen2_moe` the random model is a mixture of experts of the same shape
(each expert `--intermediate` wide; Qwen2-MoE's shared expert twice that); its ceiling column is left empty,
as the floor times dense linear layers only.

The ceiling column is the matmul floor's tokens/s over transformers' (bench/engine_floor.py): the best
ratio any engine could reach at that row with these weights and matmul kernels if attention, the KV cache
and all its bookkeeping were free. A target above the ceiling cannot be met on this host's kernels.

    python -m bench.engine [--threads 2] [--batches 1,8,32] [--decode-step compiled] [--out result.json]
    python -m bench.engine --arch mixtral [--experts 8 --experts-per-token 2]   # a tiny mixture of experts

`--tensor-parallel 2` splits our model across two ranks (this process and one it starts, gloo on the CPU),
each with `--threads / 2` torch threads, so both sides use the same cores; its rows read `prefill tp2` etc.

    python -m bench.engine --tensor-parallel 2 --batches 1,8 --no-mixed

`--decode-step compiled` runs pure-decode steps through the static-shape compiled step (warmed up, every
bucket, before the timed runs).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers.generation.streamers import BaseStreamer

from bench._smoke import add_smoke, smoke_sizes
from bench.engine_floor import floor_tok_s
from bench.engine_timing import RunTiming, now, random_prompts, time_engine, use_cpu_clock
from tandem.worker.devtools.tiny import TINY_ARCHITECTURES, TinySpec, create_tiny_model
from tandem.worker.engine.loading import build_engine, engine_for_model
from tandem.worker.engine.runner.engine import Engine, EngineConfig

BLOCK_SIZE = 16
TARGETS = {
    ("decode", 8): 2.0,
    ("decode", 32): 2.0,
    ("prefill", 1): 1.2,
    ("prefill", 8): 1.2,
    ("prefill", 32): 1.2,
}
MIXED_BATCH = 16  # requests in the mixed-length row: one static batch for transformers


@dataclass(frozen=True)
class Row:
    phase: str  # prefill | decode | mixed (output lengths differ; useful tokens only)
    batch: int
    ours_tok_s: float
    hf_tok_s: float
    target: float | None  # minimum ours / hf
    floor_tok_s: float | None = None  # tokens/s if only the matmuls cost time (bench/engine_floor.py)

    @property
    def ratio(self) -> float:
        return self.ours_tok_s / self.hf_tok_s

    @property
    def ceiling(self) -> float | None:
        """The best ours / hf any engine could reach here with these matmul kernels."""
        return None if self.floor_tok_s is None else self.floor_tok_s / self.hf_tok_s

    @property
    def met(self) -> bool | None:
        return None if self.target is None else self.ratio >= self.target


class TokenClock(BaseStreamer):
    """A transformers streamer that only records when each batch of tokens arrives (the first is the
    prompt)."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    def put(self, value: torch.Tensor) -> None:
        self.times.append(now())

    def end(self) -> None:
        pass


def time_hf(model, prompts: list[list[int]], new_tokens: int) -> RunTiming:
    clock = TokenClock()
    ids = torch.tensor(prompts, dtype=torch.long)
    start = now()
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=0,
        streamer=clock,
    )
    end = now()
    if out.shape != (len(prompts), ids.shape[1] + new_tokens) or len(clock.times) != new_tokens + 1:
        raise RuntimeError(
            f"transformers generated {tuple(out.shape)} with {len(clock.times)} streamer calls"
        )
    first = clock.times[1]
    return RunTiming(first - start, end - first, len(prompts) * (new_tokens - 1))


def load_hf(model_dir: Path, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="sdpa")
    except TypeError:  # transformers < 4.56 spells it torch_dtype
        model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=dtype, attn_implementation="sdpa")
    return model.eval()


def engine_config(max_batch: int, prompt_len: int, new_tokens: int) -> EngineConfig:
    """Room for the largest batch, and a token budget that prefills the whole batch in one step like HF."""
    per_seq = -(-(prompt_len + new_tokens) // BLOCK_SIZE)
    return EngineConfig(
        block_size=BLOCK_SIZE,
        num_kv_blocks=max_batch * per_seq + 16,
        max_running_sequences=max(64, max_batch),
        max_batch_tokens=max(2048, max_batch * prompt_len),
        prefill_chunk_tokens=max(512, prompt_len),
        max_model_len=prompt_len + new_tokens,  # bounds the static decode step's page-table buckets
    )


def median_timing(runs: list[RunTiming]) -> tuple[float, float]:
    """(median prefill seconds, median decode seconds per token) over repeated runs."""
    return statistics.median(r.prefill_s for r in runs), statistics.median(
        r.decode_s / r.decode_tokens for r in runs
    )


def rows_for(
    batch: int,
    prompt_len: int,
    ours: list[RunTiming],
    hf: list[RunTiming],
    floors: dict[str, float] | None = None,
) -> list[Row]:
    (op, od), (hp, hd) = median_timing(ours), median_timing(hf)
    floors = floors or {}
    return [
        Row(
            "prefill",
            batch,
            batch * prompt_len / op,
            batch * prompt_len / hp,
            TARGETS.get(("prefill", batch)),
            floors.get("prefill"),
        ),
        Row("decode", batch, 1 / od, 1 / hd, TARGETS.get(("decode", batch)), floors.get("decode")),
    ]


def bench_batch(
    batch: int, args: argparse.Namespace, engine: Engine, hf, vocab: int, log: Callable[[str], None]
) -> list[Row]:
    ours, hf_runs = [], []
    floor_runs: dict[str, list[float]] = {"prefill": [], "decode": []}
    for rep in range(args.repeats):
        prompts = random_prompts(batch, args.prompt_len, vocab, seed=1000 * batch + rep)
        torch.set_num_threads(args.ours_threads)  # with tensor parallelism, each rank's share of --threads
        ours.append(time_engine(engine, prompts, args.new_tokens))
        torch.set_num_threads(args.threads)
        hf_runs.append(time_hf(hf, prompts, args.new_tokens))
        for phase, runs in (
            floor_runs.items() if args.tensor_parallel == 1 else ()
        ):  # beside each run, so the same background load touches all three
            runs.append(floor_tok_s(engine.model, phase, batch, args.prompt_len))
        log(f"  batch {batch} run {rep + 1}: ours {fmt_run(ours[-1])} | transformers {fmt_run(hf_runs[-1])}")
    floors = {phase: statistics.median(runs) for phase, runs in floor_runs.items() if runs}
    if (
        engine.model.config.num_experts or args.tensor_parallel > 1
    ):  # the floor times one model's nn.Linear layers
        floors = {}
    rows = rows_for(batch, args.prompt_len, ours, hf_runs, floors)
    if args.tensor_parallel > 1:
        rows = [dataclasses.replace(r, phase=f"{r.phase} tp{args.tensor_parallel}") for r in rows]
    return rows


def bench_mixed(args: argparse.Namespace, engine: Engine, hf, vocab: int, log: Callable[[str], None]) -> Row:
    """Requests that want 8 to 2 x new-tokens outputs: useful output tokens/s, ours vs one static batch."""
    from bench.continuous_batching import output_lengths, run_hf, run_ours

    ours, theirs = [], []
    for rep in range(args.repeats):
        prompts = random_prompts(MIXED_BATCH, args.prompt_len, vocab, seed=7000 + rep)
        lengths = output_lengths(MIXED_BATCH, 8, 2 * args.new_tokens, seed=rep)
        ours.append(sum(lengths) / run_ours(engine, prompts, lengths))
        theirs.append(sum(lengths) / run_hf(hf, prompts, lengths, MIXED_BATCH))
        log(f"  mixed run {rep + 1}: ours {ours[-1]:.0f} tok/s | transformers {theirs[-1]:.0f} tok/s")
    return Row("mixed", MIXED_BATCH, statistics.median(ours), statistics.median(theirs), None)


def fmt_run(r: RunTiming) -> str:
    return f"prefill {r.prefill_s * 1e3:.0f} ms, decode {r.decode_s * 1e3:.0f} ms / {r.decode_tokens} tok"


def print_table(rows: list[Row], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="tandem engine vs transformers generate", caption=title)
    for col in ("phase", "batch", "ours tok/s", "HF tok/s", "ours / HF", "ceiling", "target", "met"):
        table.add_column(col, justify="right" if col not in ("phase", "met") else "left")
    for r in rows:
        target = f">= {r.target:.1f}x" if r.target is not None else "-"
        met = {True: "yes", False: "NO", None: "-"}[r.met]
        table.add_row(
            r.phase,
            str(r.batch),
            f"{r.ours_tok_s:,.0f}",
            f"{r.hf_tok_s:,.0f}",
            f"{r.ratio:.2f}x",
            "-" if r.ceiling is None else f"{r.ceiling:.2f}x",
            target,
            met,
        )
    Console().print(table)


def parse_args(argv: list[str]) -> argparse.Namespace:
    d = TinySpec()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--threads", type=int, default=os.cpu_count(), help="torch threads for both (default: all cores)"
    )
    p.add_argument("--batches", default="1,8,32", help="comma-separated batch sizes")
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3, help="timed runs per batch size; the median is reported")
    p.add_argument(
        "--model", type=Path, default=None, help="an existing model directory instead of a random one"
    )
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--intermediate", type=int, default=1408)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument(
        "--arch", choices=list(TINY_ARCHITECTURES), default=d.arch, help="the random model's architecture"
    )
    p.add_argument(
        "--experts", type=int, default=d.experts, help="mixtral, qwen2_moe: routed experts per layer"
    )
    p.add_argument(
        "--experts-per-token", type=int, default=d.experts_per_token, help="mixtral, qwen2_moe: top k"
    )
    p.add_argument(
        "--clock", choices=["wall", "cpu"], default="wall", help="cpu: this process's CPU time (shared hosts)"
    )
    p.add_argument("--attention", default="sdpa", help="our engine's attention backend (sdpa | flex)")
    p.add_argument(
        "--decode-step",
        choices=["eager", "compiled"],
        default="eager",
        help="our engine's pure-decode steps: the general path, or the static-shape torch.compiled step",
    )
    p.add_argument(
        "--tensor-parallel", type=int, default=1, help="ranks our model is split across (gloo on the CPU)"
    )
    p.add_argument("--no-mixed", action="store_true", help="skip the mixed-length row")
    p.add_argument("--out", type=Path, default=None, help="also write the results as JSON")
    add_smoke(p)
    args = smoke_sizes(
        p.parse_args(argv),
        threads=1,
        batches="1,2",
        prompt_len=8,
        new_tokens=4,
        repeats=1,
        hidden=64,
        layers=2,
        heads=4,
        kv_heads=2,
        intermediate=128,
    )
    args.batch_sizes = [int(b) for b in args.batches.split(",")]
    if args.tensor_parallel > 1 and args.clock == "cpu":
        p.error("--tensor-parallel times wall clock: the other ranks' CPU time is not this process's")
    if args.new_tokens < 2 or args.prompt_len < 1 or args.repeats < 1:
        p.error("need --new-tokens >= 2, --prompt-len >= 1, --repeats >= 1")
    return args


def build_ours(model_dir: Path, config: EngineConfig, args: argparse.Namespace) -> Engine:
    """Our engine on one rank, or with `--tensor-parallel N` on N ranks sharing `--threads` between them."""
    if args.tensor_parallel <= 1:
        return build_engine(model_dir, config, "float32", "cpu")[0]
    from tandem.worker.engine.tp.group import start_ranks
    from tandem.worker.engine.tp.model import load_tensor_parallel

    group = start_ranks(args.tensor_parallel, "cpu", args.ours_threads)
    return engine_for_model(load_tensor_parallel(model_dir, "float32", "none", group), model_dir, config)[0]


def run(args: argparse.Namespace, model_dir: Path) -> dict:
    torch.set_num_threads(args.threads)
    args.ours_threads = max(1, args.threads // args.tensor_parallel)
    if args.clock == "cpu":
        use_cpu_clock()
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    config = engine_config(max(args.batch_sizes + [MIXED_BATCH]), 2 * args.prompt_len, 2 * args.new_tokens)
    config = dataclasses.replace(config, attention=args.attention, decode_step=args.decode_step)
    engine = build_ours(model_dir, config, args)
    if engine.decode_step is not None:
        from tandem.worker.engine.runner.compiled import warm_up

        warm_up(engine)
        log(
            f"decode step: {len(engine.decode_step.start_shapes)} buckets warmed up in "
            f"{engine.decode_step.warm_up_seconds:.1f} s"
        )
    hf = load_hf(model_dir, torch.float32)
    vocab = engine.model.config.vocab_size
    params = sum(p.numel() for p in hf.parameters())  # the whole model (a tensor-parallel rank holds a share)
    log(f"model: {params / 1e6:.1f}M parameters, {args.threads} threads; warming up")
    for seed in (1, 2):
        warm = random_prompts(2, args.prompt_len, vocab, seed=seed)
        torch.set_num_threads(args.ours_threads)
        time_engine(engine, warm, 8)
        torch.set_num_threads(args.threads)
        time_hf(hf, warm, 8)
    rows: list[Row] = []
    for batch in args.batch_sizes:
        rows += bench_batch(batch, args, engine, hf, vocab, log)
    if not args.no_mixed:
        rows.append(bench_mixed(args, engine, hf, vocab, log))
    title = (
        f"{engine.model.config.architecture}, {params / 1e6:.1f}M params fp32, {args.threads} threads,"
        f"{f' {args.tensor_parallel} tensor-parallel ranks (gloo),' if args.tensor_parallel > 1 else ''} "
        f"{args.clock} clock, {args.decode_step} decode step, prompt {args.prompt_len}, {args.new_tokens} "
        f"new tokens (mixed: 8-{2 * args.new_tokens}), median of {args.repeats}"
    )
    print_table(rows, title)
    return {
        "title": title,
        "threads": args.threads,
        "parameters": params,
        "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens,
        "repeats": args.repeats,
        "engine_config": asdict(config),
        "torch": torch.__version__,
        "rows": [{**asdict(r), "ratio": r.ratio, "ceiling": r.ceiling, "met": r.met} for r in rows],
    }


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tandem-bench-") as tmp:
        model_dir = args.model
        if model_dir is None:
            spec = TinySpec(
                layers=args.layers,
                hidden=args.hidden,
                heads=args.heads,
                kv_heads=args.kv_heads,
                intermediate=args.intermediate,
                seed=args.seed,
                arch=args.arch,
                experts=args.experts,
                experts_per_token=args.experts_per_token,
                expert_intermediate=args.intermediate,
                shared_intermediate=2 * args.intermediate,
            )
            model_dir = create_tiny_model(Path(tmp) / "model", spec)
        result = run(args, model_dir)
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

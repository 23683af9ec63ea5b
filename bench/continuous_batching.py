"""Where continuous batching pays: requests that want different numbers of output tokens.

Our engine admits a new request as soon as one finishes; transformers' `generate` runs a static batch
until its longest member is done. Both get the same N requests (random prompts, output lengths drawn
from a range) and the same batch size; we report useful output tokens per second, side by side.

    python -m bench.continuous_batching [--threads 1] [--batch 16] [--requests 48] [--out result.json]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path

import torch

from bench._smoke import add_smoke, smoke_sizes
from bench.engine import engine_config, load_hf
from bench.engine_timing import now, random_prompts
from tandem.worker.api.params import SamplingParams
from tandem.worker.devtools.tiny import TinySpec, create_tiny_model
from tandem.worker.engine.loading import build_engine
from tandem.worker.engine.runner.engine import Engine


def output_lengths(n: int, low: int, high: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(low, high) for _ in range(n)]


def run_ours(engine: Engine, prompts: list[list[int]], lengths: list[int]) -> float:
    """Seconds to serve every request to its own length, at most `max_running_sequences` at a time."""
    start = now()
    for prompt, n in zip(prompts, lengths, strict=True):
        engine.add_request(prompt, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
    produced = 0
    while engine.has_work():
        produced += len(engine.step())
    if produced != sum(lengths):
        raise RuntimeError(f"engine produced {produced} tokens, expected {sum(lengths)}")
    return now() - start


def run_hf(model, prompts: list[list[int]], lengths: list[int], batch: int) -> float:
    """Seconds for static batches of `batch` requests, each batch generating up to its longest length."""
    start = now()
    for i in range(0, len(prompts), batch):
        ids = torch.tensor(prompts[i : i + batch], dtype=torch.long)
        longest = max(lengths[i : i + batch])
        with torch.no_grad():
            model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=longest,
                min_new_tokens=longest,
                do_sample=False,
                pad_token_id=0,
            )
    return now() - start


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--requests", type=int, default=48)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--min-output", type=int, default=8)
    p.add_argument("--max-output", type=int, default=128)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--out", type=Path, default=None)
    add_smoke(p)
    return smoke_sizes(
        p.parse_args(argv), batch=2, requests=4, prompt_len=8, min_output=2, max_output=6, hidden=64, layers=2
    )


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = create_tiny_model(
            Path(tmp),
            TinySpec(
                hidden=args.hidden,
                layers=args.layers,
                heads=8,
                kv_heads=4,
                intermediate=args.hidden * 11 // 4,
            ),
        )
        config = engine_config(args.batch, args.prompt_len, args.max_output)
        config.max_running_sequences = args.batch
        config.max_batch_tokens = args.batch * args.prompt_len
        engine, _ = build_engine(model_dir, config)
        hf = load_hf(model_dir, torch.float32)
        vocab = engine.model.config.vocab_size
        prompts = random_prompts(args.requests, args.prompt_len, vocab, seed=7)
        lengths = output_lengths(args.requests, args.min_output, args.max_output, seed=7)
        run_ours(
            engine, random_prompts(args.batch, args.prompt_len, vocab, seed=1), [4] * args.batch
        )  # warm up
        run_hf(hf, random_prompts(args.batch, args.prompt_len, vocab, seed=1), [4] * args.batch, args.batch)
        ours_s = run_ours(engine, prompts, lengths)
        hf_s = run_hf(hf, prompts, lengths, args.batch)
    useful = sum(lengths)
    result = {
        "requests": args.requests,
        "batch": args.batch,
        "output_tokens": useful,
        "output_range": [args.min_output, args.max_output],
        "ours_tok_s": useful / ours_s,
        "hf_tok_s": useful / hf_s,
        "ratio": hf_s / ours_s,
        "threads": args.threads,
    }
    print(
        f"{args.requests} requests, batch {args.batch}, outputs {args.min_output}-{args.max_output} tokens "
        f"({useful} in all), {args.threads} thread(s)\n"
        f"  ours (continuous batching):   {result['ours_tok_s']:8.1f} output tok/s  ({ours_s:.1f} s)\n"
        f"  transformers (static batches): {result['hf_tok_s']:8.1f} output tok/s  ({hf_s:.1f} s)\n"
        f"  ours / transformers: {result['ratio']:.2f}x  (target >= 2x for decode-heavy batches)"
    )
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

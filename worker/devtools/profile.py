"""`tandem profile`: measure a worker's capacity on the real engine and write the profile the autoscaler
reads.

Prefill: one prompt of each length, run to its first token, at each chunk size. Decode: `batch` sequences
of `context` tokens admitted as already prefilled (the decode worker's own path after a KV transfer), then
the mean time of a few decode steps. Cold start: building the engine (weights loaded) plus a first step.
`--from PROFILE` skips measuring and only rescales an existing profile, for what-ifs: by multipliers
(`--speedup`, `--prefill-speedup`, `--decode-speedup`) or to target figures such as a GPU's published
prefill tokens/s and decode step time (`--scale-to-prefill-tokens-per-s`, `--scale-to-decode-step-ms`).
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from pathlib import Path

from tandem.profile import DecodePoint, PrefillPoint, Profile, load_profile, save_profile

PROG = "tandem profile"
FIRST_TOKEN_ID = 10  # below this sit a tokenizer's special tokens


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}") from e
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"need positive integers: {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, description="Measure prefill and decode capacity on the real engine."
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="a Hugging Face model directory to measure")
    src.add_argument("--from", dest="source", help="an existing profile to rescale instead of measuring")
    p.add_argument("-o", "--output", required=True, help="where to write the profile JSON")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (a worker's engine.threads)")
    p.add_argument("--prompt-lengths", type=_ints, default=[64, 256, 1024, 2048])
    p.add_argument(
        "--chunks", type=_ints, default=[512], help="prefill chunk sizes; the first is the default"
    )
    p.add_argument("--batches", type=_ints, default=[1, 4, 16, 32])
    p.add_argument("--contexts", type=_ints, default=[128, 1024])
    p.add_argument("--decode-steps", type=int, default=6, help="timed steps per decode point")
    p.add_argument("--repeats", type=int, default=2, help="prefill runs per point (the fastest is kept)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-kv-blocks", type=int, default=4096, help="KV blocks of one replica (its capacity)")
    p.add_argument("--max-running-sequences", type=int, default=64)
    p.add_argument(
        "--kv-transfer-ms-per-token", type=float, default=0.0, help="not measured here; see bench/"
    )
    p.add_argument("--speedup", type=float, default=1.0, help="what-if: divide every time by this")
    p.add_argument("--prefill-speedup", type=float, default=1.0, help="what-if: divide prefill times by this")
    p.add_argument("--decode-speedup", type=float, default=1.0, help="what-if: divide decode times by this")
    p.add_argument(
        "--scale-to-prefill-tokens-per-s",
        type=float,
        default=None,
        help="what-if: scale prefill so one replica does this many prompt tokens/s at the profiled chunk "
        "(a GPU's published figure)",
    )
    p.add_argument(
        "--scale-to-decode-step-ms",
        type=float,
        default=None,
        help="what-if: scale decode so one step of a single 512-token sequence takes this long",
    )
    p.add_argument("--note", default="", help="what the scaling stands for (kept in the profile)")
    p.add_argument("--seed", type=int, default=0)
    return p


def measure(args: argparse.Namespace) -> Profile:
    import torch

    from tandem.worker.api.params import SamplingParams
    from tandem.worker.engine.loading import build_engine
    from tandem.worker.engine.runner.engine import EngineConfig

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.threads:
        torch.set_num_threads(args.threads)
    rng = random.Random(args.seed)

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    def engine_for(chunk: int):
        config = EngineConfig(
            block_size=args.block_size,
            num_kv_blocks=args.num_kv_blocks,
            max_running_sequences=args.max_running_sequences,
            max_batch_tokens=max(chunk, args.max_running_sequences),
            prefill_chunk_tokens=chunk,
            enable_prefix_caching=False,
        )
        return build_engine(args.model, config, args.dtype, device)[0]

    started = time.perf_counter()
    engine = engine_for(args.chunks[0])
    vocab = engine.model.config.vocab_size
    one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    engine.add_request([rng.randrange(FIRST_TOKEN_ID, vocab) for _ in range(16)], one)
    while engine.has_work():
        engine.step()
    sync()
    cold_start_ms = (time.perf_counter() - started) * 1000

    prefill: list[PrefillPoint] = []
    for chunk in args.chunks:
        eng = engine if chunk == args.chunks[0] else engine_for(chunk)
        for n in args.prompt_lengths:
            best = math.inf
            for _ in range(args.repeats):
                ids = [rng.randrange(FIRST_TOKEN_ID, vocab) for _ in range(n)]
                t0 = time.perf_counter()
                eng.add_request(ids, one)
                while eng.has_work():
                    eng.step()
                sync()
                best = min(best, (time.perf_counter() - t0) * 1000)
            prefill.append(PrefillPoint(prompt_tokens=n, chunk_tokens=chunk, ms=best))
            print(f"prefill {n:>6} tokens, chunk {chunk}: {best:8.1f} ms", file=sys.stderr)

    decode: list[DecodePoint] = []
    params = SamplingParams(max_tokens=args.decode_steps + 4, temperature=0.0, ignore_eos=True)
    for ctx in args.contexts:
        for batch in args.batches:
            if (
                batch > args.max_running_sequences
                or batch * (ctx + params.max_tokens) > args.num_kv_blocks * args.block_size
            ):
                continue  # does not fit one replica
            for i in range(batch):
                ids = [rng.randrange(FIRST_TOKEN_ID, vocab) for _ in range(ctx)]
                table, _ = engine.reserve(ids, params)
                engine.admit_prefilled(f"d{ctx}-{batch}-{i}", ids, params, table, first_token=ids[-1])
            engine.step()  # the first step warms this shape
            sync()
            t0 = time.perf_counter()
            for _ in range(args.decode_steps):
                engine.step()
            sync()
            step_ms = (time.perf_counter() - t0) * 1000 / args.decode_steps
            while engine.has_work():
                engine.step()
            decode.append(DecodePoint(batch=batch, context_tokens=ctx, step_ms=step_ms))
            print(f"decode batch {batch:>3}, context {ctx:>5}: {step_ms:7.2f} ms/step", file=sys.stderr)

    return Profile(
        model=Path(args.model).name,
        device=device,
        dtype=args.dtype,
        prefill_chunk_tokens=args.chunks[0],
        max_running_sequences=args.max_running_sequences,
        kv_capacity_tokens=args.num_kv_blocks * args.block_size,
        cold_start_ms=cold_start_ms,
        kv_transfer_ms_per_token=args.kv_transfer_ms_per_token,
        prefill=prefill,
        decode=decode,
    )


def import_dynamo(argv: list[str]) -> int:
    """`tandem profile import-dynamo DIR -o OUT`: a tandem profile from Dynamo's profiler output."""
    from tandem.profile_dynamo import from_dynamo

    p = argparse.ArgumentParser(prog=f"{PROG} import-dynamo", description=import_dynamo.__doc__)
    p.add_argument(
        "directory", help="a Dynamo profiler result: selected_{prefill,decode}_interpolation/raw_data.npz"
    )
    p.add_argument("-o", "--output", required=True, help="where to write the profile JSON")
    p.add_argument("--model", required=True, help="the model the profile measured (kept in the profile)")
    p.add_argument("--device", required=True, help="the accelerator it ran on, e.g. H200")
    p.add_argument("--dtype", default="fp8")
    p.add_argument(
        "--cold-start-s", type=float, default=60.0, help="pod created to Ready (not in Dynamo's data)"
    )
    p.add_argument("--max-running-sequences", type=int, default=256, help="the engine's max_num_seqs")
    p.add_argument("--note", default="", help="where the data came from and under which licence")
    args = p.parse_args(argv)
    try:
        profile = from_dynamo(
            args.directory,
            model=args.model,
            device=args.device,
            dtype=args.dtype,
            cold_start_ms=args.cold_start_s * 1000,
            max_running_sequences=args.max_running_sequences,
            note=args.note,
        )
    except (FileNotFoundError, ValueError, KeyError) as e:
        print(f"{PROG} import-dynamo: error: {e}", file=sys.stderr)
        return 2
    save_profile(profile, args.output)
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["import-dynamo"]:
        return import_dynamo(argv[1:])
    args = build_parser().parse_args(argv)
    if args.source:
        profile = load_profile(args.source)
    elif not Path(args.model).is_dir():
        print(f"{PROG}: error: {args.model}: model directory does not exist", file=sys.stderr)
        return 2
    else:
        profile = measure(args)
    prefill_x, decode_x = args.speedup * args.prefill_speedup, args.speedup * args.decode_speedup
    if args.scale_to_prefill_tokens_per_s:
        chunk = profile.prefill_chunk_tokens
        prefill_x = args.scale_to_prefill_tokens_per_s / (chunk / profile.prefill_ms(chunk) * 1000)
    if args.scale_to_decode_step_ms:
        decode_x = profile.decode_step_ms(1, 512) / args.scale_to_decode_step_ms
    if prefill_x != 1.0 or decode_x != 1.0:
        profile = profile.scaled(prefill=prefill_x, decode=decode_x, note=args.note)
    save_profile(profile, args.output)
    print(f"wrote {args.output}", file=sys.stderr)
    return 0

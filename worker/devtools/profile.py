"""`tandem profile`: measure a worker's capacity on the real engine and write the profile the autoscaler
reads.

The engine is built as `tandem worker` builds it (its options, checks, weight load, KV plan and warm-up:
`tandem.worker.serve.prepare`), with the serving knobs that set its speed (`--attention`, `--decode-step`,
`--quantization`, `--kv-cache-dtype`, `--compile`) spelled as the worker's flags. Prefill: one prompt of
each length, run to its first token, at each chunk size. Decode: `batch` sequences of `context` tokens
admitted as already prefilled (the decode worker's own path after a KV transfer), then the mean time of a few
decode steps.
Cold start: the worker's startup phases (load, KV plan, warm-up with the decode graphs), kept in the
profile's provenance with the command, date, commit, torch version and device name.

`--from PROFILE` skips measuring and only rescales an existing profile, for what-ifs: by multipliers
(`--speedup`, `--prefill-speedup`, `--decode-speedup`) or to target figures such as a GPU's published
prefill tokens/s and decode step time (`--scale-to-prefill-tokens-per-s`, `--scale-to-decode-step-ms`).
Subcommands: `import-dynamo DIR` and `export-dynamo PROFILE` convert from and to Dynamo's profiler layout
(tandem.profile_dynamo); `compare A B` prints two profiles side by side (tandem.profile_compare).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import math
import platform
import random
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tandem.profile import DecodePoint, PrefillPoint, Profile, Provenance, load_profile, save_profile
from tandem.spec_engine import AttentionBackend, DecodeStep, EngineSpec, KvCacheDtype
from tandem.spec_model import Dtype, Quantization
from tandem.worker.devtools.profile_args import PROG, int_list

FIRST_TOKEN_ID = 10  # below this sit a tokenizer's special tokens
COLD_START_PHASES = ("load", "kv_plan", "warmup")  # warmup includes decode_graphs
SERVING_KNOBS = ("dtype", "quantization", "attention", "decode_step", "kv_cache_dtype", "compile")
_ENGINE = EngineSpec()


def _choices(enum: Any) -> list[str]:
    return [m.value for m in enum]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, description="Measure prefill and decode capacity on the real engine."
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="a Hugging Face model directory to measure")
    src.add_argument("--from", dest="source", help="an existing profile to rescale instead of measuring")
    p.add_argument("-o", "--output", required=True, help="where to write the profile JSON")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    # The serving knobs, spelled and checked as `tandem worker` spells them (tandem/options.py).
    p.add_argument("--dtype", default=Dtype.float32.value, choices=_choices(Dtype))
    p.add_argument("--quantization", default=Quantization.none.value, choices=_choices(Quantization))
    p.add_argument("--attention", default=_ENGINE.attention.value, choices=_choices(AttentionBackend))
    p.add_argument("--decode-step", default=_ENGINE.decode_step.value, choices=_choices(DecodeStep))
    p.add_argument("--kv-cache-dtype", default=_ENGINE.kv_cache_dtype.value, choices=_choices(KvCacheDtype))
    p.add_argument("--compile", action="store_true", help="torch.compile the per-token layers (CUDA)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (a worker's engine.threads)")
    p.add_argument("--prompt-lengths", type=int_list, default=[64, 256, 1024, 2048])
    p.add_argument(
        "--chunks", type=int_list, default=[512], help="prefill chunk sizes; the first is the default"
    )
    p.add_argument("--batches", type=int_list, default=[1, 4, 16, 32])
    p.add_argument("--contexts", type=int_list, default=[128, 1024])
    p.add_argument("--decode-steps", type=int, default=6, help="timed steps per decode point")
    p.add_argument("--repeats", type=int, default=2, help="prefill runs per point (the fastest is kept)")
    p.add_argument("--block-size", type=int, default=_ENGINE.block_size)
    p.add_argument(
        "--num-kv-blocks",
        type=int,
        default=None,
        help="KV blocks of one replica (default: planned as the worker plans them, from --kv-memory-percent)",
    )
    p.add_argument("--kv-memory-percent", type=int, default=_ENGINE.kv_cache_memory_percent)
    p.add_argument("--max-running-sequences", type=int, default=_ENGINE.max_running_sequences)
    p.add_argument("--max-batch-tokens", type=int, default=_ENGINE.max_batch_tokens)
    p.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="longest sequence served (default: the model's positions); it sets the decode graphs' buckets",
    )
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
    p.add_argument("--model-name", default=None, help="the model's name in the profile (default: its folder)")
    p.add_argument("--seed", type=int, default=0)
    return p


def worker_options(args: argparse.Namespace, device: str) -> Any:
    """The `tandem worker` options of the engine this measures (the first chunk size)."""
    from tandem.options import Role, WorkerOptions

    return WorkerOptions(
        role=Role.colocated,
        model_dir=args.model,
        served_name=Path(args.model).name,
        dtype=Dtype(args.dtype),
        device=device,
        quantization=Quantization(args.quantization),
        threads=args.threads,
        max_model_len=args.max_model_len,
        block_size=args.block_size,
        num_kv_blocks=args.num_kv_blocks,
        kv_cache_memory_percent=args.kv_memory_percent,
        max_running_sequences=args.max_running_sequences,
        max_batch_tokens=max(args.max_batch_tokens, args.chunks[0]),
        prefill_chunk_tokens=args.chunks[0],
        attention=AttentionBackend(args.attention),
        kv_cache_dtype=KvCacheDtype(args.kv_cache_dtype),
        compile=args.compile,
        decode_step=DecodeStep(args.decode_step),
    )


def cold_start_ms(phases: dict[str, float]) -> float:
    """A replica's engine start from the worker's startup phases (warmup already holds decode_graphs)."""
    return 1000 * sum(phases.get(p, 0.0) for p in COLD_START_PHASES)


def git_commit(where: Path) -> str | None:
    """The commit of the source tree at `where` (`-dirty` with uncommitted changes); None outside git."""
    try:
        head = subprocess.run(
            ["git", "-C", str(where), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        dirty = subprocess.run(
            ["git", "-C", str(where), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux), else what the platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _flag_text(value: Any) -> str:
    """A knob as a worker's command line writes it (an enum's value; true / false)."""
    if isinstance(value, bool):
        return str(value).lower()
    return str(getattr(value, "value", value))


def provenance(argv: list[str], device: str, options: Any, phases: dict[str, float]) -> Provenance:
    import torch

    import tandem

    return Provenance(
        command=shlex.join([*PROG.split(), *argv]),
        date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        commit=git_commit(Path(tandem.__file__).resolve().parent),
        torch=torch.__version__,
        device_name=torch.cuda.get_device_name(device) if device.startswith("cuda") else cpu_name(),
        engine={name: _flag_text(getattr(options, name)) for name in SERVING_KNOBS},
        startup_s={k: round(v, 4) for k, v in phases.items()},
    )


def measure(args: argparse.Namespace, argv: list[str]) -> Profile:
    import torch

    from tandem.worker.api.params import SamplingParams
    from tandem.worker.engine.loading import engine_for_model
    from tandem.worker.engine.runner.compiled import warm_up
    from tandem.worker.serve.prepare import prepare, warmed_engine

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    rng = random.Random(args.seed)

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    options = worker_options(args, device)
    prepared = prepare(options)  # BadOptions: options this worker could not serve
    # random prompts share no prefix anyway; no cached blocks held between points
    prepared.engine_config = dataclasses.replace(prepared.engine_config, enable_prefix_caching=False)
    engine, phases = warmed_engine(options, prepared)
    capacity_tokens = prepared.kv_plan.num_blocks * args.block_size
    vocab = engine.model.config.vocab_size
    one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    print(f"startup: {', '.join(f'{k} {v:.2f} s' for k, v in phases.items())}", file=sys.stderr)

    decode: list[DecodePoint] = []
    params = SamplingParams(max_tokens=args.decode_steps + 4, temperature=0.0, ignore_eos=True)
    for ctx in args.contexts:
        for batch in args.batches:
            if batch > args.max_running_sequences or batch * (ctx + params.max_tokens) > capacity_tokens:
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

    prefill: list[PrefillPoint] = []
    for chunk in args.chunks:
        if chunk != args.chunks[0]:
            del engine  # one KV cache at a time
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
            config = dataclasses.replace(
                prepared.engine_config,
                num_kv_blocks=prepared.kv_plan.num_blocks,
                prefill_chunk_tokens=chunk,
                max_batch_tokens=max(args.max_batch_tokens, chunk),
            )
            engine = engine_for_model(prepared.model, args.model, config)[0]
            warm_up(engine)
        for n in args.prompt_lengths:
            best = math.inf
            for _ in range(args.repeats):
                ids = [rng.randrange(FIRST_TOKEN_ID, vocab) for _ in range(n)]
                t0 = time.perf_counter()
                engine.add_request(ids, one)
                while engine.has_work():
                    engine.step()
                sync()
                best = min(best, (time.perf_counter() - t0) * 1000)
            prefill.append(PrefillPoint(prompt_tokens=n, chunk_tokens=chunk, ms=best))
            print(f"prefill {n:>6} tokens, chunk {chunk}: {best:8.1f} ms", file=sys.stderr)

    return Profile(
        model=args.model_name or Path(args.model).name,
        device=device,
        dtype=args.dtype if args.quantization == "none" else args.quantization,
        prefill_chunk_tokens=args.chunks[0],
        max_running_sequences=args.max_running_sequences,
        kv_capacity_tokens=capacity_tokens,
        cold_start_ms=cold_start_ms(phases),
        kv_transfer_ms_per_token=args.kv_transfer_ms_per_token,
        prefill=prefill,
        decode=decode,
        provenance=provenance(argv, device, options, phases),
    )


def main(argv: list[str]) -> int:
    from tandem.worker.devtools.profile_convert import SUBCOMMANDS

    if argv[:1] and argv[0] in SUBCOMMANDS:
        return SUBCOMMANDS[argv[0]](argv[1:])
    args = build_parser().parse_args(argv)
    if args.source:
        profile = load_profile(args.source)
    elif not Path(args.model).is_dir():
        print(f"{PROG}: error: {args.model}: model directory does not exist", file=sys.stderr)
        return 2
    else:
        from tandem.worker.serve.prepare import BadOptions

        try:
            profile = measure(args, argv)
        except BadOptions as e:
            print(f"{PROG}: error: {e}", file=sys.stderr)
            return 2
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

"""The served stack on one GPU: requests through the router beside the engine alone, and KV transfer per
prompt beside the copy floor.

    python -m bench.gpu_serving [--trace T.csv] [--decode-step cudaGraphs] [--out r.json]
    python -m bench.gpu_serving --tiny  # the same code on the CPU, tiny model

A Llama-3.1-8B-shaped model with random weights (bf16; `--quantization` another the engine loads) is written
at start. Two stacks run through `tandem up`, one after the other, every worker on the same GPU: one
colocated worker, then one prefill and one decode worker. Each replays the trace through the router with the
project's load generator at the `--rates` in turn (rows evenly spaced over the trace, lengths capped, its
arrival pattern stretched to the rate; each probe bounded by `--probe-seconds` of arrivals and
`--max-requests`), and stops after the first rate where fewer than half the requests met the SLO (past
saturation), or once the run has spent its mode's share of `--budget-s` (default 400 s: 40% for the
colocated stack, 80% with the disaggregated one). Each probe prints TTFT and TPOT p50/p90 and SLO attainment
at the spec's default SLO (tandem.slo), the decode (or colocated) worker's mean batch over the probe, and the
engine alone's decode step time at that batch (timed in this process afterwards, at the trace's median
prompt length), so the stack's overhead is a column. Goodput per mode is read from the probed rates as
bench.goodput reads it.

On the disaggregated stack, prompts of each `--kv-lengths` are sent one at a time; the prefill worker's
tandem_kv_transfer_* metrics give per prompt its KV bytes, span (first chunk to the commit's acknowledgement)
and tail (first token to that acknowledgement), labelled with the transport the pair used, beside the floor
of copying those bytes once at this device's measured copy bandwidth. Every worker's startup phases
(tandem_worker_startup_seconds) and the time until the router was ready are printed too.

`--tiny` runs everything on the CPU with the tiny model and small counts: it checks the code, not a GPU.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench._goodput_sweep import Latency
from bench._serving_report import (
    engine_batch,
    fmt,
    kv_row,
    mode_goodput,
    probe_row,
    report,
    saturated,
    with_engine_step,
)
from bench._stacks import (
    metric_samples,
    random_prompt,
    run_completions,
    running_stacks,
    service_object,
    timed_completion,
    wait_idle,
)
from bench._trace_shape import LengthShaping, at_rate, median_lengths, requests_for_rate, thinned
from bench._traces import CONV
from tandem import names
from tandem.loadgen.prompts import Vocabulary, load_vocabulary
from tandem.loadgen.trace import load_trace
from tandem.loadgen.workload import RequestSpec
from tandem.slo import DEFAULT as SLO
from tandem.spec_model import Quantization

COLOCATED, DISAGGREGATED = "colocated", "disaggregated"
BLOCK_SIZE = 16
# Of --budget-s, the share after which no probe of a mode starts (the rest: the KV rows, the engine alone)
BUDGET_SHARE = {"colocated": 0.4, "disaggregated": 0.8}
COPY_MIN_BYTES = (
    64 << 20
)  # the copy floor's bandwidth is measured on at least this much (a small copy is all overhead)
# (GPU default, --tiny default) of each knob the dry run shrinks
SIZES = {
    "rates": ("2,4,8,16", "1,2,4"),
    "probe_seconds": (15.0, 2.0),
    "min_requests": (8, 3),
    "max_requests": (64, 6),
    "max_input_len": (4096, 96),
    "max_output_len": (256, 8),
    "kv_lengths": ("512,2048,8192", "32,64,128"),
    "kv_repeats": (3, 1),
    "kv_gib": (24.0, 0.02),
    "budget_s": (400.0, 300.0),
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.gpu_serving", description=__doc__.splitlines()[0])
    p.add_argument(
        "--trace",
        type=Path,
        default=CONV,
        help="an Azure LLM trace CSV (TIMESTAMP,ContextTokens,GeneratedTokens); default: conversation",
    )
    p.add_argument(
        "--tiny", action="store_true", help="the tiny model on the CPU with small counts: a dry run"
    )
    p.add_argument(
        "--quantization", default="none", help="model.quantization of the workers and the engine alone"
    )
    p.add_argument(
        "--decode-step", default="eager", help="engine.decodeStep of the workers and the engine alone"
    )
    p.add_argument(
        "--rates", help="probed rates, req/s, in order (default {}; --tiny {})".format(*SIZES["rates"])
    )
    p.add_argument("--probe-seconds", type=float, help="seconds of arrivals per probe")
    p.add_argument("--min-requests", type=int)
    p.add_argument("--max-requests", type=int)
    p.add_argument("--max-input-len", type=int, help="trace prompt lengths are capped here")
    p.add_argument("--max-output-len", type=int, help="trace output lengths are capped here")
    p.add_argument("--kv-lengths", help="prompt lengths of the KV transfer rows")
    p.add_argument("--kv-repeats", type=int, help="prompts per KV length (after one untimed)")
    p.add_argument("--kv-gib", type=float, help="KV cache per worker, GiB (two workers share the GPU)")
    p.add_argument(
        "--budget-s",
        type=float,
        help="seconds the whole run aims at: past a mode's share no new rate is probed",
    )
    p.add_argument(
        "--request-timeout", type=float, default=60.0, help="seconds without a byte before a request fails"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    args = p.parse_args(argv)
    for key, (gpu, tiny) in SIZES.items():
        if getattr(args, key) is None:
            setattr(args, key, tiny if args.tiny else gpu)
    args.dtype = "float32" if args.tiny else "bfloat16"
    return args


def refusal(args: argparse.Namespace) -> str | None:
    """Why this run cannot start (a quantization the engine lacks, no GPU), or None."""
    from tandem.worker.engine.loading import QUANTIZATIONS

    known = {q.value for q in Quantization} & set(QUANTIZATIONS)
    if args.quantization not in known:
        return f"--quantization {args.quantization}: the engine loads only {', '.join(sorted(known))}"
    if not args.tiny:
        import torch

        if not torch.cuda.is_available():
            return "bench.gpu_serving needs a CUDA GPU (or --tiny for the CPU dry run)"
    return None


def write_model(model_dir: Path, tiny: bool) -> Path:
    if tiny:
        from tandem.worker.devtools.tiny import TinySpec, create_tiny_model

        return create_tiny_model(model_dir, TinySpec(layers=2))
    import torch

    from bench._shapes import write_llama_8b_shaped

    written = write_llama_8b_shaped(model_dir, device="cuda")  # drawn on the GPU: seconds
    torch.cuda.empty_cache()  # the draws' memory goes back before the workers start on the same GPU
    return written


def tokenizer_vocab(model_dir: Path) -> int:
    """Token ids a prompt may name: the router checks them against the tokenizer's vocabulary (the 8B shape's
    config counts Llama-3's 128256; the tiny tokenizer covers its first ids)."""
    import tokenizers

    return tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json")).get_vocab_size(
        with_added_tokens=True
    )


def kv_block_bytes(model_dir: Path, dtype: str) -> int:
    """Keys and values of one block in every layer, from the model's config."""
    c = json.loads((model_dir / "config.json").read_text())
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    itemsize = 4 if dtype == "float32" else 2
    return 2 * c["num_hidden_layers"] * BLOCK_SIZE * c["num_key_value_heads"] * head_dim * itemsize


def stack_object(mode: str, model_dir: Path, args: argparse.Namespace, max_context: int) -> dict:
    blocks = int(args.kv_gib * 2**30 // kv_block_bytes(model_dir, args.dtype))
    obj = service_object(
        {COLOCATED: "gpu-colo", DISAGGREGATED: "gpu-disagg"}[mode],
        model_dir,
        mode=mode,
        num_kv_blocks=blocks,
        max_context=max_context,
        engine={"decodeStep": args.decode_step},
    )
    spec = obj["spec"]
    spec["model"]["dtype"] = args.dtype
    if args.quantization != "none":
        spec["model"]["quantization"] = args.quantization
    for pool in ("prefill", "decode"):
        if pool in spec:  # a colocated service has no prefill pool
            spec[pool]["resources"]["gpus"] = 0 if args.tiny else 1
    return obj


def batch_totals(port: int) -> tuple[float, float]:
    """(sum, count) of a worker's sequences-per-step histogram."""
    sums = metric_samples(port, names.DECODE_BATCH_SIZE + "_sum")
    counts = metric_samples(port, names.DECODE_BATCH_SIZE + "_count")
    return sum(sums.values()), sum(counts.values())


def kv_totals(port: int) -> dict[str, tuple[float, float, float, float]]:
    """Per transport: (bytes, span sum, tail sum, prompts) pushed by a prefill worker so far."""

    def by_transport(name: str) -> dict[str, float]:
        return {dict(k)["transport"]: v for k, v in metric_samples(port, name).items()}

    nbytes = by_transport(names.KV_TRANSFER_BYTES_TOTAL)
    span = by_transport(names.KV_TRANSFER_SECONDS + "_sum")
    tail = by_transport(names.KV_TRANSFER_TAIL_SECONDS + "_sum")
    count = by_transport(names.KV_TRANSFER_SECONDS + "_count")
    return {t: (nbytes[t], span.get(t, 0.0), tail.get(t, 0.0), count.get(t, 0.0)) for t in nbytes}


def startup_rows(mode: str, stack, ready_s: float) -> list[dict]:
    rows = []
    for p in stack.plans:
        if p.role == "router":
            continue
        phases = {
            dict(k)["phase"]: v
            for k, v in metric_samples(p.metrics_port, names.WORKER_STARTUP_SECONDS).items()
        }
        rows.append(
            {
                "mode": mode,
                "worker": p.name,
                "load_s": phases.get("load"),
                "warmup_s": phases.get("warmup"),
                "ready_s": ready_s,
            }
        )
    return rows


def probe_rates(
    mode: str,
    stack,
    url: str,
    trace: list[RequestSpec],
    shaping: LengthShaping,
    vocab: Vocabulary,
    args: argparse.Namespace,
    stop_at: float,
) -> list[dict]:
    """Each rate in turn until one is past saturation, or the monotonic clock passes `stop_at`; a row per
    rate."""
    (decoder,) = [p for p in stack.plans if p.role in ("decode", "colocated")]
    rows: list[dict] = []
    for i, rate in enumerate(float(r) for r in args.rates.split(",")):
        if rows and time.monotonic() > stop_at:
            print(
                f"  {mode}: rates from {rate:g} req/s skipped, past this mode's share of --budget-s",
                flush=True,
            )
            break
        n = min(len(trace), requests_for_rate(rate, args.probe_seconds, args.min_requests, args.max_requests))
        specs = at_rate(thinned(trace, n, shaping), rate)
        wait_idle(stack)
        before = batch_totals(decoder.metrics_port)
        outcome = run_completions(url, specs, vocab, args.seed * 1000 + i, args.request_timeout)
        after = batch_totals(decoder.metrics_port)
        steps = after[1] - before[1]
        latencies = [Latency(r.ok, r.ttft_s, r.tpot_s, r.input_len) for r in outcome.results]
        row = probe_row(mode, rate, latencies, (after[0] - before[0]) / steps if steps else None, SLO)
        rows.append(row)
        print(
            f"  {mode} {rate:g} req/s: {row['completed']}/{row['requests']} ok, TTFT p90 "
            f"{fmt(row['ttft_p90_ms'])} ms, TPOT p90 {fmt(row['tpot_p90_ms'], '{:.2f}')} ms, SLO met "
            f"{row['attainment']:.0%}",
            flush=True,
        )
        if saturated(row):
            break
    return rows


def kv_pushes(
    stack, url: str, lengths: list[int], repeats: int, vocab: int, rng: random.Random
) -> list[dict]:
    """Per prompt length: what the prefill worker's metrics say one prompt's KV push cost, per transport."""
    (prefill,) = [p for p in stack.plans if p.role == "prefill"]
    out = []
    for n in lengths:
        timed_completion(url, random_prompt(n, rng, vocab), 2)  # this length's shapes, once
        before = kv_totals(prefill.metrics_port)
        for _ in range(repeats):
            timed_completion(url, random_prompt(n, rng, vocab), 2)
        for transport, after in kv_totals(prefill.metrics_port).items():
            b = before.get(transport, (0.0, 0.0, 0.0, 0.0))
            prompts = after[3] - b[3]
            if prompts:
                out.append(
                    {
                        "prompt_tokens": n,
                        "transport": transport,
                        "kv_bytes": (after[0] - b[0]) / prompts,
                        "span_s": (after[1] - b[1]) / prompts,
                        "tail_s": (after[2] - b[2]) / prompts,
                    }
                )
    return out


def engine_steps(
    model_dir: Path, args: argparse.Namespace, batches: set[int], context: int
) -> dict[int, float]:
    """The engine alone, in this process: decode step milliseconds at each batch, prompts of `context`
    tokens."""
    import torch

    from bench.engine_timing import random_prompts, time_engine
    from tandem.worker.engine.loading import load_model
    from tandem.worker.engine.runner.compiled import warm_up
    from tandem.worker.engine.runner.engine import Engine, EngineConfig

    device = "cpu" if args.tiny else "cuda"
    if args.tiny:
        torch.set_num_threads(1)  # as each worker runs (service_object's threads)
    model = load_model(model_dir, args.dtype, device, args.quantization)
    new_tokens = max(8, min(64, args.max_output_len))
    longest = context + new_tokens + 1
    config = EngineConfig(
        block_size=BLOCK_SIZE,
        num_kv_blocks=max(batches) * -(-longest // BLOCK_SIZE) + 64,
        max_running_sequences=max(64, max(batches)),
        max_batch_tokens=max(2048, context),
        prefill_chunk_tokens=max(512, context),
        max_model_len=longest,
        decode_step=args.decode_step,
    )
    engine = Engine(model, config, eos_token_ids=())
    if engine.decode_step is not None:
        warm_up(engine)
    vocab = model.config.vocab_size
    steps = {}
    for b in sorted(batches):
        time_engine(engine, random_prompts(b, context, vocab, seed=b), 2)  # this batch's shapes, once
        timing = time_engine(engine, random_prompts(b, context, vocab, seed=1000 + b), new_tokens)
        steps[b] = 1000 * b / timing.decode_tok_s
        print(f"  engine alone, batch {b}: decode step {steps[b]:.2f} ms", flush=True)
    del engine, model
    if device == "cuda":
        torch.cuda.empty_cache()
    return steps


def copy_gbps(nbytes: int, tiny: bool, repeat: int = 5) -> float:
    """This device's copy bandwidth (GB/s, bytes copied once): the floor a KV push of `nbytes` cannot beat."""
    import torch

    device = "cpu" if tiny else "cuda"
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    times = []
    for _ in range(repeat + 1):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        dst.copy_(src)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return nbytes / statistics.median(times[1:]) / 1e9


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    why = refusal(args)
    if why:
        print(why, file=sys.stderr)
        return 2
    started = time.monotonic()
    trace = load_trace(args.trace)  # a missing trace fails before any model is written
    shaping = LengthShaping(1.0, args.max_input_len, args.max_output_len)
    kv_lengths = [int(n) for n in args.kv_lengths.split(",")]
    med_in, med_out = median_lengths(thinned(trace, min(len(trace), 1000), shaping))
    max_context = max(args.max_input_len, *kv_lengths) + args.max_output_len + 64
    rng = random.Random(args.seed)
    probes, startup, kv_raw = [], [], []
    with tempfile.TemporaryDirectory(prefix="tandem-gpu-serving-") as tmp:
        t = time.monotonic()
        model_dir = write_model(Path(tmp) / "model", args.tiny)
        print(
            f"model written in {time.monotonic() - t:.1f} s; trace median {med_in} in / {med_out} out",
            flush=True,
        )
        vocab = load_vocabulary(model_dir)
        vocab_ids = tokenizer_vocab(model_dir)
        for mode in (COLOCATED, DISAGGREGATED):
            t = time.monotonic()
            obj = stack_object(mode, model_dir, args, max_context)
            with running_stacks({mode: obj}, Path(tmp) / "logs") as running:
                stack, url = running[mode]
                ready_s = time.monotonic() - t
                print(f"{mode}: ready in {ready_s:.1f} s", flush=True)
                startup += startup_rows(mode, stack, ready_s)
                run_completions(
                    url, [RequestSpec(0.0, med_in, med_out)] * 2, vocab, 7, args.request_timeout
                )  # first calls' lazy init
                stop_at = started + args.budget_s * BUDGET_SHARE[mode]
                probes += probe_rates(mode, stack, url, trace, shaping, vocab, args, stop_at)
                if mode == DISAGGREGATED:
                    kv_raw = kv_pushes(stack, url, kv_lengths, args.kv_repeats, vocab_ids, rng)
        steps = engine_steps(model_dir, args, {1} | {engine_batch(r["mean_batch"]) for r in probes}, med_in)
    gbps = copy_gbps(max(COPY_MIN_BYTES, int(max((k["kv_bytes"] for k in kv_raw), default=0))), args.tiny)
    import torch

    result = {
        "device": "cpu (dry run, tiny model: not a measurement)"
        if args.tiny
        else torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "slo": {"ttft_ms": SLO.ttft_ms, "tpot_ms": SLO.tpot_ms, "percentile": SLO.percentile},
        "probes": [with_engine_step(r, steps) for r in probes],
        "goodput": {m: mode_goodput(probes, m, SLO) for m in (COLOCATED, DISAGGREGATED)},
        "engine_step_ms": {str(b): s for b, s in steps.items()},
        "copy_gbps": gbps,
        "kv": [
            kv_row(k["prompt_tokens"], k["transport"], k["kv_bytes"], k["span_s"], k["tail_s"], gbps)
            for k in kv_raw
        ],
        "startup": startup,
        "config": {
            **{k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "model_shape": "tiny (2 layers)" if args.tiny else "Llama-3.1-8B shape, random weights",
            "median_input_len": med_in,
            "median_output_len": med_out,
        },
        "wall_s": time.monotonic() - started,
    }
    print(report(result))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

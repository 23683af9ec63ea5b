"""Speculative decoding against plain decoding, side by side in one run: TPOT and decode tokens/s at several
batch sizes, with the acceptance rate beside each figure, for each proposer on a workload where drafts can
be right and one where they cannot.

n-gram prompt lookup:

- `repeats`: the tiny random model's greedy text repeats itself (as quoting, code edits and summaries do
  for real models); each prompt is a random start and the model's own greedy continuation of it, so the
  answer goes on repeating parts of the prompt and n-gram drafts are often right.
- `novel`: the same model with its matrices scaled up (weights ~ N(0, 0.08)), whose greedy text does not
  repeat, fed prompts made of one pattern repeated: the proposer always finds a match in the prompt and
  drafts it, and the model rarely follows, so the back-off has to keep speculation from costing time.

The self-speculative draft (the model's first `--draft-layers` layers, its final norm and LM head):

- `early-exit`: a target constructed for early exit, the tiny model with the attention and MLP outputs of
  the layers past the draft scaled by `--early-exit-scale` (0.02), so exiting early mostly agrees with it
  (a LayerSkip-trained model is trained for this; the random checkpoint is made to); random prompts. The
  random model's logits are flat (its top two are often close), so at 0.05 the argmax flips about half
  the time.
- `random`: the tiny random model as it is, whose first layers seldom predict its last: the back-off has
  to keep speculation from costing time.

Each point runs a plain and a speculative engine on the same prompts, one step of each in turn, each timed
on its own clock (the sum of its steps), so both see the same host noise; `--repeats` times with fresh
prompts (nothing served from the prefix cache), reporting the median with the spread. TPOT is
per sequence, (last token - first token) / (tokens - 1), averaged over the batch.

    python -m bench.speculative [--threads 1] [--batches 1,4,16] [--repeats 3] [--num-tokens 4]
        [--workloads repeats,novel,early-exit,random] [--layers 4] [--draft-layers 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from bench import engine_timing
from bench._smoke import add_smoke, smoke_sizes
from bench.engine_timing import random_prompts
from tandem.worker.api.params import SamplingParams
from tandem.worker.devtools.early_exit import upper_layers_scaled
from tandem.worker.devtools.tiny import TinySpec, create_tiny_model
from tandem.worker.engine.loading import load_model
from tandem.worker.engine.models.llama import Transformer
from tandem.worker.engine.runner.engine import Engine, EngineConfig
from tandem.worker.engine.speculative.proposer import SpeculativeConfig

BLOCK_SIZE = 16
# workload -> (its proposer, the batch its target applies to (None: every batch), the least TPOT ratio)
WORKLOADS: dict[str, tuple[str, int | None, float]] = {
    "repeats": ("ngram", 1, 1.8),
    "novel": ("ngram", None, 0.95),
    "early-exit": ("draft", 1, 1.8),  # the same bar as n-gram: >= 1.8x at batch 1 where drafts are right
    "random": ("draft", None, 0.95),
}


@dataclass(frozen=True)
class Timed:
    tpot_s: float  # mean over sequences
    tok_s: float  # decode tokens / decode seconds
    proposed: int
    accepted: int


@dataclass(frozen=True)
class Point:
    workload: str
    batch: int
    plain: list[Timed]
    spec: list[Timed]

    @property
    def ratios(self) -> list[float]:
        """Plain TPOT / speculative TPOT, run by run (> 1: speculation is faster)."""
        return [p.tpot_s / s.tpot_s for p, s in zip(self.plain, self.spec, strict=True)]

    @property
    def acceptance(self) -> float:
        proposed = sum(s.proposed for s in self.spec)
        return sum(s.accepted for s in self.spec) / proposed if proposed else 0.0

    @property
    def method(self) -> str:
        return WORKLOADS[self.workload][0]

    def target(self) -> float | None:
        _, batch, least = WORKLOADS[self.workload]
        return least if batch in (None, self.batch) else None


def scaled(model: Transformer, factor: float) -> Transformer:
    """The model with every weight matrix multiplied by `factor` (norm weights kept): a model that does not
    repeat."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(factor)
    return model


def prompts_for(
    workload: str, model: Transformer, batch: int, length: int, vocab: int, seed: int
) -> list[list[int]]:
    if workload == "repeats":  # a random start, then what the model itself says next (untimed)
        starts = random_prompts(batch, 16, vocab, seed)
        ((_, continued),) = run([engine_for(model, batch, length, length, None)], starts, length - 16)
        return [s + c for s, c in zip(starts, continued, strict=True)]
    if WORKLOADS[workload][0] == "draft":
        return random_prompts(batch, length, vocab, seed)
    patterns = random_prompts(batch, 8, vocab, seed)
    return [(p * (length // 8 + 1))[:length] for p in patterns]


@dataclass
class Timeline:
    """One engine's run on its own clock: the sum of its steps' durations, so engines stepped in turn
    are timed side by side under the same host noise."""

    engine: Engine
    clock: float = 0.0
    stamps: dict[str, list[float]] = field(default_factory=dict)
    tokens: dict[str, list[int]] = field(default_factory=dict)

    def start(self, prompts: list[list[int]], new_tokens: int) -> list[str]:
        params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
        ids = [self.engine.add_request(p, params) for p in prompts]
        for i in ids:
            self.stamps[i], self.tokens[i] = [], []
        return ids

    def step(self) -> None:
        t = engine_timing.now()
        outs = self.engine.step()
        self.clock += engine_timing.now() - t
        for o in outs:
            self.stamps[o.request_id].append(self.clock)
            self.tokens[o.request_id].append(o.token_id)


def run(
    engines: list[Engine], prompts: list[list[int]], new_tokens: int
) -> list[tuple[Timed, list[list[int]]]]:
    """Run the same prompts on each engine, one step of each in turn; (timing, tokens) per engine."""
    lines = [Timeline(e) for e in engines]
    ids = [line.start(prompts, new_tokens) for line in lines]
    seen = [
        (e.speculator.proposed_tokens, e.speculator.accepted_tokens) if e.speculator else (0, 0)
        for e in engines
    ]
    while any(line.engine.has_work() for line in lines):
        for line in lines:
            if line.engine.has_work():
                line.step()
    out = []
    for line, rids, (proposed, accepted) in zip(lines, ids, seen, strict=True):
        stamps = [line.stamps[i] for i in rids]
        if any(len(s) != new_tokens for s in stamps):
            raise RuntimeError("a sequence did not produce every token")
        tpot = statistics.mean((s[-1] - s[0]) / (len(s) - 1) for s in stamps)
        first, last = max(s[0] for s in stamps), max(s[-1] for s in stamps)
        decoded = sum(sum(t > first for t in s) for s in stamps)
        spec = line.engine.speculator
        now = (spec.proposed_tokens, spec.accepted_tokens) if spec else (0, 0)
        timed = Timed(tpot, decoded / (last - first), now[0] - proposed, now[1] - accepted)
        out.append((timed, [line.tokens[i] for i in rids]))
    return out


def engine_for(
    model: Transformer, batch: int, prompt_len: int, new_tokens: int, spec: SpeculativeConfig | None
) -> Engine:
    blocks = batch * (-(-(prompt_len + new_tokens + 16) // BLOCK_SIZE)) + 16
    config = EngineConfig(
        block_size=BLOCK_SIZE,
        num_kv_blocks=blocks,
        max_batch_tokens=max(2048, batch * prompt_len),
        prefill_chunk_tokens=max(512, prompt_len),
        speculative=spec,
    )
    return Engine(model, config)


def bench_point(workload: str, model: Transformer, batch: int, args: argparse.Namespace, vocab: int) -> Point:
    method = WORKLOADS[workload][0]
    layers = args.draft_layers if method == "draft" else None
    spec_config = SpeculativeConfig(method, num_tokens=args.num_tokens, draft_layers=layers)
    plain_runs, spec_runs = [], []
    for rep in range(args.repeats + 1):  # the first round warms up and is dropped
        prompts = prompts_for(workload, model, batch, args.prompt_len, vocab, seed=10_000 * batch + rep)
        engines = [engine_for(model, batch, args.prompt_len, args.new_tokens, c) for c in (None, spec_config)]
        (plain, want), (spec, got) = run(engines, prompts, args.new_tokens)
        if got != want:
            raise RuntimeError(f"{workload} batch {batch}: speculative greedy output differs from plain")
        if rep:
            plain_runs.append(plain)
            spec_runs.append(spec)
    return Point(workload, batch, plain_runs, spec_runs)


def spread(values: list[float], fmt: str = "{:.2f}") -> str:
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def print_table(points: list[Point], caption: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="speculative vs plain decoding: median, then (min-max) over runs", caption=caption)
    for col in (
        "method",
        "workload",
        "batch",
        "plain TPOT ms",
        "spec TPOT ms",
        "TPOT ratio",
        "plain tok/s",
        "spec tok/s",
        "tok/s ratio",
        "acceptance",
        "target",
        "met",
    ):
        table.add_column(col, justify="left" if col in ("method", "workload", "met") else "right")
    for p in points:
        target = p.target()
        met = "-" if target is None else ("yes" if statistics.median(p.ratios) >= target else "NO")
        tok = [s.tok_s / q.tok_s for q, s in zip(p.plain, p.spec, strict=True)]
        table.add_row(
            p.method,
            p.workload,
            str(p.batch),
            spread([r.tpot_s * 1e3 for r in p.plain]),
            spread([r.tpot_s * 1e3 for r in p.spec]),
            spread(p.ratios) + "x",
            spread([r.tok_s for r in p.plain], "{:.0f}"),
            spread([r.tok_s for r in p.spec], "{:.0f}"),
            spread(tok) + "x",
            f"{p.acceptance:.0%}",
            "-" if target is None else f">= {target:.2f}x",
            met,
        )
    Console(width=200).print(table)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--batches", default="1,4,16")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help=f"of {', '.join(WORKLOADS)}")
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--num-tokens", type=int, default=4, help="draft tokens per step")
    p.add_argument("--layers", type=int, default=4, help="the tiny model's layers")
    p.add_argument("--draft-layers", type=int, default=1, help="the draft method's layers (of --layers)")
    p.add_argument(
        "--early-exit-scale",
        type=float,
        default=0.02,
        help="early-exit workload: the factor on the outputs of the layers past the draft",
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--clock",
        choices=["cpu", "wall"],
        default="cpu",
        help="cpu: this process's CPU time (steadier on a shared host; needs --threads 1)",
    )
    p.add_argument("--out", default=None, help="write the figures as JSON here")
    add_smoke(p)
    return smoke_sizes(p.parse_args(argv), batches="1,2", prompt_len=24, new_tokens=6, layers=2, repeats=1)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.clock == "cpu":
        engine_timing.use_cpu_clock()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = create_tiny_model(Path(tmp) / "tiny", TinySpec(layers=args.layers, seed=0))
        models = {
            "repeats": load_model(model_dir),
            "novel": scaled(load_model(model_dir), 4.0),
            "early-exit": upper_layers_scaled(
                load_model(model_dir), args.draft_layers, args.early_exit_scale
            ),
        }
        models["random"] = models["repeats"]
    vocab = models["repeats"].config.vocab_size - 64  # clear of the special tokens at the top
    points = []
    for workload in args.workloads.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            points.append(bench_point(workload, models[workload], batch, args, vocab))
            print(
                f"  {workload} batch {batch}: TPOT ratio {spread(points[-1].ratios)}x, "
                f"acceptance {points[-1].acceptance:.0%}",
                file=sys.stderr,
                flush=True,
            )
    caption = (
        f"tiny Llama ({args.layers} layers, hidden 256), fp32, CPU, {args.threads} thread(s), {args.clock} "
        f"clock; prompt {args.prompt_len}, {args.new_tokens} new tokens, k={args.num_tokens}, "
        f"draft {args.draft_layers} layer(s), early-exit scale {args.early_exit_scale}, {args.repeats} runs"
    )
    print_table(points, caption)
    if args.out:
        Path(args.out).write_text(json.dumps([{"method": p.method, **asdict(p)} for p in points], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

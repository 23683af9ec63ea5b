"""Goodput: the highest request rate meeting TTFT and TPOT SLOs, 1 prefill + 1 decode worker against 2 colocated.

    python -m bench.goodput --trace ../shared/traces/azure_llm_2023_conv.csv [--out goodput.json]

Both stacks run at once on loopback, every worker with the same torch thread count (default 1), so each
side has two single-threaded workers on the same cores. The workload replays the Azure conversation
trace thinned to each probe's request count (rows evenly spaced over the whole trace), lengths divided by
--length-scale and capped (a CPU model cannot serve 1k-token prompts at chat rates), inter-arrival
pattern stretched to the probed rate. SLOs come from the idle latencies: each stack serves a few
requests of the median shaped lengths one at a time; TTFT SLO = --ttft-factor x the slower idle TTFT,
TPOT SLO = --tpot-factor x the slower idle TPOT.
Then `search_max_rate` finds, per stack, the highest rate at which >= 90% of the requests sent meet both;
the two searches take turns, one probe at a time, so background load drifts over both alike.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bench._stacks import SERVED_NAME, ModelShape, make_model, running_stacks, service_object, wait_idle
from bench._trace_shape import (
    LengthShaping,
    Slo,
    at_rate,
    median_lengths,
    rate_ratio,
    requests_for_rate,
    slo_from_idle,
    thinned,
)
from tandem.operator.local import LocalStack
from tandem.worker.loadgen.prompts import Vocabulary, load_vocabulary
from tandem.worker.loadgen.report import percentile, slo_attainment, summarize
from tandem.worker.loadgen.runner import run_workload
from tandem.worker.loadgen.search import search_max_rate
from tandem.worker.loadgen.trace import AZURE_ATTRIBUTION, attribution_for, load_trace
from tandem.worker.loadgen.workload import RequestSpec

TARGET = 1.5
ATTAINMENT = 0.9
COLOCATED, DISAGGREGATED = "colocated", "disaggregated"


class TurnTaker:
    """Searches on separate threads take turns: one probe at a time, alternating while both still search."""

    def __init__(self, players: list[str]):
        self._cond = threading.Condition()
        self._order = list(players)
        self._active = set(players)
        self._turn = self._order[0]

    def play(self, player: str, fn: Callable[[], float]) -> float:
        with self._cond:
            self._cond.wait_for(lambda: self._turn == player)
        try:
            return fn()
        finally:
            with self._cond:
                self._pass_on(player)

    def leave(self, player: str) -> None:
        with self._cond:
            self._active.discard(player)
            if self._turn == player:
                self._pass_on(player)

    def _pass_on(self, player: str) -> None:
        i = self._order.index(player)
        for nxt in self._order[i + 1 :] + self._order[: i + 1]:
            if nxt in self._active:
                self._turn = nxt
                break
        self._cond.notify_all()


@dataclass
class Prober:
    """Runs one probe against one stack: the thinned trace at a rate, and its joint SLO attainment."""

    label: str
    stack: LocalStack
    url: str
    args: argparse.Namespace
    trace: list[RequestSpec]
    shaping: LengthShaping
    vocab: Vocabulary
    slo: Slo
    seeds: Iterator[int]
    records: list[dict] = field(default_factory=list)

    def attainment_at(self, rate: float) -> float:
        a = self.args
        n = requests_for_rate(rate, a.probe_seconds, a.min_requests, a.max_requests)
        specs = at_rate(thinned(self.trace, n, self.shaping), rate)
        wait_idle(self.stack)
        outcome = run(self.url, specs, self.vocab, next(self.seeds), a.request_timeout)
        attained = slo_attainment(outcome.results, self.slo.ttft_s, self.slo.tpot_s) or 0.0
        summary = summarize(outcome.results, outcome.duration_s, self.slo.ttft_s, self.slo.tpot_s)
        self.records.append({"rate": rate, "requests": n, "attainment": attained, "summary": summary})
        print(
            f"  {self.label:<13} rate {rate:6.3f} req/s  n={n:<3} attainment {100 * attained:5.1f}%  "
            f"TTFT p50/p90 {_ms(summary['ttft_ms']['p50'])}/{_ms(summary['ttft_ms']['p90'])} ms  "
            f"TPOT p50/p90 {_ms(summary['tpot_ms']['p50'])}/{_ms(summary['tpot_ms']['p90'])} ms  "
            f"failed {summary['failed']}",
            flush=True,
        )
        return attained


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def run(url: str, specs: list[RequestSpec], vocab: Vocabulary, seed: int, timeout_s: float):
    return asyncio.run(
        run_workload(
            url,
            "completions",
            specs,
            model=SERVED_NAME,
            seed=seed,
            timeout_s=timeout_s,
            progress=False,
            vocab=vocab,
        )
    )


def idle_latency(url: str, input_len: int, output_len: int, repeat: int, vocab: Vocabulary, seed: int) -> Slo:
    """Median TTFT and TPOT of `repeat` requests sent one after another to an otherwise idle stack."""
    specs = [RequestSpec(0.0, input_len, output_len)] * repeat
    outcome = asyncio.run(
        run_workload(
            url,
            "completions",
            specs,
            model=SERVED_NAME,
            concurrency=1,
            seed=seed,
            progress=False,
            vocab=vocab,
        )
    )
    ok = [r for r in outcome.results if r.ok]
    if len(ok) != repeat:
        raise RuntimeError(f"idle requests failed at {url}: {[r.error for r in outcome.results if not r.ok]}")
    return Slo(percentile([r.ttft_s for r in ok], 50), percentile([r.tpot_s for r in ok], 50))


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.goodput", description=__doc__.splitlines()[0])
    p.add_argument("--trace", type=Path, default=Path("../shared/traces/azure_llm_2023_conv.csv"))
    p.add_argument("--length-scale", type=float, default=4.0, help="divide trace lengths by this")
    p.add_argument("--max-input-len", type=int, default=512)
    p.add_argument("--max-output-len", type=int, default=64)
    p.add_argument("--ttft-factor", type=float, default=5.0, help="TTFT SLO = this x idle TTFT")
    p.add_argument("--tpot-factor", type=float, default=5.0, help="TPOT SLO = this x idle TPOT")
    p.add_argument("--idle-repeat", type=int, default=3)
    p.add_argument("--probe-seconds", type=float, default=20.0, help="seconds of arrivals per probe")
    p.add_argument("--min-requests", type=int, default=16)
    p.add_argument("--max-requests", type=int, default=40)
    p.add_argument("--start-rate", type=float, help="first probed rate (default: 0.5 / idle TTFT)")
    p.add_argument("--growth", type=float, default=1.5)
    p.add_argument("--rel-tol", type=float, default=0.1)
    p.add_argument("--max-probes", type=int, default=6, help="probes per stack")
    p.add_argument(
        "--request-timeout", type=float, default=20.0, help="seconds without a byte before a request fails"
    )
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--threads", type=int, default=1, help="torch threads of every worker")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    shaping = LengthShaping(args.length_scale, args.max_input_len, args.max_output_len)
    trace = load_trace(args.trace)
    med_in, med_out = median_lengths(thinned(trace, min(len(trace), 1000), shaping))
    shape = ModelShape(args.hidden, args.layers)
    seeds = itertools.count(args.seed * 1000)
    with tempfile.TemporaryDirectory(prefix="tandem-goodput-") as tmp:
        model_dir = make_model(Path(tmp) / "model", shape)
        vocab = load_vocabulary(model_dir)
        common = dict(
            threads=args.threads,
            num_kv_blocks=2048,
            max_context=args.max_input_len + args.max_output_len + 64,
        )
        objects = {
            COLOCATED: service_object("goodput-colo", model_dir, mode="colocated", decode=2, **common),
            DISAGGREGATED: service_object(
                "goodput-disagg", model_dir, mode="disaggregated", prefill=1, decode=1, **common
            ),
        }
        with running_stacks(objects, Path(tmp) / "logs") as running:
            for _, url in running.values():  # warm up every worker: first calls pay for lazy init
                run(url, [RequestSpec(0.0, med_in, med_out)] * 2, vocab, next(seeds), args.request_timeout)
            idle = {
                label: idle_latency(url, med_in, med_out, args.idle_repeat, vocab, next(seeds))
                for label, (_, url) in running.items()
            }
            slo = slo_from_idle(list(idle.values()), args.ttft_factor, args.tpot_factor)
            print(_slo_lines(idle, slo, med_in, med_out, args), flush=True)
            start = args.start_rate or 0.5 / max(s.ttft_s for s in idle.values())
            probers = {
                label: Prober(label, stack, url, args, trace, shaping, vocab, slo, seeds)
                for label, (stack, url) in running.items()
            }
            found = search_both(probers, start, args)
    result = {
        "max_rate": {label: r.rate for label, r in found.items()},
        "ratio": rate_ratio(found[DISAGGREGATED].rate, found[COLOCATED].rate),
        "target": TARGET,
        "attainment_target": ATTAINMENT,
        "slo": {"ttft_ms": 1000 * slo.ttft_s, "tpot_ms": 1000 * slo.tpot_s},
        "idle": {
            label: {"ttft_ms": 1000 * s.ttft_s, "tpot_ms": 1000 * s.tpot_s} for label, s in idle.items()
        },
        "probes": {label: p.records for label, p in probers.items()},
        "config": {
            **{k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "model": vars(shape.tiny_spec()),
        },
        "workload": {
            "median_input_len": med_in,
            "median_output_len": med_out,
            "trace_rows": len(trace),
        },
        "trace_attribution": attribution_for(args.trace) or AZURE_ATTRIBUTION,
        "wall_s": time.monotonic() - started,
    }
    print(report(result))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


def search_both(probers: dict[str, Prober], start: float, args: argparse.Namespace) -> dict:
    """Run the two rate searches on threads, taking turns probe by probe."""
    turns = TurnTaker(list(probers))
    found: dict = {}
    errors: list[BaseException] = []

    def search(label: str, prober: Prober) -> None:
        try:
            found[label] = search_max_rate(
                lambda rate: turns.play(label, lambda: prober.attainment_at(rate)),
                start,
                target=ATTAINMENT,
                growth=args.growth,
                rel_tol=args.rel_tol,
                max_probes=args.max_probes,
            )
        except BaseException as e:  # reported on the main thread
            errors.append(e)
        finally:
            turns.leave(label)

    threads = [
        threading.Thread(target=search, args=item, name=f"search-{item[0]}") for item in probers.items()
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return found


def _slo_lines(idle: dict[str, Slo], slo: Slo, med_in: int, med_out: int, args: argparse.Namespace) -> str:
    lines = [
        f"Idle latencies at the median shaped request ({med_in} prompt tokens, {med_out} output tokens):"
    ]
    lines += [
        f"  {label:<13} TTFT {1000 * s.ttft_s:7.1f} ms  TPOT {1000 * s.tpot_s:6.1f} ms"
        for label, s in idle.items()
    ]
    lines.append(
        f"SLOs: TTFT {1000 * slo.ttft_s:.0f} ms ({args.ttft_factor:g} x slower idle TTFT), "
        f"TPOT {1000 * slo.tpot_s:.0f} ms ({args.tpot_factor:g} x slower idle TPOT); attainment target {ATTAINMENT:.0%}"
    )
    return "\n".join(lines)


def report(result: dict) -> str:
    cfg, wl = result["config"], result["workload"]
    rates, ratio = result["max_rate"], result["ratio"]
    verdict = "-" if ratio is None else ("met" if ratio >= result["target"] else "MISSED")
    return "\n".join(
        [
            f"Goodput: Azure conversation trace ({wl['trace_rows']} rows) thinned to each probe's request count, "
            f"lengths / {cfg['length_scale']:g}, capped at {cfg['max_input_len']} in / {cfg['max_output_len']} out "
            f"(median {wl['median_input_len']} / {wl['median_output_len']}); model hidden {cfg['hidden']}, {cfg['layers']} layers, "
            f"float32, {cfg['threads']} torch thread per worker",
            f"  SLO TTFT {result['slo']['ttft_ms']:.0f} ms, TPOT {result['slo']['tpot_ms']:.0f} ms, >= {result['attainment_target']:.0%} of requests",
            f"  max rate colocated (2 workers)            {rates[COLOCATED]:.3f} req/s",
            f"  max rate disaggregated (1 prefill + 1 decode) {rates[DISAGGREGATED]:.3f} req/s",
            f"  ratio {'-' if ratio is None else f'{ratio:.2f}'} (target >= {result['target']:.1f}: {verdict})",
            f"  wall time {result['wall_s']:.0f} s",
            f"Trace: {result['trace_attribution']}",
        ]
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Helpers the serving benchmarks share: a random-weight model, local stacks from a spec, timed requests."""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tandem.loadgen.client import stream_chunks
from tandem.loadgen.prompts import Vocabulary
from tandem.loadgen.runner import run_workload
from tandem.loadgen.workload import RequestSpec
from tandem.operator.local.plan import ProcessPlan
from tandem.operator.local.scale import dial
from tandem.operator.local.stack import LocalStack, free_port_block, serving
from tandem.spec import parse_object
from tandem.v1 import colocated_pb2_grpc, common_pb2, decode_pb2_grpc, prefill_pb2_grpc

STUBS = {
    "prefill": prefill_pb2_grpc.PrefillServiceStub,
    "decode": decode_pb2_grpc.DecodeServiceStub,
    "colocated": colocated_pb2_grpc.ColocatedServiceStub,
}

SERVED_NAME = "bench"
FIRST_TOKEN_ID = 10  # below this sit the tokenizer's special tokens; prompts never use them


@dataclass(frozen=True)
class ModelShape:
    """A Llama shape for `create_tiny_model`; head_dim stays 64 and GQA 2:1."""

    hidden: int = 512
    layers: int = 8

    def tiny_spec(self):
        from tandem.worker.devtools.tiny import TinySpec  # only the model maker needs torch

        heads = max(1, self.hidden // 64)
        return TinySpec(
            layers=self.layers,
            hidden=self.hidden,
            heads=heads,
            kv_heads=max(1, heads // 2),
            intermediate=self.hidden * 11 // 4 // 64 * 64,
            max_positions=8192,
        )


def make_model(model_dir: Path, shape: ModelShape) -> Path:
    from tandem.worker.devtools.tiny import create_tiny_model

    return create_tiny_model(model_dir, shape.tiny_spec())


def vocab_size(model_dir: Path) -> int:
    return int(json.loads((model_dir / "config.json").read_text())["vocab_size"])


def service_object(
    name: str,
    model_dir: Path,
    *,
    mode: str,
    prefill: int = 1,
    decode: int = 1,
    transport: str = "auto",
    threads: int = 1,
    num_kv_blocks: int = 1024,
    max_context: int = 4096,
    router: dict | None = None,
    engine: dict | None = None,
) -> dict:
    """An InferenceService object for the local backend: float32 on CPU, `threads` torch threads per
    worker. In colocated mode `decode` replicas is the number of colocated workers (`prefill` and
    `transport` are left out); `router` is the spec's router section (e.g. its disaggregation); `engine`
    adds to the engine section."""
    obj = {
        "apiVersion": "serving.tandem.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {
            "model": {
                "source": {"path": str(model_dir)},
                "servedName": SERVED_NAME,
                "dtype": "float32",
                "maxContextLength": max_context,
            },
            "mode": mode,
            "decode": {"replicas": decode, "resources": {"gpus": 0}},
            "engine": {"blockSize": 16, "numKvBlocks": num_kv_blocks, "threads": threads, **(engine or {})},
        },
    }
    if (
        mode != "colocated"
    ):  # colocated has neither a prefill pool nor a KV transfer: their settings are refused
        obj["spec"] |= {
            "prefill": {"replicas": prefill, "resources": {"gpus": 0}},
            "kvTransfer": {"transport": transport},
        }
    if router:
        obj["spec"]["router"] = router
    return obj


@contextmanager
def running_stacks(objects: dict[str, dict], state_dir: Path) -> Iterator[dict[str, tuple[LocalStack, str]]]:
    """Start every stack (label -> InferenceService object) on its own ports; stop them all on exit."""
    with ExitStack() as stacks:
        running = {}
        for label, obj in objects.items():
            base = free_port_block(24)
            svc = parse_object(obj)
            running[label] = stacks.enter_context(
                serving(svc, state_dir / label, port=base, worker_port=base + 2)
            )
        yield running


def random_prompt(n: int, rng: random.Random, vocab: int) -> list[int]:
    """Random token ids: distinct per call, so no request is served from another's prefix cache."""
    return [rng.randrange(FIRST_TOKEN_ID, vocab) for _ in range(n)]


@dataclass(frozen=True)
class Timed:
    ttft_s: float
    e2e_s: float
    tokens: int

    @property
    def tpot_s(self) -> float | None:
        return (self.e2e_s - self.ttft_s) / (self.tokens - 1) if self.tokens > 1 else None


def timed_completion(url: str, prompt_ids: list[int], max_tokens: int, timeout_s: float = 120.0) -> Timed:
    """One streamed /v1/completions request with a token-id prompt; TTFT is measured at the client."""
    body = {
        "model": SERVED_NAME,
        "prompt": prompt_ids,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    first = None
    tokens = 0  # from the usage chunk: a chunk carries the text of every token since the last whole character
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=timeout_s, trust_env=False) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"router answered {resp.status_code}: {resp.read().decode()[:300]}")
        for chunk in stream_chunks(resp.iter_lines()):
            if first is None and any(c.get("text") for c in chunk.get("choices") or []):
                first = time.perf_counter()
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    end = time.perf_counter()
    if first is None:
        raise RuntimeError("no tokens came back")
    return Timed(first - start, end - start, tokens)


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def scrape_metric(port: int, name: str) -> float:
    """The sum of every sample of `name` at a worker's Prometheus endpoint (0 when absent)."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5, trust_env=False).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def metric_samples(port: int, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Every sample of `name` at a worker's Prometheus endpoint, by its labels (sorted (name, value)
    pairs)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5, trust_env=False).text
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


def worker_load(p: ProcessPlan) -> common_pb2.LoadReport:
    """A worker's load report, asked with the stack's own identity (mutual TLS unless the spec turned it
    off)."""
    channel = dial(p)
    try:
        return STUBS[p.role](channel).Load(common_pb2.LoadRequest(), timeout=5)
    finally:
        channel.close()


def wait_idle(stack: LocalStack, timeout_s: float = 60.0) -> bool:
    """Until no worker of `stack` runs, waits or holds KV blocks; False if that never happened."""
    deadline = time.monotonic() + timeout_s
    workers = [p for p in stack.plans if p.role != "router"]
    while time.monotonic() < deadline:
        reports = [worker_load(p) for p in workers]
        if all(
            r.running_sequences == 0 and r.waiting_sequences == 0 and r.free_kv_blocks == r.total_kv_blocks
            for r in reports
        ):
            return True
        time.sleep(0.25)
    return False


def round_order(labels: list[str], rep: int) -> list[str]:
    """The stacks in rotated order for repetition `rep`, so no stack always goes first."""
    k = rep % len(labels)
    return labels[k:] + labels[:k]


def timed_round(
    running: dict[str, tuple[LocalStack, str]],
    labels: list[str],
    prompt_len: int,
    max_tokens: int,
    rng: random.Random,
    vocab: int,
) -> dict[str, Timed]:
    """One request per stack, in `labels` order, each on a fresh random prompt once its stack is idle."""
    out = {}
    for label in labels:
        stack, url = running[label]
        if not wait_idle(stack):
            raise RuntimeError(f"{label} did not return to idle")
        out[label] = timed_completion(url, random_prompt(prompt_len, rng, vocab), max_tokens)
    return out


def warm_up(
    running: dict[str, tuple[LocalStack, str]],
    rounds: int,
    prompt_len: int,
    max_tokens: int,
    rng: random.Random,
    vocab: int,
) -> None:
    """`rounds` untimed requests per stack, one stack after the other."""
    for _ in range(rounds):
        for _stack, url in running.values():
            timed_completion(url, random_prompt(prompt_len, rng, vocab), max_tokens)


def run_completions(
    url: str, specs: list[RequestSpec], vocab: Vocabulary, seed: int, timeout_s: float, concurrency=None
):
    """Replay `specs` against a stack's router on /v1/completions; the load generator's outcome."""
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
            concurrency=concurrency,
        )
    )

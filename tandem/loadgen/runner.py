"""Drives a workload against an endpoint: sends each request at its arrival time, caps concurrency,
shows progress, and collects the per-request results."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

import httpx
from tqdm import tqdm

from tandem.loadgen.client import ENDPOINT_PATHS, build_payload, discover_model, send_request
from tandem.loadgen.prompts import DEFAULT_VOCABULARY, Vocabulary, prompt_for_tokens
from tandem.loadgen.result import RequestResult
from tandem.loadgen.workload import RequestSpec


@dataclass
class RunOutcome:
    model: str
    results: list[RequestResult]
    duration_s: float  # from the first send to the last completion


def request_rng(seed: int, index: int) -> random.Random:
    """Each request's own RNG, so its prompt does not depend on the order requests are built in."""
    return random.Random(seed * 1_000_003 + index)


async def run_workload(
    base_url: str,
    endpoint: str,
    specs: list[RequestSpec],
    *,
    model: str | None = None,
    concurrency: int | None = None,
    seed: int = 0,
    timeout_s: float = 600.0,
    duration_s: float | None = None,
    progress: bool | None = None,
    vocab: Vocabulary = DEFAULT_VOCABULARY,
) -> RunOutcome:
    """Send `specs` to `base_url` on schedule. `progress=None` shows the bar only on a terminal."""
    base_url = base_url.rstrip("/")
    url = base_url + ENDPOINT_PATHS[endpoint]
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, 30.0))
    async with httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False) as client:
        if model is None:
            model = await discover_model(client, base_url)
        slots = asyncio.Semaphore(concurrency) if concurrency else None
        bar = tqdm(total=len(specs), unit="req", disable=None if progress is None else not progress)
        results: list[RequestResult] = []

        async def one(index: int, spec: RequestSpec, run_start: float) -> None:
            prompt = prompt_for_tokens(spec.input_len, request_rng(seed, index), vocab)
            payload = build_payload(endpoint, model, prompt, spec.output_len)
            result = RequestResult(input_len=spec.input_len, output_len=spec.output_len)
            if slots is None:
                await send_request(client, url, payload, result, run_start)
            else:
                async with slots:
                    await send_request(client, url, payload, result, run_start)
            results.append(result)
            bar.update(1)

        run_start = time.perf_counter()
        tasks: list[asyncio.Task[None]] = []
        try:
            for index, spec in enumerate(specs):
                if duration_s is not None and spec.arrival_s >= duration_s:
                    break
                delay = run_start + spec.arrival_s - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(one(index, spec, run_start)))
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            bar.close()
        elapsed = max((r.end_s for r in results), default=time.perf_counter() - run_start)
    results.sort(key=lambda r: r.start_s)
    return RunOutcome(model=model, results=results, duration_s=elapsed)

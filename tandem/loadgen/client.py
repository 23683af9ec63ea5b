"""One streamed request to an OpenAI-compatible endpoint, timed: TTFT, inter-token gaps, e2e, token count."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from typing import Any

import httpx

from tandem.loadgen.result import RequestResult

ENDPOINT_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


def build_payload(endpoint: str, model: str, prompt: str, output_len: int) -> dict[str, Any]:
    """The JSON body: streamed, exactly `output_len` tokens asked for (ignore_eos/min_tokens are vLLM
    extras that other servers ignore), usage requested in the final chunk."""
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": output_len,
        "min_tokens": output_len,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    elif endpoint == "completions":
        body["prompt"] = prompt
    else:
        raise ValueError(f"unknown endpoint {endpoint!r}")
    return body


def sse_data(line: str) -> str | None:
    """The payload of an SSE `data:` line, or None for comments, blank lines and other fields."""
    if not line.startswith("data:"):
        return None
    return line[5:].strip()


def stream_chunks(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    """The JSON chunks of a streamed answer's `data:` lines, up to `[DONE]`; an error event raises."""
    for line in lines:
        data = sse_data(line)
        if not data:
            continue
        if data == "[DONE]":
            return
        chunk = json.loads(data)
        if "error" in chunk:
            raise RuntimeError(chunk["error"]["message"])
        yield chunk


def chunk_text(chunk: dict[str, Any]) -> str:
    """The generated text in a streamed chunk: `text` for completions, `delta.content` for chat."""
    parts: list[str] = []
    for choice in chunk.get("choices") or []:
        text = choice.get("text")
        if text is None:
            text = (choice.get("delta") or {}).get("content")
        if text:
            parts.append(text)
    return "".join(parts)


async def send_request(
    client: httpx.AsyncClient,
    url: str,
    payload: dict[str, Any],
    result: RequestResult,
    run_start: float,
) -> RequestResult:
    """POST `payload` to `url`, read the SSE stream and fill `result`. Never raises for request errors."""
    start = time.perf_counter()
    result.start_s = start - run_start
    try:
        async with client.stream("POST", url, json=payload) as response:
            result.status = str(response.status_code)
            if response.status_code != 200:
                body = (await response.aread()).decode(errors="replace")
                result.error = body[:500]
                return result
            async for line in response.aiter_lines():
                data = sse_data(line)
                if data is None or not data:
                    continue
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    result.status = "stream_error"
                    result.error = json.dumps(chunk["error"])[:500]
                    return result
                now = time.perf_counter()
                if chunk_text(chunk):
                    if result.ttft_s is None:
                        result.ttft_s = now - start
                    result.token_times_s.append(now - run_start)
                usage = chunk.get("usage")
                if usage and usage.get("completion_tokens") is not None:
                    result.output_tokens = int(usage["completion_tokens"])
                    result.usage_reported = True
        result.e2e_s = time.perf_counter() - start
        if not result.usage_reported:
            result.output_tokens = len(result.token_times_s)
        if result.ttft_s is None:
            result.status = "no_tokens"
            result.error = "stream ended without content"
            return result
        result.ok = True
    except (httpx.HTTPError, json.JSONDecodeError, OSError) as exc:
        result.status = type(exc).__name__
        result.error = str(exc)[:500] or repr(exc)
    finally:
        result.end_s = time.perf_counter() - run_start
    return result


async def discover_model(client: httpx.AsyncClient, base_url: str) -> str:
    """The first model the server lists at /v1/models."""
    response = await client.get(base_url.rstrip("/") + "/v1/models")
    response.raise_for_status()
    models = response.json().get("data") or []
    if not models:
        raise RuntimeError(f"{base_url}/v1/models lists no models; pass --model")
    return str(models[0]["id"])

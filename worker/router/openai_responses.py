"""The OpenAI response shapes the router writes: completion and chat objects and chunks, their choices,
logprobs and usage."""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from tandem.worker.router.streaming import TokenLogprob


def new_id(kind: Literal["cmpl", "chatcmpl"]) -> str:
    return f"{kind}-{uuid.uuid4().hex}"


def now_s() -> int:
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion_logprobs(entries: list[TokenLogprob], text_offset: int) -> dict[str, Any]:
    """The legacy completions logprobs object: per token the likeliest alternatives and the chosen one."""
    offsets, at = [], text_offset
    for e in entries:
        offsets.append(at)
        at += len(e.token)
    return {
        "tokens": [e.token for e in entries],
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [
            None if e.logprob is None else {**{t.token: t.logprob for t in e.top}, e.token: e.logprob}
            for e in entries
        ],
        "text_offset": offsets,
    }


def chat_logprobs(entries: list[TokenLogprob]) -> dict[str, Any]:
    """The chat logprobs object: each token with its top_logprobs alternatives."""

    def item(e: TokenLogprob) -> dict[str, Any]:
        return {"token": e.token, "logprob": e.logprob, "bytes": list(e.token.encode("utf-8"))}

    return {"content": [{**item(e), "top_logprobs": [item(t) for t in e.top]} for e in entries]}


def _response_object(
    object_name: str,
    request_id: str,
    created: int,
    model: str,
    choices: list[dict],
    usage_: dict | None,
    chunk: bool,
    usage_field: bool,
    **extra: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": request_id,
        "object": object_name,
        "created": created,
        "model": model,
        **extra,
    }
    body["choices"] = choices
    if not chunk or usage_field:  # with include_usage every chunk has "usage" (null until the last)
        body["usage"] = usage_
    return body


def completion_object(
    request_id: str,
    created: int,
    model: str,
    choices: list[dict],
    usage_: dict | None,
    *,
    chunk: bool,
    usage_field: bool = False,
) -> dict[str, Any]:
    return _response_object(
        "text_completion", request_id, created, model, choices, usage_, chunk, usage_field
    )


def chat_object(
    request_id: str,
    created: int,
    model: str,
    choices: list[dict],
    usage_: dict | None,
    *,
    chunk: bool,
    usage_field: bool = False,
) -> dict[str, Any]:
    name = "chat.completion.chunk" if chunk else "chat.completion"
    return _response_object(
        name, request_id, created, model, choices, usage_, chunk, usage_field, system_fingerprint=None
    )


def completion_choice(
    text: str, finish_reason: str | None, logprobs: dict | None, index: int = 0, **extra: Any
) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason, **extra}


def chat_message(content: str | None, tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message


def chat_choice(
    content: str | None,
    finish_reason: str | None,
    logprobs: dict | None,
    index: int = 0,
    tool_calls: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    return {
        "index": index,
        "message": chat_message(content, tool_calls),
        "logprobs": logprobs,
        "finish_reason": finish_reason,
    }


def chat_delta_choice(
    delta: dict[str, Any], finish_reason: str | None, logprobs: dict | None, index: int = 0
) -> dict:
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}

"""The OpenAI wire format the router speaks: request models, response and chunk shapes, the error shape."""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tandem.worker.api.params import SamplingParams
from tandem.worker.router.streaming import TokenLogprob

MAX_LOGPROBS = 20
ERROR_TYPES = {400: "invalid_request_error", 404: "invalid_request_error", 429: "rate_limit_error"}
FIELD_HINTS = {"prompt": "must be a string, a list of token ids, or a one-element list of either"}


class ApiError(Exception):
    """A request answered with an OpenAI error body and this HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.retry_after_s = retry_after_s


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    kind = ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def describe_validation_error(error: ValidationError) -> tuple[str, str | None]:
    """A one-line message and the offending top-level field for a pydantic validation failure."""
    parts: dict[str, str] = {}
    for e in error.errors(include_url=False):
        if e["type"] == "json_invalid":
            return f"request body is not valid JSON: {e['msg']}", None
        loc = [str(x) for x in e["loc"]]
        field = loc[0] if loc else "body"
        if field in parts:
            continue
        where = ".".join(x for x in loc if not x.startswith(("list[", "str", "int")))
        hint = FIELD_HINTS.get(field) if e["type"] != "missing" else None
        parts[field] = f"{where or 'body'}: {hint or e['msg']}"
    return "; ".join(parts.values()) or "invalid request", next(iter(parts), None)


class StreamOptions(BaseModel):
    include_usage: bool = False


class SamplingRequest(BaseModel):
    """Fields shared by completions and chat completions. Unknown fields are ignored, as OpenAI does."""

    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # -1 or 0: off
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    min_tokens: int = 0  # accepted, not enforced
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None

    def check_supported(self) -> None:
        if self.n != 1:
            raise ApiError(400, f"only n=1 is supported, got n={self.n}", param="n")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) not in (None, 0, 0.0):
                raise ApiError(400, f"{name} is not supported (use 0)", param=name)
        if self.min_tokens < 0:
            raise ApiError(400, f"min_tokens must be >= 0, got {self.min_tokens}", param="min_tokens")

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def wants_logprobs(self) -> bool:
        raise NotImplementedError

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        """Engine parameters; raises InvalidRequest for values the engine refuses."""
        top_k = self.top_k if self.top_k is not None and self.top_k > 0 else 0
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=top_k,
            seed=self.seed,
            stop=self.stop_strings(),
            stop_token_ids=list(self.stop_token_ids or []),
            ignore_eos=self.ignore_eos,
            logprobs=self.wants_logprobs(),
        )


class CompletionRequest(SamplingRequest):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = None
    echo: bool = False
    best_of: int | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.echo:
            raise ApiError(400, "echo is not supported", param="echo")
        if self.best_of not in (None, 1):
            raise ApiError(400, "only best_of=1 is supported", param="best_of")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise ApiError(400, f"logprobs must be in [0, {MAX_LOGPROBS}]", param="logprobs")
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str | list):
            if len(self.prompt) != 1:
                raise ApiError(400, "only one prompt per request is supported", param="prompt")

    def wants_logprobs(self) -> bool:
        return self.logprobs is not None

    def single_prompt(self) -> str | list[int]:
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str | list):
            return self.prompt[0]  # type: ignore[return-value]
        return self.prompt  # type: ignore[return-value]


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None

    def for_template(self) -> dict[str, Any]:
        """The message as a chat template sees it: role and plain-text content."""
        if self.content is None or isinstance(self.content, str):
            return {"role": self.role, "content": self.content or ""}
        if any(p.type != "text" or p.text is None for p in self.content):
            raise ApiError(400, "only text content parts are supported", param="messages")
        return {"role": self.role, "content": "".join(p.text or "" for p in self.content)}


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = None
    max_completion_tokens: int | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.top_logprobs is not None and not 0 <= self.top_logprobs <= MAX_LOGPROBS:
            raise ApiError(400, f"top_logprobs must be in [0, {MAX_LOGPROBS}]", param="top_logprobs")

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def wants_logprobs(self) -> bool:
        return self.logprobs


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
    """The legacy completions logprobs object; only the chosen token is reported."""
    offsets, at = [], text_offset
    for e in entries:
        offsets.append(at)
        at += len(e.token)
    return {
        "tokens": [e.token for e in entries],
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [{e.token: e.logprob} for e in entries],
        "text_offset": offsets,
    }


def chat_logprobs(entries: list[TokenLogprob]) -> dict[str, Any]:
    """The chat logprobs object; top_logprobs holds only the chosen token."""
    content = []
    for e in entries:
        item = {"token": e.token, "logprob": e.logprob, "bytes": list(e.token.encode("utf-8"))}
        content.append({**item, "top_logprobs": [dict(item)]})
    return {"content": content}


def _response_object(
    object_name: str, request_id: str, created: int, model: str, choices: list[dict], usage_: dict | None,
    chunk: bool, usage_field: bool, **extra: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {"id": request_id, "object": object_name, "created": created, "model": model, **extra}
    body["choices"] = choices
    if not chunk or usage_field:  # with include_usage every chunk has "usage" (null until the last)
        body["usage"] = usage_
    return body


def completion_object(
    request_id: str, created: int, model: str, choices: list[dict], usage_: dict | None, *,
    chunk: bool, usage_field: bool = False,
) -> dict[str, Any]:
    return _response_object("text_completion", request_id, created, model, choices, usage_, chunk, usage_field)


def chat_object(
    request_id: str, created: int, model: str, choices: list[dict], usage_: dict | None, *,
    chunk: bool, usage_field: bool = False,
) -> dict[str, Any]:
    name = "chat.completion.chunk" if chunk else "chat.completion"
    return _response_object(
        name, request_id, created, model, choices, usage_, chunk, usage_field, system_fingerprint=None
    )


def completion_choice(text: str, finish_reason: str | None, logprobs: dict | None) -> dict[str, Any]:
    return {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}


def chat_choice(content: str, finish_reason: str | None, logprobs: dict | None) -> dict[str, Any]:
    return {
        "index": 0,
        "message": {"role": "assistant", "content": content},
        "logprobs": logprobs,
        "finish_reason": finish_reason,
    }


def chat_delta_choice(delta: dict[str, Any], finish_reason: str | None, logprobs: dict | None) -> dict:
    return {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}

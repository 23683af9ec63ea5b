"""The OpenAI wire format the router speaks: request models, response and chunk shapes, the error shape."""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tandem.worker.api.params import MAX_CACHE_SALT, UINT32_MAX, UINT64_MAX, SamplingParams
from tandem.worker.router.streaming import TokenLogprob

MAX_LOGPROBS = 20  # the most alternatives OpenAI's API lets a client ask for
SUPPORTED_LOGPROBS = 1  # we report the sampled token only, so asking for more alternatives is refused
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 1024
MAX_STOP_TOKEN_IDS = 256
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # seeds OpenAI clients (and vLLM) accept
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
    """A one-line message and the offending top-level field for a pydantic validation failure.

    A field typed as a union (`stop: str | list[str]`) fails once per branch; the branch whose type
    matched says what is wrong (a length, a range), so its error wins over "should be a valid string".
    """
    by_field: dict[str, list[Any]] = {}
    for e in error.errors(include_url=False):
        if e["type"] == "json_invalid":
            return f"request body is not valid JSON: {e['msg']}", None
        loc = [str(x) for x in e["loc"]]
        by_field.setdefault(loc[0] if loc else "body", []).append(e)
    parts = []
    for field, errors in by_field.items():
        e = next((x for x in errors if not x["type"].endswith("_type")), errors[0])
        where = ".".join(str(x) for x in e["loc"] if not _is_type_tag(x))
        hint = FIELD_HINTS.get(field) if e["type"] != "missing" else None
        parts.append(f"{where or 'body'}: {hint or e['msg']}")
    return "; ".join(parts) or "invalid request", next(iter(by_field), None)


def _is_type_tag(loc_part: Any) -> bool:
    """Union branch names pydantic puts in an error location (`str`, `list[int]`, `constrained-str`)."""
    return isinstance(loc_part, str) and (
        "[" in loc_part or "-" in loc_part or loc_part in ("str", "int", "float", "bool")
    )


class StreamOptions(BaseModel):
    include_usage: bool = False


StopString = Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]
TokenId = Annotated[int, Field(ge=0, le=UINT32_MAX)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]


class SamplingRequest(BaseModel):
    """Fields shared by completions and chat completions, each range-checked here so that nothing a client
    sends fails later on the wire. Unknown fields are ignored, as OpenAI does."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    model: str
    max_tokens: int | None = Field(None, ge=1, le=UINT32_MAX)
    temperature: float | None = Field(None, ge=0.0, le=100.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1, le=UINT32_MAX)  # -1 or 0: off
    seed: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX)
    stop: StopString | Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS)] | None = None
    stop_token_ids: list[TokenId] | None = Field(None, max_length=MAX_STOP_TOKEN_IDS)
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0, le=UINT32_MAX)  # accepted, not enforced
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    # vLLM's extension: prefix-cache blocks are shared only between requests with the same salt
    cache_salt: str | None = Field(None, min_length=1, max_length=MAX_CACHE_SALT)

    def check_supported(self) -> None:
        if self.n != 1:
            raise ApiError(400, f"only n=1 is supported, got n={self.n}", param="n")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) not in (None, 0, 0.0):
                raise ApiError(400, f"{name} is not supported (use 0)", param=name)
        if self.stream_options is not None and not self.stream:
            raise ApiError(400, "stream_options is only allowed when stream is true", param="stream_options")

    def check_token_ids(self, vocab_size: int) -> None:
        """Token ids the request names must exist in the model's vocabulary."""
        bad = [t for t in self.stop_token_ids or [] if t >= vocab_size]
        if bad:
            raise ApiError(
                400, f"stop_token_ids outside the vocabulary of {vocab_size}: {bad[:5]}", param="stop_token_ids"
            )

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
            seed=None if self.seed is None else self.seed & UINT64_MAX,  # negative seeds as two's complement
            stop=self.stop_strings(),
            stop_token_ids=list(self.stop_token_ids or []),
            ignore_eos=self.ignore_eos,
            logprobs=self.wants_logprobs(),
            cache_salt=self.cache_salt,
        )


def refuse_top_n(param: str, n: int | None) -> None:
    if n is not None and n > SUPPORTED_LOGPROBS:
        raise ApiError(
            400,
            f"{param}={n} is not supported: only the sampled token's logprob is reported "
            f"(use {param} <= {SUPPORTED_LOGPROBS})",
            param=param,
        )


class CompletionRequest(SamplingRequest):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    best_of: int | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.echo:
            raise ApiError(400, "echo is not supported", param="echo")
        if self.best_of not in (None, 1):
            raise ApiError(400, "only best_of=1 is supported", param="best_of")
        refuse_top_n("logprobs", self.logprobs)
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
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    max_completion_tokens: int | None = Field(None, ge=1, le=UINT32_MAX)

    def check_supported(self) -> None:
        super().check_supported()
        if self.top_logprobs is not None and not self.logprobs:
            raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        refuse_top_n("top_logprobs", self.top_logprobs)

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

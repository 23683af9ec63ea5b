"""What the router checks before it spends work on a request: the model it names, a prompt too long by its
bytes alone for the served context (no tokeniser run), then the queue limit; only an admitted request is
templated and tokenised, and then its prompt and output budget must fit the context."""

from __future__ import annotations

from collections.abc import Iterable

from tandem.worker.api.params import UINT32_MAX
from tandem.worker.hf.tokenizer import Tokenizer
from tandem.worker.router import openai_schema as oa

QUEUE_FULL_RETRY_AFTER_S = 1
BYTES_SLACK = 2  # normalisers (NFKC and the like) may shrink text before it is split: stay on the safe side


class Admission:
    """Counts requests in flight and refuses new ones past the limit."""

    def __init__(self, limit: int) -> None:
        self.limit, self.in_flight = limit, 0

    def acquire(self) -> None:
        if self.in_flight >= self.limit:
            raise oa.ApiError(
                429,
                f"too many requests in flight ({self.in_flight} of {self.limit}); retry later",
                code="queue_full",
                retry_after_s=QUEUE_FULL_RETRY_AFTER_S,
            )
        self.in_flight += 1

    def release(self) -> None:
        self.in_flight -= 1


def max_token_bytes(vocab: Iterable[str]) -> int:
    """The most UTF-8 bytes one token's text can stand for: its vocabulary string's length in bytes bounds it
    (byte-level and metaspace symbols take more bytes than the text they stand for, never fewer)."""
    return max((len(token.encode("utf-8")) for token in vocab), default=1) or 1


def prompt_text_bytes(req: oa.SamplingRequest) -> int:
    """UTF-8 bytes of the text the user sent as the prompt (token ids: none), a lower bound on what the
    template renders."""
    if isinstance(req, oa.CompletionRequest):
        prompt = req.single_prompt()
        return len(prompt.encode("utf-8")) if isinstance(prompt, str) else 0
    if isinstance(req, oa.ChatCompletionRequest):
        total = 0
        for m in req.messages:
            if isinstance(m.content, str):
                total += len(m.content.encode("utf-8"))
            elif m.content is not None:
                total += sum(len((p.text or "").encode("utf-8")) for p in m.content)
        return total
    return 0


def min_prompt_tokens(req: oa.SamplingRequest, token_bytes: int) -> int:
    """The fewest tokens the prompt can take (pure): its token ids, or its text's bytes over the most bytes
    one token can stand for (with slack)."""
    if isinstance(req, oa.CompletionRequest) and not isinstance(prompt := req.single_prompt(), str):
        return len(prompt)
    return prompt_text_bytes(req) // (token_bytes * BYTES_SLACK)


def check_prompt_fits(req: oa.SamplingRequest, token_bytes: int, max_model_len: int | None) -> None:
    """400 for a prompt that cannot fit the served context whatever the tokeniser makes of it."""
    if max_model_len is None:
        return
    least = min(min_prompt_tokens(req, token_bytes), req.truncate_prompt_tokens or UINT32_MAX)
    if least >= max_model_len:
        raise oa.ApiError(
            400,
            f"prompt is too long: at least {least} tokens, the model's context is {max_model_len}",
            param="messages" if isinstance(req, oa.ChatCompletionRequest) else "prompt",
        )


def check_model(req: oa.SamplingRequest, served_name: str) -> None:
    if req.model != served_name:
        raise oa.ApiError(
            404,
            f"model {req.model!r} does not exist; this router serves {served_name!r}",
            param="model",
            code="model_not_found",
        )


def resolve_max_tokens(
    requested: int | None, default: int, prompt_len: int, max_model_len: int | None
) -> int:
    """The output budget: the request's, else the default, bounded by the context left after the prompt."""
    if max_model_len is not None and prompt_len >= max_model_len:
        raise oa.ApiError(
            400,
            f"prompt is too long: {prompt_len} tokens, the model's context is {max_model_len}",
            param="prompt",
        )
    room = None if max_model_len is None else max_model_len - prompt_len
    if requested is None:
        return default if room is None else min(default, room)
    if room is not None and requested > room:
        raise oa.ApiError(
            400,
            f"prompt ({prompt_len} tokens) plus max_tokens ({requested}) exceeds the model's context of "
            f"{max_model_len} tokens",
            param="max_tokens",
        )
    return requested


def completion_prompt_ids(req: oa.CompletionRequest, tokenizer: Tokenizer) -> list[int]:
    prompt = req.single_prompt()
    if isinstance(prompt, str):
        ids = tokenizer.encode(prompt, add_special_tokens=req.add_special_tokens is not False)
    else:
        bad = [i for i in prompt if not 0 <= i < tokenizer.vocab_size]
        if bad:
            raise oa.ApiError(400, f"prompt has token ids outside the vocabulary: {bad[:5]}", param="prompt")
        ids = list(prompt)
    if not ids:
        raise oa.ApiError(400, "prompt is empty", param="prompt")
    return req.truncated(ids)


def chat_prompt_ids(req: oa.ChatCompletionRequest, tokenizer: Tokenizer) -> list[int]:
    messages = [m.for_template() for m in req.messages]
    ids = tokenizer.encode_chat(
        messages,
        tools=req.tool_dicts(),
        add_special_tokens=bool(req.add_special_tokens),
        **req.template_options(),
    )
    return req.truncated(ids)

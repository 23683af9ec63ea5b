"""What the router checks before it spends work on a request: a prompt too long by its bytes alone for the
served context (no tokeniser run), then the queue limit; only an admitted request is templated and tokenised."""

from __future__ import annotations

from collections.abc import Iterable

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
    """The fewest tokens the prompt can take (pure): its token ids, or its text's bytes over the most bytes one
    token can stand for (with slack)."""
    if isinstance(req, oa.CompletionRequest) and not isinstance(prompt := req.single_prompt(), str):
        return len(prompt)
    return prompt_text_bytes(req) // (token_bytes * BYTES_SLACK)


def check_prompt_fits(req: oa.SamplingRequest, token_bytes: int, max_model_len: int | None) -> None:
    """400 for a prompt that cannot fit the served context whatever the tokeniser makes of it."""
    if max_model_len is None:
        return
    least = min_prompt_tokens(req, token_bytes)
    if least >= max_model_len:
        raise oa.ApiError(
            400,
            f"prompt is too long: at least {least} tokens, the model's context is {max_model_len}",
            param="messages" if isinstance(req, oa.ChatCompletionRequest) else "prompt",
        )

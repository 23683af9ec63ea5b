"""How far a quantized model (int8 weights, 8-bit KV cache) strays from its full-precision twin.

Two figures, used by the tests and by bench/quantization.py: the logits error over a prompt and its
continuation, and the greedy agreement over the continuation. Both run teacher-forced on the reference's
own greedy tokens: the prompt as one prefill, then one decode step per token, so every step after the
first reads the (possibly 8-bit) paged cache; each model sees the same context at every position.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tandem.worker.engine.layers.attention import AttentionBatch
from tandem.worker.engine.layers.kv_cache import KvCache
from tandem.worker.engine.models.llama import Transformer

BLOCK_SIZE = 16


@dataclass(frozen=True)
class Agreement:
    """A quantized model against the reference on one continuation."""

    max_abs_error: float  # largest |logit difference| over every position and token
    rel_error: float  # that over the largest |reference logit|
    top1_agreement: float  # share of positions whose argmax is the reference's greedy token
    greedy_prefix: int  # positions before the first disagreement
    positions: int
    median_margin: float  # the reference's median gap between its top two logits: how near the ties are


def _decode(
    model: Transformer, prompt: list[int], n: int, kv_cache_dtype: str, forced: list[int] | None
) -> tuple[torch.Tensor, list[int]]:
    """Prefill `prompt`, then `n - 1` decode steps, each fed the forced token or else the greedy one;
    returns the [n, V] float32 logits that predicted each fed token and those tokens."""
    param = next(model.parameters())
    blocks = -(-(len(prompt) + n) // BLOCK_SIZE)
    kv = KvCache(model.config, blocks, BLOCK_SIZE, param.dtype, param.device, kv_cache_dtype)
    table = list(range(blocks))
    rows, tokens = [], []
    chunk, start = list(prompt), 0
    with torch.inference_mode():
        for i in range(n):
            pos = torch.arange(start, start + len(chunk))
            slots = torch.tensor(table)[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE
            batch = AttentionBatch(
                [len(chunk)], [start + len(chunk)], [table], slots.to(param.device), BLOCK_SIZE
            )
            hidden = model(torch.tensor(chunk, device=param.device), pos.to(param.device), kv.k, kv.v, batch)
            logits = model.logits(hidden[-1:]).float().cpu()
            rows.append(logits)
            tokens.append(forced[i] if forced is not None else int(logits.argmax()))
            start += len(chunk)
            chunk = [tokens[-1]]
    return torch.cat(rows), tokens


def forced_logits(
    model: Transformer, prompt: list[int], continuation: list[int], kv_cache_dtype: str = "auto"
) -> torch.Tensor:
    """[len(continuation), V] float32: the logits that predict each continuation token."""
    return _decode(model, prompt, len(continuation), kv_cache_dtype, continuation)[0]


def greedy_continuation(
    model: Transformer, prompt: list[int], n: int, kv_cache_dtype: str = "auto"
) -> list[int]:
    """The model's own greedy `n` tokens after `prompt`."""
    return _decode(model, prompt, n, kv_cache_dtype, None)[1]


def compare(reference: torch.Tensor, got: torch.Tensor, continuation: list[int]) -> Agreement:
    """Errors of `got` against `reference` logits [N, V], and agreement with the greedy `continuation`."""
    err = float((got - reference).abs().max())
    picked = got.argmax(dim=-1).tolist()
    same = [a == b for a, b in zip(picked, continuation, strict=True)]
    prefix = same.index(False) if False in same else len(same)
    top2 = reference.topk(2, dim=-1).values
    margin = float((top2[:, 0] - top2[:, 1]).median())
    return Agreement(
        err, err / float(reference.abs().max()), sum(same) / len(same), prefix, len(same), margin
    )


def agreement(
    reference: Transformer,
    model: Transformer,
    prompt: list[int],
    n: int = 64,
    kv_cache_dtype: str = "auto",
    continuation: list[int] | None = None,
) -> Agreement:
    """`model` (with a `kv_cache_dtype` cache) against `reference` (full-precision cache) over the
    reference's greedy `n` tokens after `prompt`."""
    tokens = continuation if continuation is not None else greedy_continuation(reference, prompt, n)
    ref = forced_logits(reference, prompt, tokens)
    got = forced_logits(model, prompt, tokens, kv_cache_dtype)
    return compare(ref, got, tokens)

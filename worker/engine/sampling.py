"""The batched sampler: greedy, temperature, top-k, top-p, seeds."""

from __future__ import annotations

import torch

from tandem.worker.api.params import SamplingParams


def _filter_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask (to -inf) the tokens outside the top-k and the top-p nucleus of one row [V]."""
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop_sorted = cum - sorted_logits.softmax(-1) >= top_p  # keep the token that crosses top_p
        logits = logits.masked_fill(torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted), float("-inf"))
    return logits


def sample(
    logits: torch.Tensor,  # [N, V] float32
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
) -> tuple[list[int], list[float]]:
    """One token per row, and its log-probability under the unfiltered distribution."""
    logprobs_all = torch.log_softmax(logits, dim=-1)
    greedy_ids = logits.argmax(dim=-1).tolist()
    tokens: list[int] = []
    for i, p in enumerate(params):
        if p.greedy:
            tokens.append(greedy_ids[i])
            continue
        row = _filter_top_k_top_p(logits[i] / p.temperature, p.top_k, p.top_p)
        probs = row.softmax(-1)
        tokens.append(int(torch.multinomial(probs, 1, generator=generators[i]).item()))
    chosen = logprobs_all[torch.arange(len(tokens)), torch.tensor(tokens, dtype=torch.long)].tolist()
    return tokens, chosen

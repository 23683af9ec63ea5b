"""The batched sampler, on the logits' device: penalties, greedy, temperature, min-p, top-k, top-p, seeds.

The whole batch is filtered with one sort; a token is drawn as argmax(probs / E) with E ~ Exp(1)
(the exponential race, equal in law to a categorical draw), so unseeded rows share one noise draw and a
seeded row draws its own from its generator, reproducibly. Penalties are applied to all penalised rows at
once from [rows, V] token-count tensors. What the host builds (row indices, each row's parameters, the seeded
rows' noise) crosses in one non-blocking copy per kind, which never waits for the device; only the token ids,
and the log-probabilities of rows that asked for them, come back to the host, each in one read.
"""

from __future__ import annotations

import itertools

import torch

from tandem.worker.api.params import SamplingParams


def filter_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask to -inf the tokens outside each row's top-k and then outside the top-p nucleus of what top-k kept
    ([M, V]; k=0 and p=1 keep all)."""
    vocab = logits.shape[-1]
    ordered, order = torch.sort(logits, dim=-1, descending=True)
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), vocab)
    kth = ordered.gather(1, (k - 1)[:, None])  # [M, 1] the k-th largest logit (its ties stay in)
    outside_k = ordered < kth
    probs = ordered.masked_fill(outside_k, float("-inf")).softmax(-1)  # top-p over what top-k kept, as vLLM
    drop_sorted = outside_k | ((probs.cumsum(-1) - probs) >= top_p[:, None])  # keep the token crossing top_p
    drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def token_counts(
    token_lists: list[list[int]], vocab: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """[N, V] how often each token id occurs in each row's list: one scatter of the flat ids on `device`."""
    counts = torch.zeros(len(token_lists), vocab, dtype=dtype, device=device)
    flat = list(itertools.chain.from_iterable(token_lists))
    if flat:
        rows = torch.repeat_interleave(
            torch.arange(len(token_lists)), torch.tensor([len(t) for t in token_lists])
        )
        ids = torch.stack((rows, torch.tensor(flat))).to(device, non_blocking=True)  # [2, total]: one copy
        counts.index_put_((ids[0], ids[1]), torch.ones((), dtype=dtype, device=device), accumulate=True)
    return counts


def apply_penalties(
    logits: torch.Tensor, params: list[SamplingParams], prompts: list[list[int]], outputs: list[list[int]]
) -> torch.Tensor:
    """Each row's logits after its penalties, as vLLM applies them ([N, V]; rows without one unchanged):
    repetition_penalty over the tokens of the prompt and the output so far, presence and frequency
    penalties over the output's. The penalized rows are penalised together, from [rows, V] count tensors."""
    rows = [i for i, p in enumerate(params) if p.penalized]
    if not rows:
        return logits
    device, vocab = logits.device, logits.shape[-1]
    chosen = [params[i] for i in rows]
    # [R, 3] repetition, frequency and presence penalties: one copy to the device
    factors = torch.tensor(
        [[p.repetition_penalty, p.frequency_penalty, p.presence_penalty] for p in chosen], dtype=logits.dtype
    ).to(device, non_blocking=True)
    index = torch.tensor(rows).to(device, non_blocking=True)
    picked = logits.index_select(0, index)  # [R, V]
    counts = token_counts([outputs[i] for i in rows], vocab, logits.dtype, device)  # [R, V]
    if any(p.repetition_penalty != 1.0 for p in chosen):  # a factor of 1 leaves its row's logits as they are
        seen = token_counts([prompts[i] for i in rows], vocab, logits.dtype, device).add_(counts) > 0
        rep = factors[:, :1]
        picked = torch.where(seen, torch.where(picked > 0, picked / rep, picked * rep), picked)
    if any(p.presence_penalty or p.frequency_penalty for p in chosen):
        picked = picked - (factors[:, 1:2] * counts + factors[:, 2:3] * (counts > 0).to(logits.dtype))
    return logits.index_copy(0, index, picked)


def filter_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Mask to -inf the tokens less likely than min_p x each row's likeliest ([M, V]; 0 keeps all)."""
    probs = logits.softmax(-1)
    floor = probs.amax(-1, keepdim=True) * min_p[:, None]
    return logits.masked_fill(probs < floor, float("-inf"))


def sampling_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Each row's distribution after its temperature, min-p, top-k and top-p ([M, V]; rows with
    temperature > 0), in vLLM's order."""
    # [M, 4] temperature, min-p, top-k, top-p: one copy to the device
    knobs = torch.tensor([[p.temperature, p.min_p, p.top_k, p.top_p] for p in params], dtype=torch.float64)
    knobs = knobs.to(logits.device, non_blocking=True)
    scaled = logits / knobs[:, 0, None].to(logits.dtype)
    if any(p.min_p > 0.0 for p in params):
        scaled = filter_min_p(scaled, knobs[:, 1].to(logits.dtype))
    if any(p.top_k > 0 or p.top_p < 1.0 for p in params):
        scaled = filter_top_k_top_p(scaled, knobs[:, 2].long(), knobs[:, 3].to(logits.dtype))
    return scaled.softmax(-1)


def _exponential_noise(
    shape: tuple[int, int], generators: list[torch.Generator | None], device: torch.device
) -> torch.Tensor:
    """Exp(1) noise [M, V]: one draw for the unseeded rows; each seeded row from its own generator, which
    lives on the host, so those rows are drawn there and copied over together."""
    noise = torch.empty(shape, device=device).exponential_()
    seeded = [i for i, g in enumerate(generators) if g is not None]
    if seeded:
        drawn = torch.stack([torch.empty(shape[1]).exponential_(generator=generators[i]) for i in seeded])
        index = torch.tensor(seeded).to(device, non_blocking=True)
        noise.index_copy_(0, index, drawn.to(device, non_blocking=True))
    return noise


def sample(
    logits: torch.Tensor,  # [N, V] float32, on any device
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
) -> tuple[list[int], list[float]]:
    """One token per row, and its log-probability under the unfiltered distribution (0.0 when not asked)."""
    device = logits.device
    tokens = logits.argmax(dim=-1)
    rows = [i for i, p in enumerate(params) if not p.greedy]
    if rows:
        index = torch.tensor(rows).to(device, non_blocking=True)
        chosen = [params[i] for i in rows]
        probs = sampling_probs(logits.index_select(0, index), chosen)
        noise = _exponential_noise(tuple(probs.shape), [generators[i] for i in rows], device)  # type: ignore[arg-type]
        tokens = tokens.index_copy(0, index, (probs / noise).argmax(dim=-1))
    want = [i for i, p in enumerate(params) if p.logprobs]
    logprobs = [0.0] * len(params)
    if want:
        index = torch.tensor(want).to(device, non_blocking=True)
        picked = torch.log_softmax(logits.index_select(0, index), dim=-1).gather(1, tokens[index][:, None])
        for i, lp in zip(want, picked[:, 0].tolist(), strict=True):
            logprobs[i] = lp
    return tokens.tolist(), logprobs

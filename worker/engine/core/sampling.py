"""The batched sampler, on the logits' device: penalties, greedy, temperature, min-p, top-k, top-p, seeds.

The whole batch is filtered with one sort; a token is drawn as argmax(probs / E) with E ~ Exp(1)
(the exponential race, equal in law to a categorical draw), so unseeded rows share one noise draw and a
seeded row draws its own from its generator, reproducibly. Only the token ids, and the log-probabilities
of rows that asked for them, come back to the host; log_softmax runs only for those rows.
"""

from __future__ import annotations

import torch

from tandem.worker.api.params import SamplingParams


def filter_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask to -inf the tokens outside each row's top-k and top-p nucleus ([M, V]; k=0 and p=1 keep all)."""
    vocab = logits.shape[-1]
    ordered, order = torch.sort(logits, dim=-1, descending=True)
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), vocab)
    kth = ordered.gather(1, (k - 1)[:, None])  # [M, 1] the k-th largest logit
    probs = ordered.softmax(-1)
    drop_sorted = (probs.cumsum(-1) - probs) >= top_p[:, None]  # keep the token that crosses top_p
    drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
    return logits.masked_fill(drop | (logits < kth), float("-inf"))


def apply_penalties(
    logits: torch.Tensor, params: list[SamplingParams], prompts: list[list[int]], outputs: list[list[int]]
) -> torch.Tensor:
    """Each row's logits after its penalties, as vLLM applies them ([N, V]; rows without one unchanged):
    repetition_penalty over the tokens of the prompt and the output so far, presence and frequency
    penalties over the output's."""
    rows = [i for i, p in enumerate(params) if p.penalized]
    if not rows:
        return logits
    logits, device, vocab = logits.clone(), logits.device, logits.shape[-1]
    for i in rows:
        p, row = params[i], logits[i]
        if p.repetition_penalty != 1.0:
            seen = torch.tensor(sorted(set(prompts[i]) | set(outputs[i])), dtype=torch.long, device=device)
            picked = row[seen]
            row[seen] = torch.where(picked > 0, picked / p.repetition_penalty, picked * p.repetition_penalty)
        if outputs[i] and (p.presence_penalty or p.frequency_penalty):
            counts = torch.bincount(torch.tensor(outputs[i], device=device), minlength=vocab)[:vocab].to(row.dtype)
            row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(row.dtype)
    return logits


def filter_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Mask to -inf the tokens less likely than min_p x each row's likeliest ([M, V]; 0 keeps all)."""
    probs = logits.softmax(-1)
    floor = probs.amax(-1, keepdim=True) * min_p[:, None]
    return logits.masked_fill(probs < floor, float("-inf"))


def sampling_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Each row's distribution after its temperature, min-p, top-k and top-p ([M, V]; rows with
    temperature > 0), in vLLM's order."""
    device = logits.device
    temps = torch.tensor([p.temperature for p in params], device=device)
    scaled = logits / temps[:, None]
    if any(p.min_p > 0.0 for p in params):
        scaled = filter_min_p(scaled, torch.tensor([p.min_p for p in params], device=device))
    if any(p.top_k > 0 or p.top_p < 1.0 for p in params):
        top_k = torch.tensor([p.top_k for p in params], device=device)
        top_p = torch.tensor([p.top_p for p in params], device=device)
        scaled = filter_top_k_top_p(scaled, top_k, top_p)
    return scaled.softmax(-1)


def _exponential_noise(
    shape: tuple[int, int], generators: list[torch.Generator | None], device: torch.device
) -> torch.Tensor:
    """Exp(1) noise [M, V]: one draw for the unseeded rows, each seeded row from its own generator."""
    noise = torch.empty(shape, device=device).exponential_()
    for i, g in enumerate(generators):
        if g is not None:  # the generator lives on the host: draw there, then copy the row over
            noise[i] = torch.empty(shape[1]).exponential_(generator=g).to(device)
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
        index = torch.tensor(rows, device=device)
        chosen = [params[i] for i in rows]
        probs = sampling_probs(logits.index_select(0, index), chosen)
        noise = _exponential_noise(tuple(probs.shape), [generators[i] for i in rows], device)  # type: ignore[arg-type]
        tokens = tokens.index_copy(0, index, (probs / noise).argmax(dim=-1))
    want = [i for i, p in enumerate(params) if p.logprobs]
    logprobs = [0.0] * len(params)
    if want:
        index = torch.tensor(want, device=device)
        picked = torch.log_softmax(logits.index_select(0, index), dim=-1).gather(1, tokens[index][:, None])
        for i, lp in zip(want, picked[:, 0].tolist(), strict=True):
            logprobs[i] = lp
    return tokens.tolist(), logprobs

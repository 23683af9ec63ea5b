"""Verifying drafts under temperature sampling without changing what the model would have sampled.

Speculative sampling (Leviathan et al., Chen et al.) with a deterministic proposer: a draft token `d` is
accepted with probability p(d), the target's probability after temperature, top-k and top-p; the first
rejected one is replaced by a draw from p with `d` taken out, renormalised; when every draft is accepted
one more token is drawn from the next row. Each emitted token is then distributed exactly as p.
"""

from __future__ import annotations

import torch


def verify_sampled(
    probs: torch.Tensor, draft: list[int], generator: torch.Generator | None = None
) -> list[int]:
    """The tokens to emit (the accepted drafts, then one drawn token) from `probs` [len(draft) + 1, V],
    row i the target's distribution after the sequence and the first i drafts; on the host."""
    probs = probs.float().cpu()
    u = torch.rand(len(draft), generator=generator)
    out: list[int] = []
    for i, d in enumerate(draft):
        if u[i] < probs[i, d]:
            out.append(d)
            continue
        residual = probs[i].clone()
        residual[d] = 0.0
        out.append(int(torch.multinomial(residual / residual.sum(), 1, generator=generator)))
        return out
    out.append(int(torch.multinomial(probs[len(draft)], 1, generator=generator)))
    return out

"""The matmul floor of one step: the time of the model's linear layers alone, at the step's token count.

Any engine running these weights in this dtype with torch's matmul kernels pays at least this much per
step, whatever its attention, cache and scheduling cost. `bench.engine` divides it into transformers' own
time to print the ceiling of the ratio an engine could reach on the shapes it measures.
"""

from __future__ import annotations

import statistics

import torch
from torch import nn

from bench.engine_timing import now


def linears(model: nn.Module) -> tuple[list[nn.Linear], nn.Linear]:
    """(every linear layer of the decoder stack, the LM head)."""
    head = model.lm_head
    assert isinstance(head, nn.Linear)
    return [m for m in model.modules() if isinstance(m, nn.Linear) and m is not head], head


@torch.inference_mode()
def floor_seconds(model: nn.Module, tokens: int, sampled: int, repeats: int) -> float:
    """Median seconds for one pass of `tokens` rows through every decoder linear layer plus `sampled` rows
    through the LM head (random inputs of the model's dtype)."""
    layers, head = linears(model)
    dtype = head.weight.dtype
    inputs = [torch.randn(tokens, lin.in_features, dtype=dtype) for lin in layers]
    head_in = torch.randn(sampled, head.in_features, dtype=dtype)

    def one_pass() -> float:
        start = now()
        for lin, x in zip(layers, inputs, strict=True):
            lin(x)
        head(head_in)
        return now() - start

    one_pass()  # first touch of the weights
    return statistics.median(one_pass() for _ in range(repeats))


def floor_tok_s(model: nn.Module, phase: str, batch: int, prompt_len: int) -> float:
    """Tokens/s if only the matmuls cost time: a prefill of `batch` prompts in one step, or one decode
    step."""
    if phase == "prefill":
        return batch * prompt_len / floor_seconds(model, batch * prompt_len, batch, repeats=3)
    return batch / floor_seconds(model, batch, batch, repeats=20)

"""Mixture-of-experts MLP: top-k routing, and the routed experts computed grouped by expert.

The router scores every token against every expert (softmax in float32), keeps the top k and, where the model
says so, renormalises their weights to sum to one. The experts' weights are stacked ([E, 2I, H] gate and up
fused, [E, H, I] down) as the checkpoint loads. Tokens are sorted by expert so each expert runs one matmul
over a contiguous slice of rows; the loop is over experts, never over tokens. Each row is then weighted and
added back to its token. Sizing the slices reads the per-expert counts on the host, which a compiled or
CUDA-graph-captured step cannot do: there every expert runs over every row and a [T, E] combine matrix (zero
outside each token's top k) weights them, which is exact and costs E/k times the expert FLOPs (small at decode
batch sizes, where the step reads every expert's weights anyway). An optional shared expert (Qwen2-MoE) runs
on every token, scaled by a sigmoid gate.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tandem.worker.hf.config import ModelConfig


def route(logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits [T, E] -> (weights [T, k] float32, experts [T, k]): softmax, top k, optional
    renormalisation."""
    probs = torch.softmax(logits.float(), dim=-1)
    weights, experts = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, experts


class Router(nn.Module):
    """The gate's [E, H] weight; not an nn.Linear, so int8 weight quantization leaves routing exact."""

    def __init__(self, num_experts: int, hidden: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class Experts(nn.Module):
    """The routed experts' stacked weights, loaded from the checkpoint's per-expert `gate`, `up` and
    `down`."""

    def __init__(self, num_experts: int, hidden: int, intermediate: int, names: tuple[str, str, str]):
        super().__init__()
        self.num_experts, self.intermediate = num_experts, intermediate
        self.gate_up = nn.Parameter(torch.empty(num_experts, 2 * intermediate, hidden))
        self.down = nn.Parameter(torch.empty(num_experts, hidden, intermediate))
        self._register_load_state_dict_pre_hook(self._stack_on_load(names))

    def _stack_on_load(self, names: tuple[str, str, str]):  # noqa: ANN202 (a torch hook)
        gate, up, down = names

        def hook(state_dict: dict, prefix: str, *args: object) -> None:
            def take(name: str) -> list[torch.Tensor]:
                keys = [f"{prefix}{e}.{name}.weight" for e in range(self.num_experts)]
                return [state_dict.pop(k) for k in keys] if all(k in state_dict for k in keys) else []

            gates, ups, downs = take(gate), take(up), take(down)
            if gates and ups:
                state_dict[prefix + "gate_up"] = torch.stack(
                    [torch.cat(gu) for gu in zip(gates, ups, strict=True)]
                )
            if downs:
                state_dict[prefix + "down"] = torch.stack(downs)

        return hook

    def forward(self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        """x [T, H], weights and experts [T, k] -> [T, H]: sum over k of weight * expert(x)."""
        if torch.compiler.is_compiling() or (x.is_cuda and torch.cuda.is_current_stream_capturing()):
            return self.dense(x, weights, experts)
        return self.grouped(x, weights, experts)

    def dense(self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        """Every expert over every row, combined by the routing weights (static shapes, no host sync)."""
        combine = torch.zeros(x.shape[0], self.num_experts, dtype=x.dtype, device=x.device)
        combine.scatter_(1, experts, weights.to(x.dtype))
        gate, up = torch.einsum("th,eih->eti", x, self.gate_up).split(self.intermediate, dim=-1)
        out = torch.einsum("eti,ehi->eth", F.silu(gate) * up, self.down)  # [E, T, H]
        return torch.einsum("eth,te->th", out, combine)

    def grouped(self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        """Rows sorted by expert, one matmul per expert over its contiguous slice."""
        k = experts.shape[1]
        order = experts.flatten().argsort(stable=True)  # the T*k (token, choice) rows, grouped by expert
        token = order // k
        counts = torch.bincount(experts.flatten(), minlength=self.num_experts).tolist()  # one sync per layer
        rows = x[token]
        out = torch.empty_like(rows)
        start = 0
        for e, n in enumerate(counts):
            if n:
                gate, up = F.linear(rows[start : start + n], self.gate_up[e]).split(self.intermediate, dim=-1)
                out[start : start + n] = F.linear(F.silu(gate) * up, self.down[e])
                start += n
        out = out * weights.flatten()[order, None].to(out.dtype)
        return torch.zeros_like(x).index_add_(0, token, out)


class SparseMoe(nn.Module):
    """Router, routed experts and an optional gated shared expert, as one tensor-in, tensor-out MLP."""

    def __init__(
        self, config: ModelConfig, names: tuple[str, str, str], shared_expert: nn.Module | None = None
    ):
        super().__init__()
        self.top_k, self.renormalize = config.num_experts_per_tok, config.norm_topk_prob
        self.gate = Router(config.num_experts, config.hidden_size)
        self.experts = Experts(config.num_experts, config.hidden_size, config.moe_intermediate_size, names)
        self.shared_expert = shared_expert
        self.shared_expert_gate = (
            nn.Linear(config.hidden_size, 1, bias=False) if shared_expert is not None else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, experts = route(self.gate(x), self.top_k, self.renormalize)
        out = self.experts(x, weights, experts)
        if self.shared_expert is not None and self.shared_expert_gate is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out

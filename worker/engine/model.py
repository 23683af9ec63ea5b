"""The Llama-family decoder (Llama 2/3, Mistral, Qwen2, TinyLlama) as pure torch code over a paged KV cache.

No scheduling and no I/O: the caller hands in a flat batch of tokens with their positions and an
`AttentionBatch` that says where each sequence's KV lives. Parameter names equal Hugging Face's, so a
checkpoint's state dict loads as is. `layer_hook(layer)` runs after each layer has written its KV, which
is where the prefill worker starts pushing that layer to the decode worker.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from tandem.worker.hf.config import ModelConfig, ModelLoadError


@dataclass
class AttentionBatch:
    """Where the tokens of one forward pass go in the paged KV cache.

    Sequences are laid out back to back in the flat token dimension T. The index tensors that every
    layer needs are derived once here, not once per layer.
    """

    query_lens: list[int]  # new tokens per sequence
    context_lens: list[int]  # tokens in the cache after this step (cached + new), per sequence
    block_tables: list[list[int]]  # KV block ids per sequence
    slot_mapping: torch.Tensor  # [T] flat slot (block * block_size + offset) for each new token
    block_size: int
    starts: list[int] = field(init=False)  # first flat token of each sequence
    decode_rows: list[int] = field(init=False)  # sequences with one new token, attended as one batch
    decode_tokens: torch.Tensor = field(init=False)  # [B] their flat token index
    decode_blocks: torch.Tensor = field(init=False)  # [B * max_blocks] their block ids, padded
    decode_mask: torch.Tensor = field(init=False)  # [B, 1, 1, max_blocks * block_size] valid context
    context_blocks: dict[int, torch.Tensor] = field(init=False)  # other sequences with cached context

    def __post_init__(self) -> None:
        device = self.slot_mapping.device
        self.starts = [0]
        for n in self.query_lens:
            self.starts.append(self.starts[-1] + n)
        rows = [i for i, n in enumerate(self.query_lens) if n == 1]
        self.decode_rows = rows if len(rows) > 1 else []
        bs = self.block_size
        if self.decode_rows:
            need = [-(-self.context_lens[i] // bs) for i in self.decode_rows]
            width = max(need)
            ids = [b for i, k in zip(self.decode_rows, need, strict=True) for b in self.block_tables[i][:k] + [0] * (width - k)]
            lens = torch.tensor([self.context_lens[i] for i in self.decode_rows], device=device)
            self.decode_blocks = torch.tensor(ids, dtype=torch.long, device=device)
            self.decode_mask = (torch.arange(width * bs, device=device)[None, :] < lens[:, None])[:, None, None, :]
            self.decode_tokens = torch.tensor([self.starts[i] for i in self.decode_rows], device=device)
        self.context_blocks = {
            i: torch.tensor(self.block_tables[i][: -(-ctx // bs)], dtype=torch.long, device=device)
            for i, (n, ctx) in enumerate(zip(self.query_lens, self.context_lens, strict=True))
            if ctx != n and i not in self.decode_rows
        }


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    """Rotary inverse frequencies, with Llama 3 and linear RoPE scaling."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = config.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind in ("default", None):
        return inv_freq
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind == "llama3":
        factor = scaling["factor"]
        low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
        old_len = scaling["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return torch.where(is_medium, smoothed, scaled)
    raise ModelLoadError(f"unsupported rope_scaling type {kind!r}")


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        h, bias = config.hidden_size, config.attention_bias
        self.q_proj = nn.Linear(h, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(h, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(h, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, h, bias=False)
        self.scale = self.head_dim**-0.5

    def forward(
        self,
        x: torch.Tensor,  # [T, H]
        cos: torch.Tensor,  # [T, D]
        sin: torch.Tensor,  # [T, D]
        k_cache: torch.Tensor,  # [num_blocks, block_size, KVH, D]
        v_cache: torch.Tensor,
        batch: AttentionBatch,
    ) -> torch.Tensor:
        t = x.shape[0]
        q = self.q_proj(x).view(t, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(t, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(t, self.num_kv_heads, self.head_dim)
        q = q * cos[:, None] + rotate_half(q) * sin[:, None]
        k = k * cos[:, None] + rotate_half(k) * sin[:, None]
        k_cache.view(-1, self.num_kv_heads, self.head_dim)[batch.slot_mapping] = k
        v_cache.view(-1, self.num_kv_heads, self.head_dim)[batch.slot_mapping] = v
        out = paged_attention(q, k, v, k_cache, v_cache, batch, self.scale)  # [T, NH, D]
        return self.o_proj(out.reshape(t, self.num_heads * self.head_dim))


def paged_attention(
    q: torch.Tensor,  # [T, NH, D]
    k_new: torch.Tensor,  # [T, KVH, D]
    v_new: torch.Tensor,
    k_cache: torch.Tensor,  # [num_blocks, block_size, KVH, D]
    v_cache: torch.Tensor,
    batch: AttentionBatch,
    scale: float,
) -> torch.Tensor:
    """Causal attention of each sequence's new queries over its whole context in the paged cache."""
    out = torch.empty_like(q)
    gqa = q.shape[1] != k_new.shape[1]
    kvh, d = k_cache.shape[2], k_cache.shape[3]
    if batch.decode_rows:  # single-token decodes as one batch over padded contexts
        b = len(batch.decode_rows)
        ks = k_cache.index_select(0, batch.decode_blocks).view(b, -1, kvh, d).transpose(1, 2)  # [B, KVH, L, D]
        vs = v_cache.index_select(0, batch.decode_blocks).view(b, -1, kvh, d).transpose(1, 2)
        qb = q.index_select(0, batch.decode_tokens)[:, :, None, :]  # [B, NH, 1, D]
        o = F.scaled_dot_product_attention(qb, ks, vs, attn_mask=batch.decode_mask, scale=scale, enable_gqa=gqa)
        out[batch.decode_tokens] = o[:, :, 0, :]
    decoded = set(batch.decode_rows)
    for i, (n, ctx) in enumerate(zip(batch.query_lens, batch.context_lens, strict=True)):
        if i in decoded:
            continue
        s, e = batch.starts[i], batch.starts[i] + n
        qi = q[s:e].transpose(0, 1)[None]  # [1, NH, n, D]
        if ctx == n:  # nothing cached before: attend over the fresh keys directly
            ki, vi = k_new[s:e], v_new[s:e]
            mask, causal = None, n > 1
        else:
            blocks = batch.context_blocks[i]
            ki = k_cache.index_select(0, blocks).flatten(0, 1)[:ctx]  # [ctx, KVH, D]
            vi = v_cache.index_select(0, blocks).flatten(0, 1)[:ctx]
            q_pos = torch.arange(ctx - n, ctx, device=q.device)
            mask, causal = torch.arange(ctx, device=q.device)[None, :] <= q_pos[:, None], False  # [n, ctx]
        o = F.scaled_dot_product_attention(
            qi, ki.transpose(0, 1)[None], vi.transpose(0, 1)[None], attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=gqa
        )
        out[s:e] = o[0].transpose(0, 1)
    return out


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)


class _Body(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


LayerHook = Callable[[int], None]


class Transformer(nn.Module):
    """Causal LM whose state dict keys match Hugging Face's `*ForCausalLM` for the Llama family."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = _Body(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.register_buffer("inv_freq", rope_inv_freq(config), persistent=False)

    def forward(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        k_caches: list[torch.Tensor],  # per layer [num_blocks, block_size, KVH, D]
        v_caches: list[torch.Tensor],
        batch: AttentionBatch,
        layer_hook: LayerHook | None = None,
    ) -> torch.Tensor:  # [T, H] final hidden states
        x = self.model.embed_tokens(input_ids)
        inv_freq: torch.Tensor = self.inv_freq  # type: ignore[assignment]
        freqs = positions.float()[:, None] * inv_freq[None, :]  # [T, D/2], float32 like HF
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        layer: DecoderLayer
        for i, layer in enumerate(self.model.layers):  # type: ignore[assignment]
            h = x + layer.self_attn(layer.input_layernorm(x), cos, sin, k_caches[i], v_caches[i], batch)
            x = h + layer.mlp(layer.post_attention_layernorm(h))
            if layer_hook is not None:
                layer_hook(i)
        return self.model.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, H] -> [N, V] float32
        return self.lm_head(hidden).float()

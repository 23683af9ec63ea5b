"""The Llama-family decoder (Llama 2/3, Mistral, Qwen2, Qwen3, TinyLlama) as pure torch code over a paged KV
cache.

No scheduling and no I/O: the caller hands in a flat batch of tokens with their positions and an
`AttentionBatch` that says where each sequence's KV lives. A Hugging Face checkpoint's state dict loads
as is: the q/k/v and gate/up projections are fused as it loads. `layer_hook(layer)` runs after each layer
has written its KV, which is where the prefill worker starts pushing that layer to the decode worker.
`num_layers` stops after the first layers (the self-speculative draft: early exit into the final norm).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from tandem.worker.engine.layers.attention import AttentionBatch, StepBatch, attend, store_kv
from tandem.worker.engine.layers.kv_cache import KvCache
from tandem.worker.engine.models.protocol import LayerHook
from tandem.worker.hf.config import ModelConfig, ModelLoadError

__all__ = ["AttentionBatch", "Model", "Transformer", "expected_shapes"]


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    """Rotary inverse frequencies, with Llama 3 and linear RoPE scaling; on the host whatever device the model
    is built under (on `meta` this arithmetic would import torch._dynamo), the loader moves them."""
    dim = config.head_dim
    steps = torch.arange(0, dim, 2, dtype=torch.int64, device="cpu")
    inv_freq = 1.0 / (config.rope_theta ** (steps.float() / dim))
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


def fuse_on_load(module: nn.Module, fused: str, parts: tuple[str, ...]) -> None:
    """Let `module` load Hugging Face's separate projections `parts` into its one `fused` Linear.

    The checkpoint's tensors are concatenated along the output dimension as the state dict is loaded
    (as gpt-fast does), so checkpoints keep their names and each layer runs one matmul instead of several.
    An FP8 checkpoint's per-channel `weight_scale`s are concatenated the same way; the parts share one input,
    so their static `input_scale`s merge into the largest (as vLLM does). `module.fused_parts` names them.
    """

    def hook(state_dict: dict, prefix: str, *args: object) -> None:
        for kind in ("weight", "bias", "weight_scale", "input_scale"):
            names = [f"{prefix}{p}.{kind}" for p in parts]
            if all(n in state_dict for n in names):
                tensors = [state_dict.pop(n) for n in names]
                merged = torch.stack(tensors).amax() if kind == "input_scale" else torch.cat(tensors)
                state_dict[f"{prefix}{fused}.{kind}"] = merged

    vars(module).setdefault("fused_parts", {})[fused] = parts
    module._register_load_state_dict_pre_hook(hook)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            config.num_heads,
            config.num_kv_heads,
            config.head_dim,
        )
        h, bias = config.hidden_size, config.attention_bias
        q_out, kv_out = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = nn.Linear(h, q_out + 2 * kv_out, bias=bias)  # q_proj, k_proj, v_proj fused
        self.o_proj = nn.Linear(q_out, h, bias=False)
        self.scale = self.head_dim**-0.5
        fuse_on_load(self, "qkv_proj", ("q_proj", "k_proj", "v_proj"))
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if config.qk_norm else None

    def forward(
        self,
        x: torch.Tensor,  # [T, H]
        cos: torch.Tensor,  # [T, D]
        sin: torch.Tensor,  # [T, D]
        k_cache: torch.Tensor,  # [num_blocks, block_size, KVH, D] (8-bit: uint8, D + 4 bytes; see kv_int8)
        v_cache: torch.Tensor,
        batch: StepBatch,
    ) -> torch.Tensor:
        t, nh, kvh = x.shape[0], self.num_heads, self.num_kv_heads
        qkv = self.qkv_proj(x).view(t, nh + 2 * kvh, self.head_dim)
        qk, v = qkv[:, : nh + kvh], qkv[:, nh + kvh :]
        if self.q_norm is not None and self.k_norm is not None:  # Qwen3: per-head norms before rotary
            qk = torch.cat((self.q_norm(qk[:, :nh]), self.k_norm(qk[:, nh:])), dim=1)
        qk = qk * cos[:, None] + rotate_half(qk) * sin[:, None]  # rotary on queries and keys at once
        q, k = qk[:, :nh], qk[:, nh:]
        store_kv(k_cache, v_cache, k, v, batch)  # packed to 8 bits when the cache is int8
        out = attend(q, k, v, k_cache, v_cache, batch, self.scale)  # [T, NH, D]
        return self.o_proj(out.reshape(t, nh * self.head_dim))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig, intermediate: int | None = None):
        super().__init__()
        self.intermediate = inter = intermediate or config.intermediate_size
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * inter, bias=False)
        self.down_proj = nn.Linear(inter, config.hidden_size, bias=False)
        fuse_on_load(self, "gate_up_proj", ("gate_proj", "up_proj"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, mlp: nn.Module):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = mlp  # tensor in, tensor out: dense (MLP) or routed experts (layers/moe.py)


MlpFactory = Callable[[ModelConfig, int], nn.Module]


class _Body(nn.Module):
    def __init__(self, config: ModelConfig, make_mlp: MlpFactory):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(config, make_mlp(config, i)) for i in range(config.num_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


def _same(x: torch.Tensor) -> torch.Tensor:
    return x


class Transformer(nn.Module):
    """Causal LM that loads Hugging Face's `*ForCausalLM` state dicts for the Llama family (q/k/v and
    gate/up projections fused as they load)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = _Body(config, self.make_mlp)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.register_buffer("inv_freq", rope_inv_freq(config), persistent=False)
        # Tensor parallelism (tp/): `reduce` sums the ranks' partial attention and MLP outputs, `gather_vocab`
        # joins the ranks' slices of the logits; one rank: both leave the tensor as it is.
        self.reduce: Callable[[torch.Tensor], torch.Tensor] = _same
        self.gather_vocab: Callable[[torch.Tensor], torch.Tensor] = _same

    @property
    def kv_config(self) -> ModelConfig:
        """The config the KV cache is shaped by (a tensor-parallel rank's: its share of the KV heads)."""
        return self.config

    def kv_cache(
        self, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device, kv_cache_dtype: str
    ) -> KvCache:
        return KvCache(self.kv_config, num_blocks, block_size, dtype, device, kv_cache_dtype)

    @staticmethod
    def make_mlp(config: ModelConfig, layer: int) -> nn.Module:
        """Layer `layer`'s MLP: dense here; mixture-of-experts models override it."""
        return MLP(config)

    def forward(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        k_caches: list[torch.Tensor],  # per layer [num_blocks, block_size, KVH, D]
        v_caches: list[torch.Tensor],
        batch: StepBatch,
        layer_hook: LayerHook | None = None,
        num_layers: int | None = None,  # only the first this many layers, then the final norm (early exit)
    ) -> torch.Tensor:  # [T, H] final hidden states
        x = self.model.embed_tokens(input_ids)
        inv_freq: torch.Tensor = self.inv_freq  # type: ignore[assignment]
        freqs = positions.float()[:, None] * inv_freq[None, :]  # [T, D/2], float32 like HF
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        layer: DecoderLayer
        for i, layer in enumerate(itertools.islice(self.model.layers, num_layers)):  # type: ignore[assignment]
            h = x + self.reduce(
                layer.self_attn(layer.input_layernorm(x), cos, sin, k_caches[i], v_caches[i], batch)
            )
            x = h + self.reduce(layer.mlp(layer.post_attention_layernorm(h)))
            if layer_hook is not None:
                layer_hook(i)
        return self.model.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, H] -> [N, V] float32
        return self.gather_vocab(self.lm_head(hidden).float())


Model = Transformer


MlpShapes = Callable[[ModelConfig, int, str], dict[str, tuple[int, ...]]]


def dense_mlp_shapes(config: ModelConfig, layer: int, prefix: str) -> dict[str, tuple[int, ...]]:
    """A dense gated MLP's tensors in the layer under `prefix` (`model.layers.{i}.`)."""
    hidden, inter = config.hidden_size, config.intermediate_size
    return {
        prefix + "mlp.gate_proj.weight": (inter, hidden),
        prefix + "mlp.up_proj.weight": (inter, hidden),
        prefix + "mlp.down_proj.weight": (hidden, inter),
    }


def expected_shapes(
    config: ModelConfig, mlp_shapes: MlpShapes = dense_mlp_shapes
) -> dict[str, tuple[int, ...]]:
    """The checkpoint's tensors by their Hugging Face Llama names, in checkpoint order (the registry's
    tensor-name mapping); `mlp_shapes` names each layer's MLP tensors (mixture-of-experts models pass
    theirs)."""
    hidden, vocab = config.hidden_size, config.vocab_size
    q_out = config.num_heads * config.head_dim
    kv_out = config.num_kv_heads * config.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (hidden,)
        shapes[p + "self_attn.q_proj.weight"] = (q_out, hidden)
        shapes[p + "self_attn.k_proj.weight"] = (kv_out, hidden)
        shapes[p + "self_attn.v_proj.weight"] = (kv_out, hidden)
        if config.attention_bias:
            shapes[p + "self_attn.q_proj.bias"] = (q_out,)
            shapes[p + "self_attn.k_proj.bias"] = (kv_out,)
            shapes[p + "self_attn.v_proj.bias"] = (kv_out,)
        shapes[p + "self_attn.o_proj.weight"] = (hidden, q_out)
        if config.qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = (config.head_dim,)
            shapes[p + "self_attn.k_norm.weight"] = (config.head_dim,)
        shapes[p + "post_attention_layernorm.weight"] = (hidden,)
        shapes.update(mlp_shapes(config, i, p))
    shapes["model.norm.weight"] = (hidden,)
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (vocab, hidden)
    return shapes

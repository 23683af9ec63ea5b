"""Hugging Face transformers models on random weights: the numerical reference our model code is held to."""

from __future__ import annotations

import torch
import transformers

from tandem.worker.engine.models.llama import Transformer
from tandem.worker.engine.runner.engine import Engine, EngineConfig
from tandem.worker.hf.config import ModelConfig

LLAMA_GQA = dict(
    architectures=["LlamaForCausalLM"],
    vocab_size=512,
    hidden_size=128,
    intermediate_size=344,
    num_hidden_layers=3,
    num_attention_heads=8,
    num_key_value_heads=2,
    max_position_embeddings=2048,
    rms_norm_eps=1e-5,
    rope_theta=500000.0,
    rope_scaling={
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 256,
    },
    tie_word_embeddings=False,
    initializer_range=0.08,
)

QWEN2_BIAS = dict(
    architectures=["Qwen2ForCausalLM"],
    vocab_size=512,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=2048,
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
    tie_word_embeddings=True,
    use_sliding_window=False,
    initializer_range=0.08,
)


MIXTRAL = dict(  # odd KV head count (3), untied embeddings, top-2 of 4 experts renormalised
    architectures=["MixtralForCausalLM"],
    vocab_size=512,
    hidden_size=96,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=6,
    num_key_value_heads=3,
    num_local_experts=4,
    num_experts_per_tok=2,
    max_position_embeddings=2048,
    rms_norm_eps=1e-5,
    rope_theta=1000000.0,
    tie_word_embeddings=False,
    initializer_range=0.08,
)

QWEN2_MOE = (
    dict(  # q/k/v bias, tied embeddings, top-3 of 8 not renormalised, a shared expert, one dense layer
        architectures=["Qwen2MoeForCausalLM"],
        vocab_size=512,
        hidden_size=64,
        intermediate_size=96,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=80,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_experts=8,
        num_experts_per_tok=3,
        norm_topk_prob=False,
        decoder_sparse_step=1,
        mlp_only_layers=[1],
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
        use_sliding_window=False,
        initializer_range=0.08,
    )
)

QWEN3_MOE = (
    dict(  # per-head q/k norms, explicit head_dim, top-2 of 6 renormalised, a dense layer by sparse step
        architectures=["Qwen3MoeForCausalLM"],
        vocab_size=512,
        hidden_size=64,
        intermediate_size=96,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=24,
        num_experts=6,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        decoder_sparse_step=2,
        mlp_only_layers=[],
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        tie_word_embeddings=False,
        initializer_range=0.08,
    )
)

CONFIG_CLASSES = {
    "LlamaForCausalLM": transformers.LlamaConfig,
    "Qwen2ForCausalLM": transformers.Qwen2Config,
    "MixtralForCausalLM": transformers.MixtralConfig,
    "Qwen2MoeForCausalLM": transformers.Qwen2MoeConfig,
    "Qwen3MoeForCausalLM": transformers.Qwen3MoeConfig,
    "Qwen3ForCausalLM": transformers.Qwen3Config,
}


def hf_model(cfg: dict, seed: int = 0) -> transformers.PreTrainedModel:
    torch.manual_seed(seed)
    arch = cfg["architectures"][0]
    config_cls = CONFIG_CLASSES[arch]
    model_cls = getattr(transformers, arch)
    kwargs = {k: v for k, v in cfg.items() if k != "architectures"}
    hf = model_cls(config_cls(**kwargs, architectures=[arch], attn_implementation="eager"))
    with torch.no_grad():
        for layer in hf.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                if proj.bias is not None:  # HF initialises biases to zero; make them matter
                    proj.bias.normal_(0, 0.1)
            for norm in (getattr(layer.self_attn, "q_norm", None), getattr(layer.self_attn, "k_norm", None)):
                if norm is not None:  # HF starts them at 1; make them matter
                    norm.weight.normal_(1.0, 0.2)
            for name, param in layer.mlp.named_parameters():  # routers start at zero in some families
                if name.startswith(("gate.", "shared_expert_gate.")):
                    param.normal_(
                        0, 2.0
                    )  # decisive routing: a near-tie between experts would flip on rounding
    return hf.float().eval()


def ours_from(hf: transformers.PreTrainedModel) -> Transformer:
    model = Transformer(ModelConfig.from_hf(hf.config.to_dict()))
    model.load_state_dict(hf.state_dict(), strict=True)
    return model.float().eval()


def engine_for(model: Transformer, **overrides) -> Engine:
    return Engine(model, EngineConfig(**{"block_size": 8, "num_kv_blocks": 256, **overrides}))


def hf_greedy(hf: transformers.PreTrainedModel, prompt: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([prompt]),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=None,
        )
    return out[0, len(prompt) :].tolist()

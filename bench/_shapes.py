"""Real Llama shapes for the GPU benches, and random weights written at them with a tokenizer that decodes
every id the model can sample: one definition that bench.gpu_engine, bench.fp8_rows and bench.gpu_serving
share."""

from __future__ import annotations

import json
from pathlib import Path

from tandem.worker.devtools.tiny import (
    BOS,
    EOS,
    TinySpec,
    build_tokenizer,
    hf_config,
    random_state_dict,
    write_safetensors,
)
from tandem.worker.hf.config import ModelConfig

LLAMA_3_2_1B = TinySpec(
    layers=16,
    hidden=2048,
    heads=32,
    kv_heads=8,
    intermediate=8192,
    max_positions=131072,
    tie_embeddings=True,
    dtype="bfloat16",
    rope_theta=500000.0,
)
LLAMA_3_VOCAB = 128256
LLAMA_3_ROPE_SCALING = {
    "rope_type": "llama3",
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


MOE_SHAPE = TinySpec(
    arch="mixtral",
    layers=8,
    hidden=2048,
    heads=32,
    kv_heads=8,
    intermediate=4096,
    experts=8,
    experts_per_token=2,
    max_positions=32768,
    dtype="bfloat16",
)


LLAMA_3_1_8B = TinySpec(
    layers=32,
    hidden=4096,
    heads=32,
    kv_heads=8,
    intermediate=14336,
    max_positions=131072,
    dtype="bfloat16",
    rope_theta=500000.0,
)
LLAMA_3_1_ROPE_SCALING = {**LLAMA_3_ROPE_SCALING, "factor": 8.0}


def write_llama_8b_shaped(model_dir: Path, seed: int = 0, device: str = "cpu") -> Path:
    """Random weights at Llama-3.1-8B's shape (see write_llama_shaped; on a GPU seconds, on the CPU
    minutes)."""
    return write_llama_shaped(model_dir, LLAMA_3_1_8B, LLAMA_3_1_ROPE_SCALING, seed, device)


def write_llama_1b_shaped(model_dir: Path, seed: int = 0) -> Path:
    """The tiny-model writer at Llama-3.2-1B's shape and full vocab (the tiny tokenizer covers its first
    ids)."""
    return write_llama_shaped(model_dir, LLAMA_3_2_1B, LLAMA_3_ROPE_SCALING, seed)


def write_llama_shaped(
    model_dir: Path, spec: TinySpec, rope_scaling: dict, seed: int = 0, device: str = "cpu"
) -> Path:
    """Random weights (drawn on `device`) at a Llama-3 shape and its full vocab (128256): the tiny tokenizer,
    with one added token per id past its own, so every id the model can sample decodes to text (a served
    stream whose ids decoded to nothing would carry no content to time)."""
    model_dir.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer()
    tok.add_tokens([f"<|t{i}|>" for i in range(tok.get_vocab_size(with_added_tokens=True), LLAMA_3_VOCAB)])
    config = hf_config(spec, LLAMA_3_VOCAB, tok.token_to_id(BOS), tok.token_to_id(EOS))
    config["rope_scaling"] = rope_scaling
    write_safetensors(random_state_dict(ModelConfig.from_hf(config), seed, spec.dtype, device), model_dir)
    tok.save(str(model_dir / "tokenizer.json"))
    (model_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return model_dir

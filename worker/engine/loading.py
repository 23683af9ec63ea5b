"""Builds a ready-to-serve model from a Hugging Face directory: config, weights, tokenizer, engine."""

from __future__ import annotations

from pathlib import Path

import torch

from tandem.worker.engine.core.grammar import GRAMMAR_TOKENIZER_FILE, GrammarVocab
from tandem.worker.engine.layers.weight_int8 import QUANTIZATIONS, quantize_model
from tandem.worker.engine.loader import load_checkpoint, parse_dtype
from tandem.worker.engine.models.llama import Transformer, rope_inv_freq
from tandem.worker.engine.runner.engine import Engine, EngineConfig
from tandem.worker.hf.tokenizer import Tokenizer


def load_model(
    model_dir: str | Path, dtype: str | torch.dtype = "float32", device: str = "cpu", quantization: str = "none"
) -> Transformer:
    """Our Transformer with the checkpoint's weights (no random init: parameters start on `meta`), its
    linear layers quantized to int8 as they load when `quantization` is `int8` (see weight_int8)."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, got {quantization!r}")
    target = parse_dtype(dtype)
    config, state = load_checkpoint(model_dir, target, device)
    with torch.device("meta"):
        model = Transformer(config)
    model.load_state_dict(state, strict=True, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.inv_freq = rope_inv_freq(config).to(device)  # a non-persistent buffer, still on `meta`
    del state
    if quantization == "int8":
        quantize_model(model)
    return model.eval()


def build_engine(
    model_dir: str | Path,
    engine_config: EngineConfig,
    dtype: str | torch.dtype = "float32",
    device: str = "cpu",
    quantization: str = "none",
) -> tuple[Engine, Tokenizer]:
    return engine_for_model(load_model(model_dir, dtype, device, quantization), model_dir, engine_config)


def engine_for_model(model: Transformer, model_dir: str | Path, engine_config: EngineConfig) -> tuple[Engine, Tokenizer]:
    """An engine around an already loaded model (its KV cache sized after the weights are in)."""
    tokenizer = Tokenizer.from_dir(model_dir)
    eos = tuple(tokenizer.eos_token_ids) or model.config.eos_token_ids
    vocab = GrammarVocab(Path(model_dir) / GRAMMAR_TOKENIZER_FILE, model.config.vocab_size, tuple(eos))
    return Engine(model, engine_config, eos_token_ids=tuple(eos), grammar_vocab=vocab), tokenizer

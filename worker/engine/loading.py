"""Loads a Hugging Face model directory: validated, dtype-cast safetensors weights into our model, its
tokenizer, and an engine around them."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import safe_open

from tandem.worker.engine.core.grammar import GRAMMAR_TOKENIZER_FILE, GrammarVocab
from tandem.worker.engine.layers import weight_fp8, weight_int8
from tandem.worker.engine.meta_init import on_meta_uninitialised
from tandem.worker.engine.models.llama import Transformer, rope_inv_freq
from tandem.worker.engine.models.protocol import CausalLM
from tandem.worker.engine.models.registry import model_module
from tandem.worker.engine.runner.engine import Engine, EngineConfig
from tandem.worker.hf.config import ModelConfig, ModelLoadError
from tandem.worker.hf.tokenizer import Tokenizer

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "fp16": torch.float16,
    "float16": torch.float16,
    "half": torch.float16,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
}
QUANTIZATIONS = (
    "none",
    "int8",
    "fp8",
)  # model.quantization: weights as stored, int8 or fp8 (see layers/weight_*)


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    """`fp32` / `fp16` / `bf16` (or their long names) to a torch dtype."""
    if isinstance(name, torch.dtype):
        if name not in DTYPES.values():
            raise ValueError(f"unsupported dtype {name}; use fp32, fp16 or bf16")
        return name
    try:
        return DTYPES[name.lower()]
    except KeyError:
        raise ValueError(f"unsupported dtype {name!r}; use fp32, fp16 or bf16") from None


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the model reads from a checkpoint, by its Hugging Face name, in checkpoint order."""
    return model_module(config.architecture).expected_shapes(config)


def weight_files(model_dir: str | Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file that holds it, from the index file or the single file."""
    root = Path(model_dir)
    if not root.is_dir():
        raise ModelLoadError(f"{root}: model directory does not exist")
    index_path = root / INDEX_FILE
    if index_path.is_file():
        return _files_from_index(index_path)
    single = root / SINGLE_FILE
    if single.is_file():
        with safe_open(str(single), framework="pt") as f:
            return dict.fromkeys(f.keys(), single)
    hint = (
        " (pytorch_model.bin checkpoints are not supported; convert to safetensors)"
        if any(root.glob("*.bin"))
        else ""
    )
    raise ModelLoadError(f"{root}: missing {SINGLE_FILE} or {INDEX_FILE}{hint}")


def _files_from_index(index_path: Path) -> dict[str, Path]:
    try:
        weight_map = json.loads(index_path.read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ModelLoadError(f"{index_path}: not a valid safetensors index ({e})") from None
    files = {name: index_path.parent / shard for name, shard in weight_map.items()}
    for shard in sorted(set(files.values())):
        if not shard.is_file():
            raise ModelLoadError(f"{index_path}: shard {shard.name} is missing")
    return files


def load_state_dict(
    model_dir: str | Path,
    config: ModelConfig,
    dtype: str | torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    shard: Callable[[str, torch.Tensor], torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors named in `expected_shapes(config)`, cast to `dtype` on `device`; with `shard`,
    each tensor is cut to this tensor-parallel rank's slice as it is read (one full tensor in memory at a
    time).

    Missing tensors and shape mismatches raise ModelLoadError naming the tensor; extra tensors (such as
    `rotary_emb.inv_freq`) are ignored. With tied embeddings `lm_head.weight` is not read from the
    checkpoint but is the very tensor `model.embed_tokens.weight`, like the state dict of a tied model.
    """
    target = parse_dtype(dtype)
    shapes = expected_shapes(config)
    files = weight_files(model_dir)
    missing = [name for name in shapes if name not in files]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ModelLoadError(f"{model_dir}: checkpoint is missing tensor {missing[0]}{more}")
    by_file: dict[Path, list[str]] = {}
    for name in shapes:
        by_file.setdefault(files[name], []).append(name)
    state: dict[str, torch.Tensor] = {}
    for path, names in by_file.items():
        with safe_open(str(path), framework="pt", device=str(device)) as f:
            for name in names:
                want = shapes[name]
                got = tuple(f.get_slice(name).get_shape())
                if got != want:
                    raise ModelLoadError(
                        f"{path.name}: tensor {name} has shape {list(got)}, expected {list(want)}"
                    )
                tensor = f.get_tensor(name)
                if tensor.dtype == weight_fp8.FP8:
                    if shard is not None:
                        raise ModelLoadError(
                            f"{model_dir}: FP8 checkpoints cannot be split across tensor-parallel ranks yet"
                        )
                    state.update(_fp8_weight(name, tensor, files, device))
                    continue
                state[name] = (shard(name, tensor) if shard is not None else tensor).to(target)
    ordered = {name: state[name] for name in shapes} | {n: t for n, t in state.items() if n not in shapes}
    if config.tie_word_embeddings:
        ordered["lm_head.weight"] = ordered["model.embed_tokens.weight"]
    return ordered


def _fp8_weight(
    name: str, q: torch.Tensor, files: dict[str, Path], device: str | torch.device
) -> dict[str, torch.Tensor]:
    """An FP8 checkpoint's layer: its e4m3 `weight` as stored, `weight_scale` as one float32 per output
    channel (a per-tensor scale repeated), and `input_scale` (static activations) when the checkpoint has
    one."""
    prefix = name.removesuffix("weight")
    if prefix + "weight_scale_inv" in files:
        raise ModelLoadError(
            f"{name}: block-wise FP8 scales (weight_scale_inv) are not supported; per-tensor and per-channel "
            "are"
        )
    if prefix + "weight_scale" not in files:
        raise ModelLoadError(f"{name} is float8_e4m3fn but the checkpoint has no {prefix}weight_scale")
    scale = _read(files, prefix + "weight_scale", device).float().reshape(-1)
    if scale.numel() not in (1, q.shape[0]):
        raise ModelLoadError(
            f"{prefix}weight_scale has {scale.numel()} values; expected 1 or {q.shape[0]} (one per output "
            "channel)"
        )
    out = {name: q, prefix + "weight_scale": scale.expand(q.shape[0]).contiguous()}
    if prefix + "input_scale" in files:
        out[prefix + "input_scale"] = _read(files, prefix + "input_scale", device).float().reshape(())
    return out


def _read(files: dict[str, Path], name: str, device: str | torch.device) -> torch.Tensor:
    with safe_open(str(files[name]), framework="pt", device=str(device)) as f:
        return f.get_tensor(name)


def dequantized(state: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """An FP8 checkpoint's state with each e4m3 weight times its scales, in `dtype` (scales dropped)."""
    out = {}
    for name, t in state.items():
        if name.endswith((".weight_scale", ".input_scale")):
            continue
        if t.dtype == weight_fp8.FP8:
            t = weight_fp8.dequantize_weight(t, state[name.removesuffix("weight") + "weight_scale"], dtype)
        out[name] = t
    return out


def load_checkpoint(
    model_dir: str | Path, dtype: str | torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Config and validated weights of a Hugging Face model directory, in one call."""
    config = ModelConfig.from_dir(model_dir)
    return config, load_state_dict(model_dir, config, dtype, device)


def load_model(
    model_dir: str | Path,
    dtype: str | torch.dtype = "float32",
    device: str = "cpu",
    quantization: str = "none",
) -> Transformer:
    """Our Transformer with the checkpoint's weights (no random init: parameters start on `meta`), its linear
    layers quantized as they load when `quantization` is `int8` (see weight_int8) or `fp8` (see weight_fp8).
    An FP8 checkpoint keeps its e4m3 weights and scales with `fp8`; otherwise it is dequantized."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, got {quantization!r}")
    if quantization == "fp8":
        weight_fp8.check_fp8(device)
    target = parse_dtype(dtype)
    config, state = load_checkpoint(model_dir, target, device)
    with on_meta_uninitialised():
        model: Transformer = model_module(config.architecture).Model(config)
    if quantization == "fp8":
        _fp8_layers_as_stored(model, state)
    else:
        state = dequantized(state, target)
    model.load_state_dict(state, strict=True, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.inv_freq = rope_inv_freq(config).to(device)  # a non-persistent buffer, still on `meta`
    del state
    if quantization == "int8":
        weight_int8.quantize_model(model)
    elif (
        quantization == "fp8" and config.checkpoint_quantization != "fp8"
    ):  # an FP8 checkpoint's own choice stands
        weight_fp8.quantize_model(model)
    return model.eval()


def _fp8_layers_as_stored(model: Transformer, state: dict[str, torch.Tensor]) -> None:
    """Swap each (meta) linear layer whose checkpoint weights are e4m3 for an `Fp8Linear` to load them into;
    a fused layer (q/k/v, gate/up) looks at its first part."""
    prefixes = {id(m): f"{n}." if n else "" for n, m in model.named_modules()}
    for parent, name, linear in weight_fp8.fp8_linears(model):
        source = f"{prefixes[id(parent)]}{getattr(parent, 'fused_parts', {}).get(name, (name,))[0]}."
        weight = state.get(source + "weight")
        if weight is not None and weight.dtype == weight_fp8.FP8:
            setattr(
                parent, name, weight_fp8.Fp8Linear.empty(linear, static_input=source + "input_scale" in state)
            )


def build_engine(
    model_dir: str | Path,
    engine_config: EngineConfig,
    dtype: str | torch.dtype = "float32",
    device: str = "cpu",
    quantization: str = "none",
) -> tuple[Engine, Tokenizer]:
    return engine_for_model(load_model(model_dir, dtype, device, quantization), model_dir, engine_config)


def engine_for_model(
    model: CausalLM, model_dir: str | Path, engine_config: EngineConfig
) -> tuple[Engine, Tokenizer]:
    """An engine around an already loaded model (its KV cache sized after the weights are in)."""
    tokenizer = Tokenizer.from_dir(model_dir)
    eos = tuple(tokenizer.eos_token_ids) or model.config.eos_token_ids
    vocab = GrammarVocab(Path(model_dir) / GRAMMAR_TOKENIZER_FILE, model.config.vocab_size, tuple(eos))
    return Engine(model, engine_config, eos_token_ids=tuple(eos), grammar_vocab=vocab), tokenizer

"""A small random-initialised model (Llama, Qwen2, Mixtral or Qwen2-MoE) written in Hugging Face format, so
demos and tests load real files without any download."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import tokenizers
import torch
from safetensors.torch import save_file
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

from tandem.worker.engine.loading import INDEX_FILE, SINGLE_FILE, expected_shapes, parse_dtype
from tandem.worker.hf.config import ModelConfig

BOS, EOS = "<s>", "</s>"
CHAT_MARKERS = ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
SPECIAL_TOKENS = (BOS, EOS, *CHAT_MARKERS)
VOCAB_SIZE = 1536

# Tools go first, as a system turn that shows the call shape; an assistant's calls and a tool's answers
# are turns of their own (the way Llama 3.1's template renders them, in the tiny model's markers).
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}"
    '{{ \'<|system|>\nTo call a tool, answer {"name": <tool name>, "arguments": <JSON object>} and nothing '
    "else. Tools:\n' }}"
    "{% for tool in tools %}{{ tool | tojson }}{{ '\n' }}{% endfor %}"
    "{{ '<|end|>\n' }}"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}"
    "{{ raise_exception('unknown role: ' + message['role']) }}"
    "{% endif %}"
    "{% if message.get('tool_calls') %}"
    "{{ '<|assistant|>\n' }}"
    "{% for call in message['tool_calls'] %}"
    "{% set arguments = call['function']['arguments'] %}"
    "{{ '{\"name\": ' + (call['function']['name'] | tojson) + ', \"arguments\": ' }}"
    "{{ arguments if arguments is string else arguments | tojson }}{{ '}' }}"
    "{% endfor %}"
    "{{ '<|end|>\n' }}"
    "{% else %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)

# The tokenizer's training text: plain English about everyday things, so common words get whole tokens.
CORPUS = """\
The quick brown fox jumps over the lazy dog. A small model can still learn the shape of language.
Once upon a time there was a little village by the sea. Every morning the fishermen went out in their
boats, and every evening they came back with baskets full of fish. The children ran along the beach,
looking for shells and watching the waves. Their mothers called them home when the sun went down.
What is the weather like today? It is sunny and warm, with a light breeze from the west. Tomorrow it
will rain in the afternoon, so bring an umbrella if you go outside. In winter the nights are long and
cold; in summer the days are bright and the evenings stay light until late.
Please write a short story about a robot who wants to become a painter. The robot lived in a quiet
workshop full of tools, paints and brushes. It mixed colours for hours, trying to find the exact blue of
the sky. People laughed at first, but later they came from far away to see its pictures.
How do I make a cup of tea? Boil some water, put a tea bag in a cup, pour the hot water over it and wait
three or four minutes. Add milk or sugar if you like. Some people prefer coffee in the morning and tea
in the afternoon; others drink water all day long.
Computers store numbers, letters and pictures as bits. A program is a list of instructions that tells
the computer what to do, step by step. Servers answer requests from many users at the same time, and a
good system keeps its latency low while the number of requests grows. Memory, storage and networks
all have limits, so engineers measure them carefully and plan for the busiest hour of the day.
Questions and answers: Where is the library? It is next to the station, across the road from the park.
When does the shop open? At nine o'clock on weekdays and at ten on Saturday. Why is the sky blue?
Because air scatters blue light from the sun more than red light. Who wrote this letter? My friend
wrote it last week, before she moved to another city with her family.
The history of the region is long and interesting. Farmers grew wheat and barley in the valleys, and
merchants carried wool, salt and wine along the old roads between the towns. Rivers were important for
trade, and bridges were built of wood and later of stone. Markets were held every week in the square.
Numbers: one, two, three, four, five, six, seven, eight, nine, ten, eleven, twelve, twenty, hundred,
thousand. 0 1 2 3 4 5 6 7 8 9 10 42 100 365 1024 2048. First, second, third, last. Yesterday, today,
tomorrow; morning, noon, evening, night; spring, summer, autumn, winter; north, south, east, west.
Good morning! How are you? I am fine, thank you, and you? Very well, thanks. Let us meet again next
week. Could you help me, please? Of course, I would be happy to help. Thank you very much for your time.
She opened the window and looked at the garden. Flowers of every colour grew between the trees: red
roses, yellow tulips, white lilies and purple violets. Birds were singing, bees were busy, and a cat was
sleeping in the shade under the old apple tree. It was a perfect afternoon for reading a good book.
def add(a, b): return a + b. for item in items: print(item). if value is None: raise ValueError("x").
{"name": "tandem", "version": 1, "tags": ["fast", "simple"]} <html><body>Hello, world!</body></html>
"""


@dataclass(frozen=True)
class TinySpec:
    """Shape and seed of a tiny model; defaults give a ~4M-parameter GQA Llama."""

    layers: int = 4
    hidden: int = 256
    heads: int = 8
    kv_heads: int = 4
    intermediate: int = 688
    max_positions: int = 4096
    arch: str = "llama"  # llama | qwen2 | mixtral | qwen2_moe
    experts: int = 4  # mixtral, qwen2_moe: routed experts per layer
    experts_per_token: int = 2
    expert_intermediate: int = 256  # qwen2_moe's routed expert width (mixtral's is `intermediate`)
    shared_intermediate: int = 512  # qwen2_moe's shared expert width
    tie_embeddings: bool = False
    seed: int = 0
    dtype: str = "float32"
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5


TINY_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
}


@lru_cache(maxsize=1)
def _tokenizer_json() -> str:
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte is encodable
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS.splitlines(), trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return tok.to_str()


def build_tokenizer() -> tokenizers.Tokenizer:
    """A byte-level BPE trained on the built-in corpus, with BOS/EOS and chat markers as special tokens."""
    return tokenizers.Tokenizer.from_str(_tokenizer_json())


def _special_id(tok: tokenizers.Tokenizer, token: str) -> int:
    token_id = tok.token_to_id(token)
    if token_id is None:
        raise ValueError(f"tokenizer lacks special token {token!r}")
    return token_id


def hf_config(spec: TinySpec, vocab_size: int, bos_id: int, eos_id: int) -> dict[str, Any]:
    """The `config.json` of a tiny model, with the keys transformers writes for this architecture."""
    if spec.hidden % spec.heads or spec.heads % spec.kv_heads:
        raise ValueError("hidden must divide by heads, and heads by kv_heads")
    if spec.arch not in TINY_ARCHITECTURES:
        raise ValueError(f"unknown arch {spec.arch!r}; use {', '.join(TINY_ARCHITECTURES)}")
    if spec.arch in ("mixtral", "qwen2_moe") and not 0 < spec.experts_per_token <= spec.experts:
        raise ValueError("experts_per_token must be between 1 and experts")
    config: dict[str, Any] = {
        "architectures": [TINY_ARCHITECTURES[spec.arch]],
        "model_type": spec.arch,
        "vocab_size": vocab_size,
        "hidden_size": spec.hidden,
        "intermediate_size": spec.intermediate,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv_heads,
        "head_dim": spec.hidden // spec.heads,
        "hidden_act": "silu",
        "max_position_embeddings": spec.max_positions,
        "initializer_range": 0.02,
        "rms_norm_eps": spec.rms_norm_eps,
        "rope_theta": spec.rope_theta,
        "rope_scaling": None,
        "attention_dropout": 0.0,
        "tie_word_embeddings": spec.tie_embeddings,
        "torch_dtype": spec.dtype,
        "use_cache": True,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
    }
    if spec.arch == "llama":
        config.update(attention_bias=False, mlp_bias=False, pretraining_tp=1)
    elif spec.arch == "mixtral":
        config.update(
            num_local_experts=spec.experts, num_experts_per_tok=spec.experts_per_token, sliding_window=None
        )
    else:
        config.update(use_sliding_window=False, sliding_window=None, max_window_layers=spec.layers)
    if spec.arch == "qwen2_moe":
        config.update(
            num_experts=spec.experts,
            num_experts_per_tok=spec.experts_per_token,
            moe_intermediate_size=spec.expert_intermediate,
            shared_expert_intermediate_size=spec.shared_intermediate,
            norm_topk_prob=False,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        )
    return config


def random_state_dict(
    config: ModelConfig, seed: int, dtype: str | torch.dtype = torch.float32, device: str = "cpu"
) -> dict[str, torch.Tensor]:
    """Seeded random weights: normal(0, 0.02) matrices and biases, norm weights near 1, on the CPU (drawn on
    `device`: a GPU draws a billion-parameter model in seconds, the CPU in minutes; the draws differ by
    device).

    Biases and norm weights are perturbed (HF starts them at 0 and 1) so a loader or model that drops
    them would change the logits and fail parity tests.
    """
    gen = torch.Generator(device=device).manual_seed(seed)
    state = {}
    for name, shape in expected_shapes(config).items():
        noise = torch.randn(shape, generator=gen, dtype=torch.float32, device=device) * 0.02
        state[name] = (1.0 + noise if name.endswith("norm.weight") else noise).to(parse_dtype(dtype)).cpu()
    return state


def write_safetensors(
    state: dict[str, torch.Tensor], model_dir: Path, shard_size: int | None = None
) -> list[Path]:
    """Save as `model.safetensors`, or as shards of at most `shard_size` bytes with an index file."""
    metadata = {"format": "pt"}
    if shard_size is None:
        path = model_dir / SINGLE_FILE
        save_file(state, str(path), metadata=metadata)
        return [path]
    shards: list[dict[str, torch.Tensor]] = [{}]
    used = 0
    for name, tensor in state.items():
        size = tensor.numel() * tensor.element_size()
        if shards[-1] and used + size > shard_size:
            shards.append({})
            used = 0
        shards[-1][name] = tensor
        used += size
    paths, weight_map = [], {}
    for i, shard in enumerate(shards, start=1):
        path = model_dir / f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(path), metadata=metadata)
        paths.append(path)
        weight_map.update(dict.fromkeys(shard, path.name))
    total = sum(t.numel() * t.element_size() for t in state.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (model_dir / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    return paths


def create_tiny_model(
    model_dir: str | Path, spec: TinySpec = TinySpec(), shard_size: int | None = None
) -> Path:
    """Write config, weights, tokenizer and generation config of a tiny model into `model_dir`."""
    root = Path(model_dir)
    root.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer()
    bos_id, eos_id, end_id = (_special_id(tok, t) for t in (BOS, EOS, "<|end|>"))
    config = hf_config(spec, tok.get_vocab_size(with_added_tokens=True), bos_id, eos_id)
    write_safetensors(random_state_dict(ModelConfig.from_hf(config), spec.seed, spec.dtype), root, shard_size)
    tok.save(str(root / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": EOS,
        "add_bos_token": True,
        "model_max_length": spec.max_positions,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    generation = {"bos_token_id": bos_id, "eos_token_id": [eos_id, end_id], "do_sample": False}
    for name, data in (
        ("config.json", config),
        ("tokenizer_config.json", tokenizer_config),
        ("generation_config.json", generation),
    ):
        (root / name).write_text(json.dumps(data, indent=2) + "\n")
    return root

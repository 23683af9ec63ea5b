"""Loading Hugging Face model directories: round trips, sharding, dtypes, and the errors users see."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from tandem.worker.devtools.tiny import TinySpec, create_tiny_model, random_state_dict
from tandem.worker.engine.loading import expected_shapes, load_checkpoint, load_state_dict, parse_dtype
from tandem.worker.hf.config import ModelConfig, ModelLoadError

SMALL = TinySpec(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=96, seed=3)


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_expected_shapes_follow_hf_llama_names_with_gqa():
    config = ModelConfig(
        vocab_size=100,
        hidden_size=64,
        intermediate_size=96,
        num_layers=2,
        num_heads=8,
        num_kv_heads=2,
        head_dim=16,
        max_position_embeddings=128,
    )
    shapes = expected_shapes(config)
    assert len(shapes) == 1 + 2 * 9 + 2
    assert shapes["model.embed_tokens.weight"] == (100, 64)
    assert shapes["model.layers.1.self_attn.q_proj.weight"] == (128, 64)
    assert shapes["model.layers.1.self_attn.k_proj.weight"] == (32, 64)
    assert shapes["model.layers.1.self_attn.v_proj.weight"] == (32, 64)
    assert shapes["model.layers.1.self_attn.o_proj.weight"] == (64, 128)
    assert shapes["model.layers.0.mlp.down_proj.weight"] == (64, 96)
    assert shapes["model.layers.0.post_attention_layernorm.weight"] == (64,)
    assert shapes["lm_head.weight"] == (100, 64)
    assert not any(name.endswith(".bias") for name in shapes)


def test_expected_shapes_with_qkv_bias_and_tied_embeddings():
    config = ModelConfig(
        vocab_size=100,
        hidden_size=64,
        intermediate_size=96,
        num_layers=1,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        max_position_embeddings=128,
        attention_bias=True,
        tie_word_embeddings=True,
    )
    shapes = expected_shapes(config)
    assert shapes["model.layers.0.self_attn.q_proj.bias"] == (64,)
    assert shapes["model.layers.0.self_attn.k_proj.bias"] == (32,)
    assert "model.layers.0.self_attn.o_proj.bias" not in shapes
    assert "lm_head.weight" not in shapes


def test_single_file_round_trips_exactly(tiny_model_dir):
    config, state = load_checkpoint(tiny_model_dir)
    assert config.architecture == "LlamaForCausalLM" and config.num_kv_heads < config.num_heads
    on_disk = load_file(str(tiny_model_dir / "model.safetensors"))
    assert list(state) == list(expected_shapes(config))
    for name, tensor in state.items():
        assert tensor.dtype == torch.float32
        assert torch.equal(tensor, on_disk[name]), name
    assert not torch.equal(
        state["model.layers.0.mlp.up_proj.weight"], state["model.layers.1.mlp.up_proj.weight"]
    )


def test_sharded_checkpoint_loads_the_same_tensors(tmp_path):
    single = create_tiny_model(tmp_path / "single", SMALL)
    sharded = create_tiny_model(tmp_path / "sharded", SMALL, shard_size=40_000)
    shards = sorted(sharded.glob("model-*-of-*.safetensors"))
    assert len(shards) >= 3 and not (sharded / "model.safetensors").exists()
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {p.name for p in shards}
    a, b = load_checkpoint(single)[1], load_checkpoint(sharded)[1]
    assert list(a) == list(b)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert all(torch.equal(a[k], v) for k, v in random_state_dict(load_checkpoint(single)[0], seed=3).items())


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_dtype_is_cast_on_load(tiny_model_dir, dtype):
    config = ModelConfig.from_dir(tiny_model_dir)
    full = load_state_dict(tiny_model_dir, config)
    cast = load_state_dict(tiny_model_dir, config, dtype)
    for name, tensor in cast.items():
        assert tensor.dtype == parse_dtype(dtype)
        assert torch.equal(tensor, full[name].to(parse_dtype(dtype)))


def test_bf16_checkpoint_loads_as_fp32(tmp_path):
    model_dir = create_tiny_model(tmp_path / "m", TinySpec(**{**SMALL.__dict__, "dtype": "bfloat16"}))
    config, state = load_checkpoint(model_dir, "fp32")
    raw = load_file(str(model_dir / "model.safetensors"))
    assert raw["model.norm.weight"].dtype == torch.bfloat16
    assert state["model.norm.weight"].dtype == torch.float32
    assert torch.equal(state["model.norm.weight"], raw["model.norm.weight"].float())


def test_qwen2_tied_checkpoint_has_biases_and_shares_lm_head(tmp_path):
    spec = TinySpec(**{**SMALL.__dict__, "arch": "qwen2", "tie_embeddings": True})
    model_dir = create_tiny_model(tmp_path / "q", spec, shard_size=50_000)
    config, state = load_checkpoint(model_dir)
    assert config.attention_bias and config.tie_word_embeddings
    assert (
        "lm_head.weight"
        not in json.loads((model_dir / "model.safetensors.index.json").read_text())["weight_map"]
    )
    assert state["lm_head.weight"] is state["model.embed_tokens.weight"]
    assert state["model.layers.1.self_attn.v_proj.bias"].abs().sum() > 0


def test_dtype_names_are_validated():
    assert parse_dtype("bfloat16") is torch.bfloat16
    with pytest.raises(ValueError, match="int8"):
        parse_dtype("int8")


def test_missing_config_names_the_file(tmp_path, tiny_model_dir):
    model_dir = _copy(tiny_model_dir, tmp_path / "m")
    (model_dir / "config.json").unlink()
    with pytest.raises(ModelLoadError, match="config.json"):
        load_checkpoint(model_dir)


def test_unsupported_architecture_is_named(tmp_path, tiny_model_dir):
    model_dir = _copy(tiny_model_dir, tmp_path / "m")
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ModelLoadError, match="GPT2LMHeadModel"):
        load_checkpoint(model_dir)


def test_missing_weights_name_the_expected_files(tmp_path, tiny_model_dir):
    model_dir = _copy(tiny_model_dir, tmp_path / "m")
    (model_dir / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match=r"model\.safetensors"):
        load_checkpoint(model_dir)
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_state_dict(tmp_path / "nowhere", ModelConfig.from_dir(tiny_model_dir))


def test_missing_shard_is_named(tmp_path):
    model_dir = create_tiny_model(tmp_path / "m", SMALL, shard_size=40_000)
    victim = sorted(model_dir.glob("model-*.safetensors"))[1]
    victim.unlink()
    with pytest.raises(ModelLoadError, match=victim.name):
        load_checkpoint(model_dir)


def _rewrite(model_dir, edit) -> None:
    path = model_dir / "model.safetensors"
    state = load_file(str(path))
    edit(state)
    save_file(state, str(path), metadata={"format": "pt"})


def test_missing_tensor_is_named(tmp_path):
    model_dir = create_tiny_model(tmp_path / "m", SMALL)
    _rewrite(model_dir, lambda s: s.pop("model.layers.1.mlp.gate_proj.weight"))
    with pytest.raises(ModelLoadError, match=r"missing tensor model\.layers\.1\.mlp\.gate_proj\.weight"):
        load_checkpoint(model_dir)


def test_shape_mismatch_is_named(tmp_path):
    model_dir = create_tiny_model(tmp_path / "m", SMALL)

    def shrink(state):
        state["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(16, 64)

    _rewrite(model_dir, shrink)
    with pytest.raises(
        ModelLoadError,
        match=r"model\.layers\.0\.self_attn\.k_proj\.weight has shape \[16, 64\], expected \[32, 64\]",
    ):
        load_checkpoint(model_dir)


def test_extra_tensors_are_ignored(tmp_path):
    model_dir = create_tiny_model(tmp_path / "m", SMALL)
    _rewrite(model_dir, lambda s: s.update({"model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(8)}))
    config, state = load_checkpoint(model_dir)
    assert list(state) == list(expected_shapes(config))


def _hf_state(model_dir):
    import transformers  # a test dependency; imported here because it is slow to import

    hf = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    return hf, hf.state_dict()


def test_transformers_loads_our_directory_with_the_same_weights(tiny_model_dir):
    hf, hf_state = _hf_state(tiny_model_dir)
    assert type(hf).__name__ == "LlamaForCausalLM"
    _, ours = load_checkpoint(tiny_model_dir)
    hf_state = {k: v for k, v in hf_state.items() if "rotary_emb" not in k}
    assert set(hf_state) == set(ours)
    assert all(torch.equal(hf_state[k], ours[k]) for k in ours)


def test_transformers_loads_our_sharded_tied_qwen2(tmp_path):
    spec = TinySpec(**{**SMALL.__dict__, "arch": "qwen2", "tie_embeddings": True})
    model_dir = create_tiny_model(tmp_path / "q", spec, shard_size=50_000)
    hf, hf_state = _hf_state(model_dir)
    assert type(hf).__name__ == "Qwen2ForCausalLM"
    _, ours = load_checkpoint(model_dir)
    hf_state = {k: v for k, v in hf_state.items() if "rotary_emb" not in k}
    assert set(hf_state) == set(ours)
    assert all(torch.equal(hf_state[k], ours[k]) for k in ours)


def test_malformed_config_json_names_the_problem(tmp_path):
    from tandem.worker.hf.config import ModelConfig, ModelLoadError

    (tmp_path / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "vocab_size": 10}')
    with pytest.raises(ModelLoadError, match="missing required key"):
        ModelConfig.from_dir(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="not valid JSON"):
        ModelConfig.from_dir(tmp_path)

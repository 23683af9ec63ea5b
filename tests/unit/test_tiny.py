"""`tandem model create-tiny`: seeded, Hugging Face-shaped output through the command line."""

from __future__ import annotations

import json

import pytest

from tandem.cli import main as tandem_main
from tandem.worker.devtools.model_cli import parse_size
from tandem.worker.engine.loading import load_checkpoint

ARGS = ["--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--intermediate", "96"]


def test_create_tiny_through_the_tandem_command(tmp_path, capsys):
    assert tandem_main(["model", "create-tiny", str(tmp_path / "m"), *ARGS, "--seed", "7"]) == 0
    assert "wrote llama model" in capsys.readouterr().out
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["torch_dtype"] == "float32"
    assert config["num_key_value_heads"] == 2 and config["num_hidden_layers"] == 2
    tok_config = json.loads((tmp_path / "m" / "tokenizer_config.json").read_text())
    assert tok_config["bos_token"] == "<s>" and "chat_template" in tok_config
    assert 1000 <= config["vocab_size"] <= 2000


def test_same_seed_same_files_other_seed_other_weights(tmp_path):
    for name, seed in (("a", "1"), ("b", "1"), ("c", "2")):
        assert tandem_main(["model", "create-tiny", str(tmp_path / name), *ARGS, "--seed", seed]) == 0
    for file in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (tmp_path / "a" / file).read_bytes() == (tmp_path / "b" / file).read_bytes(), file
    assert (tmp_path / "a" / "model.safetensors").read_bytes() != (
        tmp_path / "c" / "model.safetensors"
    ).read_bytes()


def test_sharded_qwen2_bf16_options(tmp_path):
    argv = ["model", "create-tiny", str(tmp_path / "q"), *ARGS, "--arch", "qwen2", "--dtype", "bfloat16"]
    assert tandem_main([*argv, "--shard-size", "20KiB", "--tie-embeddings"]) == 0
    assert len(list((tmp_path / "q").glob("model-*-of-*.safetensors"))) > 2
    config, state = load_checkpoint(tmp_path / "q", "bf16")
    assert config.architecture == "Qwen2ForCausalLM" and config.tie_word_embeddings
    assert "model.layers.0.self_attn.q_proj.bias" in state


def test_bad_shapes_are_refused(tmp_path, capsys):
    assert tandem_main(["model", "create-tiny", str(tmp_path / "x"), "--hidden", "100", "--heads", "8"]) == 2
    assert "divide" in capsys.readouterr().out


def test_parse_size():
    assert parse_size("4096") == 4096 and parse_size("2MiB") == 2 * 2**20 and parse_size("1GB") == 10**9
    with pytest.raises(Exception, match="not a size"):
        parse_size("lots")

"""The file filter of `tandem fetch-model`: safetensors weights the loader reads, config and tokenizer; never
the other formats' copies of the same weights, and nothing but config and tokenizer for a router."""

from __future__ import annotations

import json

import pytest

from tandem.worker.hf.files import NoWeights, Part, needs_index, select

REPO = [
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "model.safetensors",
    "pytorch_model.bin",
    "tf_model.h5",
    "flax_model.msgpack",
    "original/consolidated.pth",
    "README.md",
    ".gitattributes",
    "onnx/model.onnx",
]


def test_worker_gets_the_safetensors_weights_config_and_tokenizer_only():
    assert select(REPO, Part.weights) == sorted(
        [
            "config.json",
            "generation_config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "special_tokens_map.json",
            "model.safetensors",
        ]
    )


def test_router_gets_no_weights():
    chosen = select(REPO, Part.tokenizer)
    assert "model.safetensors" not in chosen and "config.json" in chosen and "tokenizer.json" in chosen


def test_sharded_weights_are_the_files_the_index_names_not_a_second_export():
    listing = [
        "config.json",
        "tokenizer.json",
        "model.safetensors.index.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "consolidated.safetensors",
        "pytorch_model-00001-of-00002.bin",
    ]
    index = json.dumps(
        {
            "metadata": {},
            "weight_map": {
                "a": "model-00001-of-00002.safetensors",
                "b": "model-00002-of-00002.safetensors",
                "c": "model-00001-of-00002.safetensors",
            },
        }
    )
    assert needs_index(listing)
    assert select(listing, Part.weights, index) == sorted(
        [
            "config.json",
            "tokenizer.json",
            "model.safetensors.index.json",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
        ]
    )
    with pytest.raises(ValueError, match="read the index first"):
        select(listing, Part.weights)


def test_an_index_naming_missing_shards_or_a_repository_without_safetensors_is_refused_with_the_reason():
    with pytest.raises(NoWeights, match="model-2.safetensors"):
        select(
            ["model.safetensors.index.json", "model-1.safetensors"],
            Part.weights,
            json.dumps({"weight_map": {"a": "model-1.safetensors", "b": "model-2.safetensors"}}),
        )
    with pytest.raises(NoWeights, match="pytorch_model.bin"):
        select(["config.json", "pytorch_model.bin"], Part.weights)
    with pytest.raises(NoWeights, match="not a safetensors index"):
        select(["model.safetensors.index.json"], Part.weights, "[]")
    assert select(["config.json", "pytorch_model.bin"], Part.tokenizer) == [
        "config.json"
    ]  # a router needs none

"""Which files of a Hugging Face repository a pod needs: the safetensors weights the loader reads (never the
.bin/.pt/.msgpack/.h5 copies of the same weights, nor a second safetensors export the index does not name),
the config and the tokenizer. A router needs only the config and the tokenizer."""

from __future__ import annotations

import json
from collections.abc import Iterable
from enum import StrEnum

SINGLE_WEIGHTS = "model.safetensors"  # what worker/engine/loading.py reads without an index
WEIGHTS_INDEX = "model.safetensors.index.json"
# Read by worker/hf/config.py and worker/hf/tokenizer.py; the rest of a repository is left on the Hub.
CONFIG_AND_TOKENIZER = frozenset(
    {
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "chat_template.jinja",
        "chat_template.json",
    }
)


class Part(StrEnum):
    """What a pod fetches: a worker the weights (with the config and the tokenizer), a router the rest."""

    weights = "weights"
    tokenizer = "tokenizer"


class NoWeights(ValueError):
    """The repository holds no safetensors weights the loader can read."""


def config_and_tokenizer(listing: Iterable[str]) -> list[str]:
    """The top-level config and tokenizer files the repository has."""
    return sorted(f for f in listing if f in CONFIG_AND_TOKENIZER)


def needs_index(listing: Iterable[str]) -> bool:
    """Whether the weights are sharded: the index names the shards, so it is read before they are chosen."""
    return WEIGHTS_INDEX in set(listing)


def shards(index_text: str) -> list[str]:
    """The safetensors files a `model.safetensors.index.json` maps tensors to."""
    try:
        weight_map = json.loads(index_text)["weight_map"]
    except (ValueError, KeyError, TypeError) as e:
        raise NoWeights(f"{WEIGHTS_INDEX} is not a safetensors index ({e})") from None
    return sorted({str(f) for f in weight_map.values()})


def select(listing: Iterable[str], part: Part, index_text: str | None = None) -> list[str]:
    """The files to download for `part`, given the repository's file list (and the index's text when
    `needs_index`). Raises NoWeights when a worker would find nothing to load."""
    files = list(listing)
    chosen = config_and_tokenizer(files)
    if part == Part.tokenizer:
        return chosen
    present = set(files)
    if WEIGHTS_INDEX in present:
        if index_text is None:
            raise ValueError("the weights are sharded: read the index first")
        missing = [s for s in shards(index_text) if s not in present]
        if missing:
            raise NoWeights(f"{WEIGHTS_INDEX} names files the repository does not have: {', '.join(missing)}")
        return sorted({*chosen, WEIGHTS_INDEX, *shards(index_text)})
    if SINGLE_WEIGHTS in present:
        return sorted({*chosen, SINGLE_WEIGHTS})
    others = sorted(
        f for f in files if f.endswith((".bin", ".pt", ".pth", ".msgpack", ".h5", ".safetensors"))
    )
    raise NoWeights(
        f"no {SINGLE_WEIGHTS} or {WEIGHTS_INDEX} in the repository (it has {others or 'no weights'}); "
        "only safetensors checkpoints are loaded"
    )

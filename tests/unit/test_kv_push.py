"""The prefill side's per-layer KV read: the CPU path is the cache's own read; on CUDA it runs on a copy
stream into pinned host memory and holds the same bytes once its event has fired."""

from __future__ import annotations

import pytest
import torch

from tandem.worker.engine.layers.kv_cache import KvCache
from tandem.worker.hf.config import ModelConfig
from tandem.worker.serve.kv_push import LayerKvReader

CONFIG = ModelConfig.from_hf(
    dict(
        architectures=["LlamaForCausalLM"],
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
)


def _filled(device: str) -> KvCache:
    kv = KvCache(CONFIG, num_blocks=12, block_size=4, dtype=torch.float32, device=device)
    for layer in range(kv.num_layers):
        kv.k[layer].copy_(torch.randn(kv.k[layer].shape))
        kv.v[layer].copy_(torch.randn(kv.v[layer].shape))
    return kv


def test_cpu_read_is_the_caches_own():
    kv = _filled("cpu")
    k, v, ready = LayerKvReader(kv).read(1, [7, 2, 9], to_host=True)
    want_k, want_v = kv.read_blocks(1, [7, 2, 9])
    assert ready is None and torch.equal(k, want_k) and torch.equal(v, want_v)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the copy stream exists only on CUDA")
@pytest.mark.parametrize("to_host", [True, False])
def test_cuda_read_on_its_stream(to_host):
    kv = _filled("cuda")
    k, v, ready = LayerKvReader(kv).read(0, [3, 11], to_host)
    assert ready is not None
    ready.synchronize()
    assert k.is_pinned() if to_host else k.is_cuda
    want_k, want_v = kv.read_blocks(0, [3, 11])
    assert torch.equal(k.cpu(), want_k.cpu()) and torch.equal(v.cpu(), want_v.cpu())

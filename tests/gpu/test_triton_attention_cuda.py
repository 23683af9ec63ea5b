"""The triton attention backend compiled for the GPU: the kernel against sdpa at real head sizes and long
contexts (split-K), and an engine whose decode step is captured as CUDA graphs against the sdpa engine."""

from __future__ import annotations

import pytest
import torch

from tandem.worker.engine.layers.attention import AttentionBatch, attend
from tandem.worker.engine.layers.kv_int8 import pack
from tandem.worker.engine.loading import load_model
from tandem.worker.engine.runner.compiled import warm_up
from tandem.worker.engine.runner.engine import Engine, EngineConfig
from tests.decode_parity import requests, run_lockstep

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (compiled Triton kernels)"),
]

PAGE = 16


@pytest.mark.parametrize("int8", [False, True], ids=["bf16", "int8"])
@pytest.mark.parametrize("splits", [None, 1, 8])
def test_decode_kernel_matches_sdpa_on_long_contexts(int8, splits):
    from tandem.worker.engine.layers.triton_paged import paged_attention

    g = torch.Generator().manual_seed(0)
    kvh, group, d = 8, 4, 128
    contexts = [1, 17, 511, 4096, 2049]
    need = [-(-c // PAGE) for c in contexts]
    pool = sum(need) + 3
    order = torch.randperm(pool, generator=g).tolist()
    tables, at = [], 0
    for n in need:
        tables.append(order[at : at + n])
        at += n
    k = torch.randn(pool, PAGE, kvh, d, generator=g).to("cuda", torch.bfloat16)
    v = torch.randn(pool, PAGE, kvh, d, generator=g).to("cuda", torch.bfloat16)
    if int8:
        k, v = pack(k), pack(v)
    q = torch.randn(len(contexts), kvh * group, d, generator=g).to("cuda", torch.bfloat16)
    slots = torch.tensor(
        [t[(c - 1) // PAGE] * PAGE + (c - 1) % PAGE for t, c in zip(tables, contexts, strict=True)]
    )
    ones = [1] * len(contexts)
    ref_batch = AttentionBatch(ones, contexts, tables, slots.cuda(), PAGE, "sdpa")
    unused = torch.zeros(len(contexts), kvh, d, dtype=q.dtype, device="cuda")
    ref = attend(q, unused, unused, k, v, ref_batch, 0.1)
    batch = AttentionBatch(ones, contexts, tables, slots.cuda(), PAGE, "triton")
    out = paged_attention(q, k, v, batch.pages, batch.tile_layout(group), 0.1, splits=splits)
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "int8"])
def test_cuda_graphs_on_the_triton_backend_match_the_sdpa_engine(tiny_model_dir, kv_cache_dtype):
    model = load_model(tiny_model_dir, "float32", "cuda")
    config = dict(
        block_size=4,
        num_kv_blocks=128,
        max_running_sequences=8,
        max_model_len=64,
        kv_cache_dtype=kv_cache_dtype,
    )
    sdpa = Engine(model, EngineConfig(**config))
    triton = Engine(model, EngineConfig(**config, attention="triton", decode_step="cudaGraphs"))
    warm_up(triton)
    with torch.compiler.set_stance("fail_on_recompile"):
        run = run_lockstep(sdpa, triton, requests(9, longest=12), late=3)
    assert run.tokens[0] == run.tokens[1]
    assert run.max_logit_diff < 1e-3, run.max_logit_diff  # fp32: the kernel's dot products are IEEE fp32
    assert run.static_steps > 10 and run.general_steps > 3
    assert triton.blocks.num_used == 0

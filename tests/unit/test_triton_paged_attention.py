"""The Triton paged-attention kernel against the sdpa reference, on the CPU through Triton's interpreter.

Small random caches whose sequences own scattered pages: ragged contexts ending inside a page, GQA ratios
1/4/8, head_dim 64 and 128, one split and several (split-K with the log-sum-exp merge), float32 and bfloat16,
the 8-bit cache; the general step (decodes and a prompt chunk over a cached prefix) and the static decode
step's rows (new key not in the cache yet, through the custom op). Shapes stay tiny: the interpreter is slow.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available() and "triton" not in sys.modules:
    # Triton reads this as it defines kernels, its own library's included: before anything imports it. On a
    # host without CUDA nothing else runs Triton, so it stays on for the rest of the process.
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton", reason="triton is not installed (it comes with torch's Linux wheels)")

from tandem.worker.engine.layers import triton_paged as tp  # noqa: E402
from tandem.worker.engine.layers.attention import AttentionBatch, attend, check_backend  # noqa: E402
from tandem.worker.engine.layers.kv_int8 import pack  # noqa: E402
from tandem.worker.engine.layers.static_decode import StaticDecodeBatch, as_stored, static_decode_attention  # noqa: E402

pytestmark = pytest.mark.skipif(
    not tp.interpreted(),
    reason="Triton's interpreter is off: this host has CUDA (tests/gpu/test_triton_attention_cuda.py runs "
    "the kernel there), or triton was imported before this module could turn the interpreter on",
)


PAGE = 8
POOL = 24
SCALE = 0.2


def _cache(
    kvh: int, d: int, dtype: torch.dtype, int8: bool, g: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    k = torch.randn(POOL, PAGE, kvh, d, generator=g).to(dtype)
    v = torch.randn(POOL, PAGE, kvh, d, generator=g).to(dtype)
    return (pack(k), pack(v)) if int8 else (k, v)


def _tables(context_lens: list[int], g: torch.Generator) -> list[list[int]]:
    """Scattered, distinct pages for each sequence."""
    order = torch.randperm(POOL, generator=g).tolist()
    tables, at = [], 0
    for ctx in context_lens:
        n = -(-ctx // PAGE)
        tables.append(order[at : at + n])
        at += n
    return tables


def _batch(
    query_lens: list[int], context_lens: list[int], tables: list[list[int]], backend: str
) -> AttentionBatch:
    slots = [
        t[p // PAGE] * PAGE + p % PAGE
        for q, c, t in zip(query_lens, context_lens, tables, strict=True)
        for p in range(c - q, c)
    ]
    return AttentionBatch(query_lens, context_lens, tables, torch.tensor(slots), PAGE, backend)


def _both(q, k_cache, v_cache, query_lens, context_lens, tables, splits=None):
    """(triton, sdpa) outputs of one general step; `splits` forces the split count."""
    kvh, d = k_cache.shape[2], q.shape[2]
    unused = torch.zeros(
        q.shape[0], kvh, d, dtype=q.dtype
    )  # the reference reads the cache unless a prompt is fresh
    ref = attend(q, unused, unused, k_cache, v_cache, _batch(query_lens, context_lens, tables, "sdpa"), SCALE)
    batch = _batch(query_lens, context_lens, tables, "triton")
    layout = batch.tile_layout(q.shape[1] // kvh)
    out = tp.paged_attention(q, k_cache, v_cache, batch.pages, layout, SCALE, splits=splits)
    return out, ref


@pytest.mark.parametrize("splits", [1, 4])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_decode_rows_match_sdpa(group, head_dim, splits):
    g = torch.Generator().manual_seed(group * 1000 + head_dim + splits)
    kvh = 2 if group < 8 else 1
    context_lens = [1, 8, 13, 37]  # one key; a full page; partial last pages; several pages
    k_cache, v_cache = _cache(kvh, head_dim, torch.float32, False, g)
    q = torch.randn(len(context_lens), kvh * group, head_dim, generator=g)
    out, ref = _both(
        q, k_cache, v_cache, [1] * len(context_lens), context_lens, _tables(context_lens, g), splits
    )
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("int8", [False, True], ids=["model-dtype", "int8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_dtypes_and_the_8_bit_cache_match_sdpa(dtype, int8):
    g = torch.Generator().manual_seed(7)
    kvh, group, d = 2, 4, 64
    context_lens = [5, 30, 17]
    k_cache, v_cache = _cache(kvh, d, dtype, int8, g)
    q = torch.randn(len(context_lens), kvh * group, d, generator=g).to(dtype)
    tol = (
        2e-5 if dtype == torch.float32 else 2e-2
    )  # bf16: the reference rounds P and the unpacked pages to bf16
    for splits in (1, 2):
        out, ref = _both(q, k_cache, v_cache, [1] * 3, context_lens, _tables(context_lens, g), splits)
        assert out.dtype == dtype
        torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)


def test_a_prompt_chunk_over_a_cached_prefix_with_decodes_matches_sdpa():
    """One mixed step: a chunk of 21 queries after 12 cached tokens (causal within the chunk), a fresh prompt
    of 6, and two decodes; GQA 4 and the 8-bit cache, split and not."""
    g = torch.Generator().manual_seed(3)
    kvh, group, d = 2, 4, 64
    query_lens, context_lens = [21, 6, 1, 1], [33, 6, 19, 1]
    tables = _tables(context_lens, g)
    for int8 in (False, True):
        k_cache, v_cache = _cache(kvh, d, torch.float32, int8, g)
        q = torch.randn(sum(query_lens), kvh * group, d, generator=g)
        for splits in (1, 2):
            out, ref = _both(q, k_cache, v_cache, query_lens, context_lens, tables, splits)
            torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("int8", [False, True], ids=["model-dtype", "int8"])
def test_static_decode_rows_with_their_new_key_match_sdpa(int8):
    """The static step's layout: padded table, cache without the new token, its key passed beside (through the
    custom op the compiled step calls); and split 4 ways, where only the first split holds the new key."""
    g = torch.Generator().manual_seed(11)
    kvh, group, d, width = 2, 8, 64, 8  # 64 keys of table
    context_lens = torch.tensor([1, 9, 40, 64])  # each includes its new token; row 0 has only that
    k_cache, v_cache = _cache(kvh, d, torch.float32, int8, g)
    pages = _tables([max(int(c) - 1, 1) for c in context_lens], g)
    table = torch.tensor([p + [POOL - 1] * (width - len(p)) for p in pages])
    qkv = torch.randn(
        4, (group + 1) * kvh, d, generator=g
    )  # the model's views: q and k of one tensor, v another
    q, k_new = qkv[:, : group * kvh], qkv[:, group * kvh :]
    v_new = torch.randn(4, kvh, d, generator=g)
    outs = {}
    for backend in ("sdpa", "triton"):
        batch = StaticDecodeBatch(torch.zeros(4, dtype=torch.long), table, context_lens, PAGE, backend)
        outs[backend] = static_decode_attention(q, k_new, v_new, k_cache, v_cache, batch, SCALE)
    torch.testing.assert_close(outs["triton"], outs["sdpa"], atol=2e-5, rtol=1e-5)
    k_stored, v_stored = as_stored(k_new, k_cache), as_stored(v_new, v_cache)
    split = tp.paged_decode_attention(
        q, k_cache, v_cache, table, context_lens - 1, SCALE, k_stored, v_stored, 4
    )
    torch.testing.assert_close(split, outs["sdpa"], atol=2e-5, rtol=1e-5)


def test_an_engine_on_the_triton_backend_decodes_as_the_sdpa_one(tmp_path):
    """Through the engine: prompts (one chunked over its cached prefix), batched decodes on the general path
    and in the static decode step (the custom op), against an sdpa engine, step by step (the 8-bit cache's
    reads are checked above, kernel by kernel)."""
    from tandem.worker.devtools.tiny import TinySpec, create_tiny_model
    from tandem.worker.engine.loading import load_model
    from tandem.worker.engine.runner.engine import Engine, EngineConfig
    from tests.decode_parity import requests, run_lockstep, static_engine

    model = load_model(create_tiny_model(tmp_path, TinySpec(layers=1, seed=2)))  # 8 heads over 4 KV heads
    small = dict(
        block_size=4, num_kv_blocks=64, max_running_sequences=4, max_model_len=32, prefill_chunk_tokens=6
    )
    sdpa = Engine(model, EngineConfig(**small))
    triton = static_engine(model, compile=False, attention="triton", **small)
    run = run_lockstep(sdpa, triton, requests(3, seed=5, longest=11), late=1)
    assert run.tokens[0] == run.tokens[1] and run.static_steps > 3 and run.general_steps >= 2
    assert run.max_logit_diff < 1e-4, run.max_logit_diff


def test_the_split_count_comes_from_shapes_and_fills_the_gpu():
    assert tp.num_splits(programs=512, max_keys=8192) == 1  # enough programs already
    assert tp.num_splits(programs=8, max_keys=128) == 1  # too short to split
    assert tp.num_splits(programs=8, max_keys=1024) == 8  # one row: splits of 128 keys
    assert tp.num_splits(programs=8, max_keys=1 << 20) == 32  # capped by the program target
    assert tp.num_splits(programs=64, max_keys=4096) == 4
    with pytest.raises(ValueError, match="power of two"):
        q = torch.zeros(1, 1, 64)
        tp.paged_decode_attention(
            q,
            torch.zeros(1, PAGE, 1, 64),
            torch.zeros(1, PAGE, 1, 64),
            torch.zeros(1, 1, dtype=torch.long),
            torch.ones(1),
            SCALE,
            splits=3,
        )


def test_the_backend_is_refused_off_cuda_without_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="needs a CUDA device"):
        check_backend("triton", torch.device("cpu"))
    check_backend("sdpa", torch.device("cpu"))
    with pytest.raises(ValueError, match="one of sdpa, flex, triton"):
        check_backend("paged", torch.device("cpu"))


def test_a_worker_on_the_cpu_refuses_the_backend_before_loading(monkeypatch, capsys):
    from tandem.worker.serve.main import main

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    argv = ["--role", "decode", "--model-dir", "/nonexistent", "--device", "cpu", "--attention", "triton"]
    assert main(argv) == 2
    assert "triton attention backend needs a CUDA device" in capsys.readouterr().err


COMPILE_FOR_H200 = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from tandem.worker.engine.layers import triton_paged as tp

POINTERS = {"Table": "i64", "KvLens": "i64", "QLens": "i32", "QStarts": "i32", "TileSeq": "i32",
            "TileQ0": "i32", "PartOut": "fp32", "PartLse": "fp32"}
CASES = [("bf16", False, 1, True, 0, 128, 4), ("bf16", True, 4, True, 1, 64, 8),
         ("bf16", True, 2, False, 0, 128, 6), ("fp32", False, 1, False, 0, 64, 1)]
for dtype, int8, splits, one, new, d, group in CASES:
    kv = "i8" if int8 else dtype
    types = {**{n: dtype for n in ("Q", "KNew", "VNew", "Out")}, "K": kv, "V": kv,
             "KScale": "fp32" if int8 else dtype, "VScale": "fp32" if int8 else dtype, **POINTERS}
    consts = dict(GROUP=group, HEAD_DIM=d, BLOCK_D=d, BLOCK_M=16 if one else 64, BLOCK_N=tp.BLOCK_N, PAGE=16,
                  SPLIT_KEYS=256, SPLITS=splits, ONE_QUERY=one, HAS_NEW=new, INT8=int8, IEEE=dtype == "fp32",
                  DOT_F32=False)
    sig = {n: "*" + types[n] if n in types else "fp32" if n == "qk_scale" else "i32"
           for n in tp._paged_attention.arg_names}
    triton.compile(ASTSource(tp._paged_attention, {**sig, **dict.fromkeys(consts, "constexpr")}, consts),
                   target=GPUTarget("cuda", 90, 32))
consts = dict(HEAD_DIM=128, BLOCK_D=128, SPLITS=8)
sig = {n: "*fp32" if n.startswith("Part") else "*bf16" if n == "Out" else "i32"
       for n in tp._merge_splits.arg_names}
triton.compile(ASTSource(tp._merge_splits, {**sig, **dict.fromkeys(consts, "constexpr")}, consts),
               target=GPUTarget("cuda", 90, 32))
print("compiled")
"""


def test_the_kernels_compile_for_an_h200_without_one(tmp_path):
    """The interpreter does not compile: Triton's own compiler and its bundled ptxas build the kernels for
    sm_90 (an H200) here, decode and chunk tiles, both caches, split and not, and the merge."""
    import subprocess

    import triton

    if not (Path(triton.__file__).parent / "backends/nvidia/bin/ptxas").exists():
        pytest.skip("this triton has no bundled ptxas to compile for an NVIDIA target")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path), TRITON_DEFAULT_FP_FUSION="1")
    done = subprocess.run(
        [sys.executable, "-c", COMPILE_FOR_H200], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and "compiled" in done.stdout, done.stderr[-3000:]

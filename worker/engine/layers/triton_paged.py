"""Paged attention in Triton that reads the KV cache in place: the block table is an input, nothing is
gathered.

One kernel serves decode rows and prompt chunks over a cached prefix. A program owns one query tile of one
sequence and one KV head: its rows are (query, head of the group) pairs, so the query heads of a KV group
share each K and V tile it loads, and `tl.dot` multiplies the [rows, head_dim] query tile against it. Each
key's page comes from the block table (`table[seq, key // page]`), and keys past the context or after a
row's own position (causal) are masked. Long contexts split over `splits` programs per tile (split-K); a
small second kernel merges their partial results by log-sum-exp. One split writes the output directly.

The 8-bit cache (kv_int8: int8 values then a float32 scale per token and head) reads through the same
kernel: the int8 values enter the dot products as they are and the scales multiply the scores (keys) and
the probabilities (values), in registers.

Graph-capturable: the grid and every compile-time constant come from tensor shapes (the table's width fixes
the split count), never from values on the device, so a captured decode step replays it. The static decode
step's cache does not hold its new token yet: `k_new`/`v_new` give each row one more key, the first split
starts its running softmax from it.

Which backend the engine uses by default (sdpa, flex or this one) awaits a measurement on the GPU; on the CPU
this runs only under Triton's interpreter (`TRITON_INTERPRET=1`, set before triton is first imported: its own
library functions are wrapped then): tests.
The interpreter's `tl.dot` misreads bfloat16 and float16 operands, so there the dot products run in float32
(the loads, the 8-bit unpacking, masks and merges are the GPU's code).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
BLOCK_N = 32  # keys per inner tile
DECODE_ROWS = 16  # the smallest query tile tl.dot takes
CHUNK_ROWS = 64  # query tile of a prompt chunk
SPLIT_TARGET_PROGRAMS = 256  # split long contexts until about this many programs run (an H200 has 132 SMs)
MIN_SPLIT_KEYS = 128  # a split reads at least this many keys


def interpreted() -> bool:
    """Whether Triton runs kernels on the CPU through its interpreter (read when a kernel is defined)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _pow2(n: int, at_least: int = 1) -> int:
    return max(at_least, 1 << (n - 1).bit_length())


def num_splits(programs: int, max_keys: int) -> int:
    """How many splits of the context each (tile, KV head) gets: enough programs to fill the GPU, each split
    at least MIN_SPLIT_KEYS keys; a power of two, from shapes only (fixed for a captured bucket)."""
    want = max(1, SPLIT_TARGET_PROGRAMS // max(programs, 1))
    most = max(1, max_keys // MIN_SPLIT_KEYS)
    return _pow2(min(want, most)) if min(want, most) > 1 else 1


@triton.jit
def _paged_attention(
    Q,
    K,
    V,
    KScale,
    VScale,
    Table,
    KvLens,
    QLens,
    QStarts,
    TileSeq,
    TileQ0,
    KNew,
    VNew,
    Out,
    PartOut,
    PartLse,
    stride_qt,
    stride_qh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_sb,
    stride_ss,
    stride_sh,
    stride_tb,
    stride_knt,
    stride_knh,
    stride_vnt,
    stride_vnh,
    stride_ot,
    stride_oh,
    stride_pt,
    stride_ph,
    stride_ps,
    qk_scale,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGE: tl.constexpr,
    SPLIT_KEYS: tl.constexpr,
    SPLITS: tl.constexpr,
    ONE_QUERY: tl.constexpr,
    HAS_NEW: tl.constexpr,
    INT8: tl.constexpr,
    IEEE: tl.constexpr,
    DOT_F32: tl.constexpr,
):
    tile = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    if ONE_QUERY:  # a decode batch: tile i is sequence i, its one query is flat token i
        seq = tile
        q0 = 0
        q_len = 1
        q_start = tile
    else:
        seq = tl.load(TileSeq + tile)
        q0 = tl.load(TileQ0 + tile)
        q_len = tl.load(QLens + seq).to(tl.int32)
        q_start = tl.load(QStarts + seq).to(tl.int32)
    kv_len = tl.load(KvLens + seq).to(tl.int32)  # keys in the cache this sequence attends to

    rows = tl.arange(0, BLOCK_M)
    qi = q0 + rows // GROUP  # query of each row, within its sequence
    head = kvh * GROUP + rows % GROUP
    row_ok = (rows < (BLOCK_M // GROUP) * GROUP) & (qi < q_len)
    q_pos = kv_len - q_len + HAS_NEW + qi  # each row's position: it sees keys at or before it
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    q = tl.load(
        Q + (q_start + qi)[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    if DOT_F32:
        q = q.to(tl.float32)
    dot_dtype = q.dtype

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    if HAS_NEW:  # the row's own key and value, not in the cache yet: the first split starts from it
        k_new = tl.load(KNew + seq * stride_knt + kvh * stride_knh + d, mask=d_ok, other=0.0).to(tl.float32)
        v_new = tl.load(VNew + seq * stride_vnt + kvh * stride_vnh + d, mask=d_ok, other=0.0).to(tl.float32)
        s_new = tl.sum(q.to(tl.float32) * k_new[None, :], axis=1) * qk_scale
        first = split == 0
        m = tl.where(first, s_new, m)
        l_sum = tl.where(first, 1.0, l_sum)
        acc = tl.where(first, v_new[None, :] + acc, acc)

    last_pos = kv_len - q_len + HAS_NEW + tl.minimum(q0 + BLOCK_M // GROUP, q_len) - 1
    lo = split * SPLIT_KEYS
    hi = tl.minimum(tl.minimum(lo + SPLIT_KEYS, kv_len), last_pos + 1)
    cols = tl.arange(0, BLOCK_N)
    for start in range(lo, hi, BLOCK_N):
        key = start + cols
        key_ok = key < hi
        page = tl.load(Table + seq * stride_tb + key // PAGE, mask=key_ok, other=0)
        slot = page.to(tl.int64) * stride_kb + (key % PAGE) * stride_ks + kvh * stride_kh
        kv_mask = key_ok[:, None] & d_ok[None, :]
        k = tl.load(K + slot[:, None] + d[None, :], mask=kv_mask, other=0)
        v = tl.load(V + slot[:, None] + d[None, :], mask=kv_mask, other=0)
        if INT8:
            scale_at = (
                page.to(tl.int64) * stride_sb + (key % PAGE) * stride_ss + kvh * stride_sh + HEAD_DIM // 4
            )
            k_scale = tl.load(KScale + scale_at, mask=key_ok, other=0.0)
            v_scale = tl.load(VScale + scale_at, mask=key_ok, other=0.0)
        k = k.to(dot_dtype)
        v = v.to(dot_dtype)
        if IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        if INT8:
            s = s * k_scale[None, :]
        s = s * qk_scale
        seen = key_ok[None, :] & (key[None, :] <= q_pos[:, None])
        s = tl.where(seen, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m - m_safe)
        l_sum = l_sum * alpha + tl.sum(p, axis=1)
        if INT8:
            p = p * v_scale[None, :]
        if IEEE:
            pv = tl.dot(p.to(dot_dtype), v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(dot_dtype), v)
        acc = acc * alpha[:, None] + pv
        m = m_new

    flat = q_start + qi
    l_safe = tl.where(l_sum == 0.0, 1.0, l_sum)
    o = acc / l_safe[:, None]
    if SPLITS == 1:
        tl.store(
            Out + flat[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
            o.to(Out.dtype.element_ty),
            mask=row_ok[:, None] & d_ok[None, :],
        )
    else:
        at = flat * stride_pt + head * stride_ph + split * stride_ps
        tl.store(PartOut + at[:, None] * BLOCK_D + d[None, :], o, mask=row_ok[:, None])
        m_fin = tl.where(m == float("-inf"), 0.0, m)
        lse = tl.where(l_sum == 0.0, float("-inf"), m_fin + tl.log2(l_safe))
        tl.store(PartLse + at, lse, mask=row_ok)


@triton.jit
def _merge_splits(
    PartOut,
    PartLse,
    Out,
    stride_pt,
    stride_ph,
    stride_ps,
    stride_ot,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    SPLITS: tl.constexpr,
):
    """Each (token, head)'s splits merged by their log-sum-exp (base 2)."""
    t = tl.program_id(0)
    h = tl.program_id(1)
    sp = tl.arange(0, SPLITS)
    d = tl.arange(0, BLOCK_D)
    at = t * stride_pt + h * stride_ph + sp * stride_ps
    lse = tl.load(PartLse + at)
    o = tl.load(PartOut + at[:, None] * BLOCK_D + d[None, :])
    top = tl.max(lse, axis=0)
    top = tl.where(top == float("-inf"), 0.0, top)
    w = tl.exp2(lse - top)
    total = tl.sum(w, axis=0)
    out = tl.sum(o * w[:, None], axis=0) / tl.where(total == 0.0, 1.0, total)
    tl.store(Out + t * stride_ot + h * stride_oh + d, out.to(Out.dtype.element_ty), mask=d < HEAD_DIM)


@dataclass(frozen=True)
class TileLayout:
    """A step's query tiles on the device: which sequence each tile belongs to and its first query there."""

    tile_seq: torch.Tensor  # [tiles] int32
    tile_q0: torch.Tensor  # [tiles] int32
    q_lens: torch.Tensor  # [S] int32
    q_starts: torch.Tensor  # [S] int32 flat token of each sequence's first query
    kv_lens: torch.Tensor  # [S] int32 keys in the cache (its new tokens included)
    rows: int  # BLOCK_M
    longest_query: int


def tile_layout(
    query_lens: list[int], context_lens: list[int], group: int, device: torch.device
) -> TileLayout:
    """Tiles of `rows // group` queries over each sequence's new tokens (host lists in, device tensors
    out)."""
    longest = max(query_lens)
    rows = _pow2(group, DECODE_ROWS) if longest == 1 else _pow2(max(group, CHUNK_ROWS))
    per_tile = rows // group
    seq, q0 = [], []
    for i, n in enumerate(query_lens):
        for start in range(0, n, per_tile):
            seq.append(i)
            q0.append(start)
    starts = [0]
    for n in query_lens[:-1]:
        starts.append(starts[-1] + n)

    def put(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32).to(device, non_blocking=True)

    return TileLayout(put(seq), put(q0), put(query_lens), put(starts), put(context_lens), rows, longest)


def _launch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    table: torch.Tensor,
    kv_lens: torch.Tensor,
    scale: float,
    tiles: int,
    rows: int,
    one_query: bool,
    layout: TileLayout | None,
    k_new: torch.Tensor | None,
    v_new: torch.Tensor | None,
    splits: int | None,
) -> torch.Tensor:
    q = q if q.stride(-1) == 1 else q.contiguous()  # the kernel steps along head_dim by one element
    k_new, v_new = (x if x is None or x.stride(-1) == 1 else x.contiguous() for x in (k_new, v_new))
    t, nh, d = q.shape
    _, page, kvh, _ = k_cache.shape
    group = nh // kvh
    int8 = k_cache.dtype == torch.uint8
    block_d = _pow2(d, 16)
    if splits is None:
        splits = num_splits(tiles * kvh, table.shape[1] * page)
    if splits & (splits - 1):
        raise ValueError(f"the split count must be a power of two, got {splits}")
    split_keys = -(-table.shape[1] * page // splits)
    split_keys = -(-split_keys // BLOCK_N) * BLOCK_N
    dot_f32 = interpreted() and q.dtype != torch.float32  # the interpreter's tl.dot misreads 16-bit floats
    out = torch.empty_like(q)
    if splits > 1:
        part_out = torch.empty(t, nh, splits, block_d, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(t, nh, splits, dtype=torch.float32, device=q.device)
    else:
        part_out = part_lse = out  # unused
    if int8:
        k, v = k_cache.view(torch.int8), v_cache.view(torch.int8)
        k_scale, v_scale = (
            k_cache.view(torch.float32),
            v_cache.view(torch.float32),
        )  # rows are head_dim + 4 bytes
    else:
        k, v, k_scale, v_scale = k_cache, v_cache, k_cache, v_cache
    lay = layout
    ints = (lay.q_lens, lay.q_starts, lay.tile_seq, lay.tile_q0) if lay is not None else (kv_lens,) * 4
    has_new = k_new is not None
    kn = k_new if k_new is not None else q
    vn = v_new if v_new is not None else q
    _paged_attention[(tiles, kvh, splits)](
        q,
        k,
        v,
        k_scale,
        v_scale,
        table,
        kv_lens,
        *ints,
        kn,
        vn,
        out,
        part_out,
        part_lse,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        k.stride(2),
        k_scale.stride(0),
        k_scale.stride(1),
        k_scale.stride(2),
        table.stride(0),
        kn.stride(0),
        kn.stride(1),
        vn.stride(0),
        vn.stride(1),
        out.stride(0),
        out.stride(1),
        part_lse.stride(0),
        part_lse.stride(1),
        part_lse.stride(2) if splits > 1 else 0,
        scale * LOG2E,
        GROUP=group,
        HEAD_DIM=d,
        BLOCK_D=block_d,
        BLOCK_M=rows,
        BLOCK_N=BLOCK_N,
        PAGE=page,
        SPLIT_KEYS=split_keys,
        SPLITS=splits,
        ONE_QUERY=one_query,
        HAS_NEW=int(has_new),
        INT8=int8,
        IEEE=q.dtype == torch.float32 or dot_f32,
        DOT_F32=dot_f32,
    )
    if splits > 1:
        _merge_splits[(t, nh)](
            part_out,
            part_lse,
            out,
            part_lse.stride(0),
            part_lse.stride(1),
            part_lse.stride(2),
            out.stride(0),
            out.stride(1),
            HEAD_DIM=d,
            BLOCK_D=block_d,
            SPLITS=splits,
        )
    return out


def paged_decode_attention(
    q: torch.Tensor,  # [B, NH, D]: one query per row
    k_cache: torch.Tensor,  # [num_blocks, page, KVH, D] (uint8 [..., D + 4] for the 8-bit cache)
    v_cache: torch.Tensor,
    table: torch.Tensor,  # [B, W] pages of each row's context (past it: any page, masked)
    kv_lens: torch.Tensor,  # [B] int keys each row reads from the cache
    scale: float,
    k_new: torch.Tensor
    | None = None,  # [B, KVH, D]: one more key per row, after its cached ones (not stored)
    v_new: torch.Tensor | None = None,
    splits: int | None = None,  # None: from the shapes (num_splits)
) -> torch.Tensor:  # [B, NH, D]
    """Each row's one query over its cached keys (and its new key, if given): decode, graph-capturable."""
    group = q.shape[1] // k_cache.shape[2]
    return _launch(
        q,
        k_cache,
        v_cache,
        table,
        kv_lens,
        scale,
        q.shape[0],
        _pow2(group, DECODE_ROWS),
        True,
        None,
        k_new,
        v_new,
        splits,
    )


def paged_attention(
    q: torch.Tensor,  # [T, NH, D]: sequences' new tokens back to back
    k_cache: torch.Tensor,  # this step's keys already written
    v_cache: torch.Tensor,
    table: torch.Tensor,  # [S, W]
    layout: TileLayout,
    scale: float,
    splits: int | None = None,
) -> torch.Tensor:  # [T, NH, D]
    """Causal attention of each sequence's new queries over its whole context in the cache (any query
    lengths)."""
    tiles = layout.tile_seq.shape[0]
    one = layout.longest_query == 1 and tiles == q.shape[0]
    return _launch(
        q, k_cache, v_cache, table, layout.kv_lens, scale, tiles, layout.rows, one, layout, None, None, splits
    )


@torch.library.custom_op("tandem::paged_decode_attention", mutates_args=())
def paged_decode_op(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    table: torch.Tensor,
    kv_lens: torch.Tensor,
    scale: float,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
) -> torch.Tensor:
    """`paged_decode_attention` with a new key per row, as one operator: torch.compile keeps it whole (it
    neither traces into the launch nor into the interpreter) and a CUDA graph captures its kernels."""
    return paged_decode_attention(q, k_cache, v_cache, table, kv_lens, scale, k_new, v_new)


@paged_decode_op.register_fake
def _(q, k_cache, v_cache, table, kv_lens, scale, k_new, v_new):  # noqa: ANN001, ANN202 (the op's shape rule)
    return torch.empty_like(q)

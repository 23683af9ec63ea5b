"""Read a Dynamo profiler result (its `selected_*_interpolation/raw_data.npz` pair) as a tandem capacity
profile.

Dynamo's profiler measures one prefill worker's TTFT per prompt length, and one decode worker's inter-token
latency over a grid of KV usage and context length. tandem's profile wants prefill time per prompt length
and decode step time per (batch, context): the prefill points carry over as they are, and a decode point's
batch is the number of sequences of that context that fill that share of the worker's KV capacity
(`kv_usage x max_kv_tokens / context`), which is how Dynamo's profiler built the grid.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tandem.profile import DecodePoint, PrefillPoint, Profile, ProfileScale

PREFILL_FILE = Path("selected_prefill_interpolation") / "raw_data.npz"
DECODE_FILE = Path("selected_decode_interpolation") / "raw_data.npz"


def from_dynamo(
    directory: str | Path,
    *,
    model: str,
    device: str,
    dtype: str = "fp8",
    cold_start_ms: float = 60_000.0,
    max_running_sequences: int = 256,
    prefill_chunk_tokens: int = 8192,
    note: str = "",
) -> Profile:
    """The profile of Dynamo's profiler output in `directory` (raises FileNotFoundError / ValueError)."""
    root = Path(directory)
    for part in (PREFILL_FILE, DECODE_FILE):
        if not (root / part).is_file():
            raise FileNotFoundError(
                f"{root / part}: not a Dynamo profiler result (expected {PREFILL_FILE} and {DECODE_FILE})"
            )
    with np.load(root / PREFILL_FILE) as p:
        isl, ttft = p["prefill_isl"], p["prefill_ttft"]
    with np.load(root / DECODE_FILE) as d:
        usage, context, itl = d["x_kv_usage"], d["y_context_length"], d["z_itl"]
        max_kv_tokens = int(d["max_kv_tokens"][0])
    if len(isl) != len(ttft) or not (len(usage) == len(context) == len(itl)):
        raise ValueError(f"{root}: profiler arrays of unequal length")
    prefill = [
        # Dynamo measures whole prompts up to its chunk limit; tandem's curve is per chunk setting.
        PrefillPoint(prompt_tokens=int(n), chunk_tokens=prefill_chunk_tokens, ms=float(ms))
        for n, ms in zip(isl, ttft, strict=True)
    ]
    decode = [
        DecodePoint(
            batch=max(1, round(float(u) * max_kv_tokens / float(c))), context_tokens=int(c), step_ms=float(ms)
        )
        for u, c, ms in zip(usage, context, itl, strict=True)
        if ms > 0
    ]
    return Profile(
        model=model,
        device=device,
        dtype=dtype,
        prefill_chunk_tokens=prefill_chunk_tokens,
        max_running_sequences=max_running_sequences,
        kv_capacity_tokens=max_kv_tokens,
        cold_start_ms=cold_start_ms,
        prefill=prefill,
        decode=decode,
        scale=ProfileScale(note=note or "as measured by Dynamo's profiler"),
    )

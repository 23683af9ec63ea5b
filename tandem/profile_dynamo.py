"""Read a Dynamo profiler result (its `selected_*_interpolation/raw_data.npz` pair) as a tandem capacity
profile, and write a tandem profile in that layout (so Dynamo's planner and mocker replay time tandem's
engine).

Dynamo's profiler measures one prefill worker's TTFT per prompt length, and one decode worker's inter-token
latency over a grid of KV usage and context length. tandem's profile wants prefill time per prompt length
and decode step time per (batch, context): the prefill points carry over as they are, and a decode point's
batch is the number of sequences of that context that fill that share of the worker's KV capacity
(`kv_usage x max_kv_tokens / context`), which is how Dynamo's profiler built the grid.

Writing is the inverse, in the units and array names Dynamo's profiler writes (`profile_prefill.py`,
`profile_decode.py`): prefill `prefill_isl` (tokens), `prefill_ttft` (ms), `prefill_thpt_per_gpu` (prompt
tokens/s); decode `x_kv_usage` (the share of `max_kv_tokens` the batch's contexts fill), `y_context_length`
(tokens), `z_itl` (ms), `z_thpt_per_gpu` (output tokens/s) and `max_kv_tokens` (one replica's KV capacity).
Only the prefill points at the profile's own chunk size go out: Dynamo's prefill curve has no chunk axis.
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


SOURCE_FILE = "tandem_profile.json"  # the profile the arrays came from, beside them: its provenance travels


def to_dynamo(profile: Profile, directory: str | Path) -> list[Path]:
    """Write `profile` as a Dynamo profiler result in `directory` (created); the files written."""
    root = Path(directory)
    prefill = sorted(
        (p for p in profile.prefill if p.chunk_tokens == profile.prefill_chunk_tokens),
        key=lambda p: p.prompt_tokens,
    )
    isl = np.array([p.prompt_tokens for p in prefill], dtype=np.int64)
    ttft = np.array([p.ms for p in prefill], dtype=np.float64)
    batch = np.array([p.batch for p in profile.decode], dtype=np.float64)
    context = np.array([p.context_tokens for p in profile.decode], dtype=np.float64)
    itl = np.array([p.step_ms for p in profile.decode], dtype=np.float64)
    written = [root / PREFILL_FILE, root / DECODE_FILE, root / SOURCE_FILE]
    for path in written[:2]:
        path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(written[0], prefill_isl=isl, prefill_ttft=ttft, prefill_thpt_per_gpu=isl / ttft * 1000)
    np.savez(
        written[1],
        x_kv_usage=batch * context / profile.kv_capacity_tokens,
        y_context_length=context,
        z_itl=itl,
        z_thpt_per_gpu=batch / itl * 1000,
        max_kv_tokens=np.array([profile.kv_capacity_tokens], dtype=np.int64),
    )
    written[2].write_text(profile.model_dump_json(indent=2) + "\n")
    return written

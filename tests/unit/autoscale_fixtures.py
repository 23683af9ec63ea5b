"""A hand-made profile with round numbers, so the tests can work out the expected answers by hand."""

from tandem.profile import DecodePoint, PrefillPoint, Profile


def linear_profile(
    prefill_ms_per_token: float = 0.1, decode_base_ms: float = 10.0, decode_ms_per_seq: float = 0.5
):
    """Prefill: 0.1 ms per prompt token. Decode step: 10 ms + 0.5 ms per running sequence (context-free)."""
    return Profile(
        model="hand",
        device="none",
        dtype="float32",
        prefill_chunk_tokens=512,
        max_running_sequences=64,
        kv_capacity_tokens=1_000_000,
        cold_start_ms=30_000,
        prefill=[
            PrefillPoint(prompt_tokens=n, chunk_tokens=512, ms=n * prefill_ms_per_token)
            for n in (100, 1000, 4000)
        ],
        decode=[
            DecodePoint(batch=b, context_tokens=c, step_ms=decode_base_ms + decode_ms_per_seq * b)
            for b in (1, 8, 32)
            for c in (256, 1024)
        ],
    )

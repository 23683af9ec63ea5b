"""A hand-made profile with round numbers, so the tests can work out the expected answers by hand."""

from tandem.profile import DecodePoint, PrefillPoint, Profile


def linear_profile(
    prefill_ms_per_token: float = 0.1,
    decode_base_ms: float = 10.0,
    decode_ms_per_seq: float = 0.5,
    prefill_fixed_ms: float = 0.0,
    chunk_tokens: int = 512,
):
    """Prefill: `prefill_fixed_ms` + 0.1 ms per prompt token, at a chunk of 512 tokens. Decode step: 10 ms +
    0.5 ms per running sequence (context-free)."""
    return Profile(
        model="hand",
        device="none",
        dtype="float32",
        prefill_chunk_tokens=chunk_tokens,
        max_running_sequences=64,
        kv_capacity_tokens=1_000_000,
        cold_start_ms=30_000,
        prefill=[
            PrefillPoint(
                prompt_tokens=n, chunk_tokens=chunk_tokens, ms=prefill_fixed_ms + n * prefill_ms_per_token
            )
            for n in (100, 1000, 4000)
        ],
        decode=[
            DecodePoint(batch=b, context_tokens=c, step_ms=decode_base_ms + decode_ms_per_seq * b)
            for b in (1, 8, 32)
            for c in (256, 1024)
        ],
    )


def one_prompt_per_step(profile: Profile) -> Profile:
    """The same profile with a chunk of one token, so every prefill step serves one prompt alone: the capacity
    model of a replica that does not batch prompts."""
    data = profile.model_dump()
    data["prefill_chunk_tokens"] = 1
    data["prefill"] = [
        {**p, "chunk_tokens": 1} for p in data["prefill"] if p["chunk_tokens"] == profile.prefill_chunk_tokens
    ]
    return Profile.model_validate(data)

"""The torch engine: model, weights, paged KV cache, scheduler, sampler, engine step and loop (no I/O)."""

"""The model's building blocks: attention backends over the paged KV cache, the cache itself, int8 weights and KV."""

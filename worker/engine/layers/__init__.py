"""The model's building blocks: attention backends over the paged KV cache, the cache, int8 weights and KV."""

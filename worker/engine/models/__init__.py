"""Model architectures: one module per family, pure torch over the paged KV cache."""

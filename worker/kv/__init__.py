"""What the engine's KV cache and the KV transports share: how a block is laid out and written."""

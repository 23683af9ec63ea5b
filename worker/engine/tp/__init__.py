"""Tensor parallelism inside one worker: N ranks, each holding 1/N of every layer's heads and MLP width, of
the vocabulary and of the KV cache; rank 0 serves and schedules, the others follow its commands."""

"""Scheduling and block accounting: which sequences run each step, where their KV lives; and the sampler."""

"""Scheduling and block accounting: which sequences run each step and where their KV lives, and the sampler."""

"""Harnesses the tests and benchmarks share: a real control plane on loopback, streamed load with faults."""

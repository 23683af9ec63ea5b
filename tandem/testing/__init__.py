"""Harnesses the tests and the benchmarks share: a real control plane on loopback, streamed load with faults."""

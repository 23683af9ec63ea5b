"""KV transfer between a prefill and a decode worker: one interface, gRPC / shared-memory / CUDA IPC paths."""

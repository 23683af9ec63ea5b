"""Worker wing: torch model code, paged KV cache, scheduler, engine, gRPC servers, router."""

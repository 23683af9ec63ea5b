"""The data plane: the torch engine, the gRPC worker servers, the KV transports and the router."""

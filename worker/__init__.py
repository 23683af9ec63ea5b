"""The data plane: the torch engine, the gRPC worker servers, KV transports, the router and the load generator."""

"""The gRPC worker servers (prefill, decode, colocated), wire conversions, metrics and `tandem worker`."""
